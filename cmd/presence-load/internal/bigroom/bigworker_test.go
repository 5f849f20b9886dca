package bigroom

import (
	"slices"
	"testing"

	"github.com/presence-dev/presence/protocol"
)

func TestMergeStats(t *testing.T) {
	s := statsResp{Types: map[string]int64{}, Errors: map[string]int{}, Closed: map[string]int{}, MinSeq: ^uint64(0)}
	mergeStats(&s, statsResp{Frames: []int64{1, 2}, Types: map[string]int64{"events": 3}, Resyncs: 1, MinSeq: 5, MaxSeq: 9,
		Anom: anomalies{Gaps: 1, Missing: 2, Examples: []string{"x"}}})
	mergeStats(&s, statsResp{Frames: []int64{-1}, Types: map[string]int64{"events": 4}, MinSeq: 0, MaxSeq: 0}) // no folding connection
	mergeStats(&s, statsResp{Frames: []int64{7}, MinSeq: 3, MaxSeq: 4, Errors: map[string]int{string(protocol.CodeRateLimited): 2}})
	if !slices.Equal(s.Frames, []int64{1, 2, -1, 7}) || s.Types["events"] != 7 || s.Resyncs != 1 || s.MinSeq != 3 || s.MaxSeq != 9 ||
		s.Anom.Missing != 2 || s.Errors[string(protocol.CodeRateLimited)] != 2 || !s.Anom.protocolBroken() {
		t.Fatalf("%+v", s)
	}
}

func TestInSkip(t *testing.T) {
	skips := [][2]uint64{{10, 20}, {40, 41}}
	for seq, want := range map[uint64]bool{10: false, 11: true, 20: true, 21: false, 41: true, 0: false} {
		if inSkip(skips, seq) != want {
			t.Errorf("inSkip(%d) = %v", seq, !want)
		}
	}
}

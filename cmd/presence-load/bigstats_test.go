package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/presence-dev/presence/protocol"
)

func TestFramesPerTick(t *testing.T) {
	// 10 s at 100 ms ticks is 100 ticks.
	p := framesPerTick([]int64{100, 50, -1, 0, 120}, 10*time.Second, 100*time.Millisecond)
	if p.conns != 4 || p.total != 270 || p.maxFrames != 120 || p.over != 1 {
		t.Fatalf("%+v", p)
	}
	if math.Abs(p.mean-0.675) > 1e-9 || math.Abs(p.max-1.2) > 1e-9 {
		t.Fatalf("mean %v max %v", p.mean, p.max)
	}
	if !strings.Contains(p.String(), "mean 0.675, max 1.200") {
		t.Fatal(p.String())
	}
	if p := framesPerTick([]int64{5}, time.Second, 0); p.conns != 0 {
		t.Fatalf("no tick: %+v", p)
	}
	if p := framesPerTick([]int64{-1}, time.Second, time.Millisecond); p.conns != 0 || p.mean != 0 {
		t.Fatalf("no connection: %+v", p)
	}
	if got := ticks(1500*time.Millisecond, 100*time.Millisecond); got != 15 {
		t.Fatalf("ticks = %v", got)
	}
}

func TestRatio(t *testing.T) {
	if ratio(3, 2) != 1.5 || ratio(1, 0) != 0 {
		t.Fatal("ratio")
	}
}

func TestLatencies(t *testing.T) {
	send := []int64{1000, 0, 3000, 4000}
	arrive := []int64{1500, 9000, 0, 4100, 7777} // 9000: not sent; 0: not seen; 7777: no send
	got := latencies(send, arrive)
	want := []time.Duration{100 * time.Microsecond, 500 * time.Microsecond}
	if !slices.Equal(got, want) {
		t.Fatalf("latencies %v, want %v", got, want)
	}
}

func TestLatencyLineCountsNeverSeen(t *testing.T) {
	var l []time.Duration
	for i := 1; i <= 99; i++ {
		l = append(l, time.Duration(i)*time.Millisecond)
	}
	// One never seen of 100: p99 is still measured, max is never.
	s := latencyLine(l, 1)
	if !strings.Contains(s, "p99 99.0ms") || !strings.Contains(s, "max never") || !strings.Contains(s, "1 never seen") {
		t.Fatal(s)
	}
	// Two never seen: p99 is never.
	if s := latencyLine(l[:98], 2); !strings.Contains(s, "p99 never") {
		t.Fatal(s)
	}
	if s := latencyLine(nil, 0); s != "no samples" {
		t.Fatal(s)
	}
	if len(l) != 99 {
		t.Fatal("latencyLine changed its argument")
	}
}

func TestSamplesSpread(t *testing.T) {
	if got := samples(100, 4); !slices.Equal(got, []int{12, 37, 62, 87}) {
		t.Fatalf("samples = %v", got)
	}
	if got := samples(3, 10); len(got) != 3 || got[2] != 2 {
		t.Fatalf("more samples than members: %v", got)
	}
}

func TestParseVmRSS(t *testing.T) {
	v, err := parseVMRSS("Name:\tpresenced\nVmPeak:\t 900 kB\nVmRSS:\t  204800 kB\nThreads: 9\n")
	if err != nil || v != 200<<20 {
		t.Fatalf("%v %v", v, err)
	}
	if _, err := parseVMRSS("Name: x\n"); err == nil {
		t.Fatal("no VmRSS parsed")
	}
}

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

func TestCloseReasonDropsAddresses(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{&websocket.CloseError{Code: 4000}, "close 4000"},
		{errors.New("read tcp 127.0.0.4:37749->127.0.0.1:8091: read: connection reset by peer"), "connection reset by peer"},
		{errors.New("write tcp 127.0.0.1:38819->127.0.0.1:8091: i/o timeout"), "i/o timeout"},
		{fmt.Errorf("x: %w", io.ErrUnexpectedEOF), "EOF"},
	} {
		if got := closeReason(c.err); got != c.want {
			t.Errorf("closeReason(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}

package region

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
)

// The read slack's band, both sides, with no reaper running (the worst
// case: a reaper sweeps every reap interval and usually settles a grace
// within one). A return just after the grace's end, inside the read slack
// (2 reap intervals + 500ms), may be absorbed: here, with no sweep since,
// nothing is announced. A return later than the slack after the grace's
// end is always announced, offline then online, whatever the reaper did:
// the join settles the departure first.
func TestTheReadSlackBand(t *testing.T) {
	slow(t)
	rdb, _ := testredis.Client(t)
	c := &collector{}
	s := newStore(t, rdb, c) // no reaper
	slack := s.readSlack()
	for _, tc := range []struct {
		name  string
		after time.Duration // from the grace's end to the return
		want  []string
	}{
		{"inside", 100 * time.Millisecond, nil},
		{"just-inside", slack - 250*time.Millisecond, nil},
		{"beyond", slack + 100*time.Millisecond, []string{"offline left", "online joined"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tab := ref("r-"+tc.name, "ann", "tab")
			touch(t, s, tab)
			release(t, s, tab)
			end := redisNow(t, rdb).Add(testTiming.OfflineGrace)
			waitRedisPast(t, rdb, end.Add(tc.after))
			before := len(c.Of("", tab.Room, "ann"))
			touch(t, s, tab)
			if late := redisNow(t, rdb).Sub(end); tc.want == nil && late >= slack {
				t.Fatalf("the return came %v after the grace's end, past the slack %v: the machine is too slow for this test", late, slack)
			}
			var got []string
			for _, tr := range c.Of("", tab.Room, "ann")[before:] {
				got = append(got, fmt.Sprintf("%s %s", tr.Kind, tr.Reason))
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("a return %v after the grace's end (read slack %v): %q, want %q", tc.after, slack, got, tc.want)
			}
		})
	}
}

// readSlack is the band the documents state: two reap intervals and half
// a second.
func TestReadSlackIsTwoReapIntervalsAndHalfASecond(t *testing.T) {
	rdb, _ := testredis.Client(t)
	tm := presence.DefaultTiming()
	s := newStore(t, rdb, &collector{}, withTiming(tm))
	if got, want := s.readSlack(), 2*tm.ReapInterval+500*time.Millisecond; got != want || got != 2500*time.Millisecond {
		t.Fatalf("read slack %v, want %v (2.5s at the defaults)", got, want)
	}
}

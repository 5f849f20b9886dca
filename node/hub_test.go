package node

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/presence"
)

// Two joiners of a room that has no position yet: a's snapshot is read
// first (at seq 7), b's later (at 8), and event 8 arrives before either.
// If b's snapshot is handed out first, the room starts at 8; a must still
// get event 8, which its snapshot does not reflect, then 9 once, in order.
func TestAnEarlierSnapshotReadiedLaterStillGetsTheEventsAfterIt(t *testing.T) {
	zero := func() int { return 0 }
	m, err := newMetrics(prometheus.NewRegistry(), gauges{zero, zero, zero, zero, zero})
	if err != nil {
		t.Fatal(err)
	}
	h := &hub{log: quiet, metrics: m, rooms: map[string]*room{}, gappy: map[*room]struct{}{}}
	r := &room{name: "r", members: map[*conn]*member{},
		seq: bus.NewSequencer[event](bus.SeqLimits{GapTimeout: time.Second, MaxAhead: maxHeld})}
	h.rooms["r"] = r
	d := &connDeps{lim: Limits{SendQueue: 100}, log: quiet}
	a := &conn{d: d, user: "a", writing: true} // frames stay queued, for the test to read
	b := &conn{d: d, user: "b", writing: true}
	r.members[a], r.members[b] = &member{detail: detailSessions}, &member{detail: detailSessions}
	ev := func(seq uint64) event { return event{epoch: 1, seq: seq, frame: fmt.Appendf(nil, "e%d", seq)} }
	snap := func(seq uint64) presence.Snapshot { return presence.Snapshot{Room: "r", Epoch: 1, RoomSeq: seq} }

	h.mu.Lock()
	h.eventLocked(r, ev(8))
	if !h.readyLocked(r, snap(8), "", reasonJoin, map[*conn]*member{b: r.members[b]}) ||
		!h.readyLocked(r, snap(7), "", reasonJoin, map[*conn]*member{a: r.members[a]}) {
		t.Fatal("a snapshot of the room's numbering was refused")
	}
	h.eventLocked(r, ev(9))
	h.mu.Unlock()

	events := func(c *conn) []string {
		c.mu.Lock()
		defer c.mu.Unlock()
		var out []string
		for _, f := range c.queue[1:] { // after the snapshot
			out = append(out, string(f))
		}
		return out
	}
	if got := events(a); !slices.Equal(got, []string{"e8", "e9"}) {
		t.Fatalf("a got %q after its snapshot at 7, want e8 then e9", got)
	}
	if got := events(b); !slices.Equal(got, []string{"e9"}) {
		t.Fatalf("b got %q after its snapshot at 8, want e9", got)
	}
}

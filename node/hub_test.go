package node

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
)

// Two joiners of a room that has no position yet: a's snapshot is read
// first (at seq 7), b's later (at 8). b's is handed out first and starts
// the room at 8; event 8 then arrives (a snapshot can outrun the bus) and
// is passed over. a's snapshot cannot serve: a would never get event 8.
// It is refused (a new read follows), and a new one serves.
func TestASnapshotOlderThanTheRoomsStartIsRefused(t *testing.T) {
	zero := func() int { return 0 }
	m, err := newMetrics(prometheus.NewRegistry(), gauges{zero, zero, zero, zero, zero, func() float64 { return 0 }})
	if err != nil {
		t.Fatal(err)
	}
	h := &hub{log: quiet, metrics: m, rooms: map[string]*room{}, gappy: map[*room]struct{}{}, out: newFanout(0, 0, 0, m, nil, nil)}
	r := &room{name: "r", members: map[*conn]*member{},
		seq: bus.NewSequencer[event](bus.SeqLimits{GapTimeout: time.Second, MaxAhead: maxHeld})}
	h.rooms["r"] = r
	d := &connDeps{lim: Limits{SendQueue: 100}, log: quiet}
	a := &conn{d: d, user: "a", writing: true} // frames stay queued, for the test to read
	b := &conn{d: d, user: "b", writing: true}
	r.members[a], r.members[b] = &member{in: interest{detail: detailSessions}}, &member{in: interest{detail: detailSessions}}
	ev := func(seq uint64) event { return event{epoch: 1, seq: seq, frame: fmt.Appendf(nil, "e%d", seq)} }
	snap := func(seq uint64) presence.Snapshot { return presence.Snapshot{Room: "r", Epoch: 1, RoomSeq: seq} }

	h.mu.Lock()
	if !h.readyLocked(r, snap(8), "", protocol.ReasonJoin, map[*conn]*member{b: r.members[b]}) {
		t.Fatal("the room's first snapshot was refused")
	}
	h.eventLocked(r, ev(8))
	if h.readyLocked(r, snap(7), "", protocol.ReasonJoin, map[*conn]*member{a: r.members[a]}) {
		t.Fatal("a snapshot older than the room's start served: a misses event 8")
	}
	if !h.readyLocked(r, snap(8), "", protocol.ReasonJoin, map[*conn]*member{a: r.members[a]}) {
		t.Fatal("a snapshot as new as the room's start was refused")
	}
	h.eventLocked(r, ev(9))
	h.mu.Unlock()

	for _, c := range []*conn{a, b} {
		c.mu.Lock()
		var got []string
		for _, f := range c.queue {
			got = append(got, string(f.b))
		}
		c.mu.Unlock()
		if len(got) != 2 || !strings.Contains(got[0], `"room_seq":8`) || got[1] != "e9" {
			t.Fatalf("%s got %q, want its snapshot at 8 then e9", c.user, got)
		}
	}
}

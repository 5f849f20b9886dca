package node

import (
	"context"
	"testing"
	"time"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testnats"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
)

// globalView answers room snapshots as the aggregators' service would.
type globalView struct{ snap presence.Snapshot }

func (g globalView) Snapshot(_ context.Context, room string, _, _ int) (presence.Snapshot, error) {
	s := g.snap
	s.Room = room
	return s, nil
}

// With Global set, clients see the cross-region view: the snapshot from
// the aggregators and the events on presence.global.<room>.>, while their
// own sessions still go to the regional store.
func TestGlobalViewForClients(t *testing.T) {
	e := newEnv(t)
	epoch := time.Now().UnixMilli()
	view := globalView{presence.Snapshot{
		Region: bus.GlobalRegion, RoomSeq: 5, Epoch: epoch, Total: 1,
		Members: []presence.Member{{User: "far", Sessions: []presence.SessionInfo{{ID: "s1"}}}},
	}}
	n := e.newNode(func(c *Config) { c.Global = view })
	c := n.dial(t, token(t, "near", []string{"*"}, time.Hour), "tab")
	// The global view keeps states, not session lists: detail is refused.
	c.send(map[string]string{"type": "join", "room": "room", "detail": "sessions", "ref": "d"})
	c.expectError(protocol.CodeInvalidDetail, "d")
	snap := c.joinDetail("room", "").Snapshot
	if snap.Region != bus.GlobalRegion || len(snap.Members) != 1 || snap.Members[0].User != "far" {
		t.Fatalf("snapshot: %+v, want the global view", snap)
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		return testkit.Want("near's sessions in the regional store", len(e.live("room", "near")), 1)
	})

	nc := testnats.Connect(t, e.ns)
	pub := func(tr presence.Transition) {
		b, err := bus.EncodeEvent(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.Publish(bus.EventSubject(tr), b); err != nil {
			t.Fatal(err)
		}
	}
	// The regional online of "near" is not forwarded in the global view;
	// the global one is.
	pub(presence.Transition{ID: "global/room/x/6", Region: bus.GlobalRegion, Room: "room", User: "near",
		Kind: presence.Online, Reason: presence.Joined, Sessions: 1, Seq: 6, Epoch: epoch, At: time.Now()})
	f := c.expect("event")
	if f.Event.Region != bus.GlobalRegion || f.Event.User != "near" || f.Event.Seq != 6 {
		t.Fatalf("event: %+v, want the global online of near", f.Event)
	}
}

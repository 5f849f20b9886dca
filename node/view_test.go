package node

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/testnats"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
)

// switchable answers room snapshots as the aggregators' query service
// does while down is false, and fails as it does when none answers.
type switchable struct {
	down atomic.Bool
	snap presence.Snapshot
}

func (s *switchable) Snapshot(_ context.Context, room string, _, _ int) (presence.Snapshot, error) {
	if s.down.Load() {
		return presence.Snapshot{}, errors.New("nats: no responders available for request")
	}
	snap := s.snap
	snap.Room = room
	return snap, nil
}

func users(snap presence.Snapshot) []string {
	var out []string
	for _, m := range snap.Members {
		out = append(out, m.User)
	}
	return out
}

// A --global node whose global view does not answer serves its region's
// view: joins work, clients see the region's members and events, and the
// snapshot's region says which view it is. When the global view answers
// again every joined room moves back to it with a resync snapshot, and
// moves away again when it fails.
func TestGlobalNodeFallsBackToTheRegionalView(t *testing.T) {
	slow(t)
	e := newEnv(t)
	epoch := time.Now().UnixMilli()
	g := &switchable{snap: presence.Snapshot{Region: bus.GlobalRegion, RoomSeq: 5, Epoch: epoch, Total: 1,
		Members: []presence.Member{{User: "far", Sessions: []presence.SessionInfo{{ID: "s1"}}}}}}
	g.down.Store(true)
	n := e.newNode(func(c *Config) { c.Global = g })
	tok := func(user string) string { return token(t, user, []string{"*"}, time.Hour) }

	alice := n.dial(t, tok("alice"), "tab")
	if snap := alice.joinDetail("room", "").Snapshot; snap.Region != "eu" || !slices.Equal(users(snap), []string{"alice"}) {
		t.Fatalf("join without the global view: %+v, want the regional view", snap)
	}
	bob := n.dial(t, tok("bob"), "tab")
	if snap := bob.joinDetail("room", "").Snapshot; snap.Region != "eu" || !slices.Equal(users(snap), []string{"alice", "bob"}) {
		t.Fatalf("second join: %+v", snap)
	}
	if f := alice.expect("event"); f.Event.Region != "eu" || f.Event.User != "bob" || f.Event.Kind != presence.Online {
		t.Fatalf("alice got %s, want bob's regional online", f.raw)
	}

	g.down.Store(false)
	for _, c := range []*client{alice, bob} {
		f := c.expect("snapshot")
		if f.Reason != protocol.ReasonResync || f.Snapshot.Region != bus.GlobalRegion || !slices.Equal(users(f.Snapshot), []string{"far"}) {
			t.Fatalf("back to the global view: %s", f.raw)
		}
	}
	// Global events reach the clients again.
	nc := testnats.Connect(t, e.ns)
	tr := presence.Transition{ID: "global/room/x/6", Region: bus.GlobalRegion, Room: "room", User: "alice",
		Kind: presence.Online, Reason: presence.Joined, Sessions: 1, Seq: 6, Epoch: epoch, At: time.Now()}
	b, err := bus.EncodeEvent(tr)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish(bus.EventSubject(tr), b); err != nil {
		t.Fatal(err)
	}
	if f := alice.expect("event"); f.Event.Region != bus.GlobalRegion || f.Event.User != "alice" || f.Event.Seq != 6 {
		t.Fatalf("alice got %s, want the global online", f.raw)
	}

	// The global view fails again, with nobody joining: the probe notices.
	g.down.Store(true)
	f := alice.expect("snapshot")
	if f.Reason != protocol.ReasonResync || f.Snapshot.Region != "eu" || !slices.Equal(users(f.Snapshot), []string{"alice", "bob"}) {
		t.Fatalf("back to the regional view: %s", f.raw)
	}
}

package node

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/presence-dev/presence/presence"
)

// outrunStore returns snapshots that the room's events have already run
// past: after reading one, it has two more users join and waits until the
// node has passed their events on, then returns the snapshot.
type outrunStore struct {
	Store
	hub func() *hub
	on  atomic.Bool
	n   atomic.Int64
}

func (s *outrunStore) Snapshot(ctx context.Context, room string, offset, limit int) (presence.Snapshot, error) {
	snap, err := s.Store.Snapshot(ctx, room, offset, limit)
	if err != nil || !s.on.Load() {
		return snap, err
	}
	var last uint64
	for range 2 {
		ref := presence.SessionRef{Room: room, User: fmt.Sprintf("late%d", s.n.Add(1)), Session: "s"}
		res, err := s.Store.Claim(ctx, []presence.SessionRef{ref})
		if err != nil || len(res.Transitions) == 0 {
			return snap, fmt.Errorf("late join: %v %v", res, err)
		}
		last = res.Transitions[0].Seq
	}
	for {
		h := s.hub()
		h.mu.Lock()
		_, base, _ := h.rooms[room].seq.Position()
		h.mu.Unlock()
		if base >= last {
			return snap, nil
		}
		select {
		case <-ctx.Done():
			return snap, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// A join's snapshot that the room's events have outrun is still good: the
// events above it reached the joiner's buffer. It once made the node
// decide the room's numbering went backwards and resync every member.
func TestAnOutrunSnapshotNeedsNoResync(t *testing.T) {
	e := newEnv(t)
	var os *outrunStore
	var nn *node
	nn = e.newNode(func(c *Config) {
		os = &outrunStore{Store: c.Store, hub: func() *hub { return nn.hub }}
		c.Store = os
	})
	first := nn.dial(t, token(t, "first", []string{"*"}, time.Hour), "s")
	first.join("busy")
	os.on.Store(true)
	joiner := nn.dial(t, token(t, "joiner", []string{"*"}, time.Hour), "s")
	snap := joiner.join("busy")
	os.on.Store(false)
	// The joiner gets, after its snapshot, every later online once.
	seen := map[string]int{}
	for _, m := range snap.Snapshot.Members {
		seen[m.User]++
	}
	for range 2 {
		f := joiner.expect("event")
		seen[f.Event.User]++
	}
	for _, u := range []string{"first", "joiner", "late1", "late2"} {
		if seen[u] != 1 {
			t.Fatalf("joiner's view %v, want each of first, joiner, late1, late2 once", seen)
		}
	}
	// The first member saw events only: no resync.
	for range 3 {
		if f := first.next(); f.Type != "event" {
			t.Fatalf("first member got %s, want events only", f.raw)
		}
	}
	first.ping()
	if n := counterValue(t, nn.metrics.resyncs); n != 0 {
		t.Fatalf("%v resyncs", n)
	}
}

// counterValue reads a counter.
func counterValue(tb testing.TB, c prometheus.Counter) float64 {
	tb.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		tb.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

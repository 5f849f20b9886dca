package node

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/presence-dev/presence/presence"
)

// countingStore counts the snapshot reads of a real store; the first
// waits for gate, so that every joiner asks while it is under way.
type countingStore struct {
	Store
	snapshots atomic.Int64
	gate      chan struct{}
}

func (s *countingStore) Snapshot(ctx context.Context, room string, offset, limit int) (presence.Snapshot, error) {
	if s.snapshots.Add(1) == 1 {
		select {
		case <-s.gate:
		case <-ctx.Done():
			return presence.Snapshot{}, ctx.Err()
		}
	}
	return s.Store.Snapshot(ctx, room, offset, limit)
}

// Clients that join one room at once share snapshot reads, and each still
// gets a snapshot that includes its own join, followed by every later
// join exactly once.
func TestJoinStormSharesSnapshotReads(t *testing.T) {
	e := newEnv(t)
	var cs *countingStore
	n := e.newNode(func(c *Config) {
		cs = &countingStore{Store: c.Store, gate: make(chan struct{})}
		c.Store = cs
		c.StoreTimeout = 5 * time.Second
	})
	const joiners = 40
	clients := make([]*client, joiners)
	for i := range clients {
		clients[i] = n.dial(t, token(t, fmt.Sprintf("u%02d", i), []string{"*"}, time.Hour), "s")
	}
	snaps := make([]frame, joiners)
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.send(map[string]string{"type": "join", "room": "storm", "ref": "j"})
		}()
	}
	wg.Wait()
	// The first read is held: every joiner waits on it or on the next.
	waitFor(t, 10*time.Second, "40 joiners waiting for snapshot reads", func() bool {
		n.hub.mu.Lock()
		defer n.hub.mu.Unlock()
		r := n.hub.rooms["storm"]
		if r == nil {
			return false
		}
		waiting := 0
		for _, f := range []*flight{r.reading, r.queued} {
			if f != nil {
				waiting += f.waiters
			}
		}
		return waiting == joiners
	})
	close(cs.gate)
	for i, c := range clients {
		snaps[i] = c.expect("snapshot")
	}
	if reads := cs.snapshots.Load(); reads != 2 {
		t.Fatalf("%d snapshot reads for %d joiners, want 2: the one under way and one for all who asked meanwhile", reads, joiners)
	}
	reads := cs.snapshots.Load()
	// Each snapshot has its own joiner; with the events after it, every
	// client ends up knowing all 40.
	for i, f := range snaps {
		me := fmt.Sprintf("u%02d", i)
		known := map[string]bool{}
		for _, m := range f.Snapshot.Members {
			known[m.User] = true
		}
		if !known[me] {
			t.Fatalf("%s's snapshot lacks its own join: %s", me, f.raw)
		}
		for len(known) < joiners {
			ev := clients[i].expect("event")
			if ev.Event.Kind != presence.Online || ev.Event.Seq <= f.Snapshot.RoomSeq || known[ev.Event.User] {
				t.Fatalf("%s: event %s after snapshot at seq %d", me, ev.raw, f.Snapshot.RoomSeq)
			}
			known[ev.Event.User] = true
		}
		clients[i].ping() // and nothing more
	}
	t.Logf("%d joiners, %d snapshot reads", joiners, reads)
}

// gatedStore holds every Claim until gate is closed.
type gatedStore struct {
	Store
	gate   chan struct{}
	claims atomic.Int64
}

func (s *gatedStore) Claim(ctx context.Context, refs []presence.SessionRef) (presence.TouchResult, error) {
	s.claims.Add(1)
	select {
	case <-s.gate:
	case <-ctx.Done():
		return presence.TouchResult{}, ctx.Err()
	}
	return s.Store.Claim(ctx, refs)
}

// Past its capacity a node refuses a request at once, with retry advice,
// instead of piling it up behind the ones the store is still serving.
func TestOverloadIsRefusedWithRetryAdvice(t *testing.T) {
	e := newEnv(t)
	var gs *gatedStore
	n := e.newNode(func(c *Config) {
		gs = &gatedStore{Store: c.Store, gate: make(chan struct{})}
		c.Store = gs
		c.Limits.MaxInflight = 1
		c.Limits.AdmitWait = 50 * time.Millisecond
		c.StoreTimeout = 5 * time.Second
	})
	busy := n.dial(t, token(t, "busy", []string{"*"}, time.Hour), "s")
	busy.send(map[string]string{"type": "join", "room": "r", "ref": "j"})
	waitFor(t, 5*time.Second, "the first join to reach the store", func() bool { return gs.claims.Load() == 1 })
	late := n.dial(t, token(t, "late", []string{"*"}, time.Hour), "s")
	late.send(map[string]string{"type": "join", "room": "r", "ref": "j2"})
	f := late.expectError(CodeUnavailable, "j2")
	var e2 struct {
		RetryAfterMS int64 `json:"retry_after_ms"`
	}
	if err := json.Unmarshal([]byte(f.raw), &e2); err != nil || e2.RetryAfterMS <= 0 {
		t.Fatalf("refusal %s: want a retry_after_ms", f.raw)
	}
	if gs.claims.Load() != 1 {
		t.Fatal("the refused join reached the store")
	}
	close(gs.gate)
	if f := busy.expect("snapshot"); f.Ref != "j" {
		t.Fatalf("first join: %s", f.raw)
	}
	late.join("r") // capacity is back
}

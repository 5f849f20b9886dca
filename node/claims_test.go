package node

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/presence"
)

// firstGatedStore counts Claim calls against the real store and holds the
// first one until the test opens the gate.
type firstGatedStore struct {
	Store
	calls atomic.Int64
	first atomic.Int64 // claims in the first call
	gate  chan struct{}
}

func (g *firstGatedStore) Claim(ctx context.Context, refs []presence.SessionRef) (presence.TouchResult, error) {
	if g.calls.Add(1) == 1 {
		g.first.Store(int64(len(refs)))
		<-g.gate
	}
	return g.Store.Claim(ctx, refs)
}

// Joins that arrive while a claim is under way go together in the next
// store call: 50 concurrent claims cost at most two calls, and every one
// holds.
func TestConcurrentClaimsShareAStoreCall(t *testing.T) {
	e := newEnv(t)
	g := &firstGatedStore{Store: e.newStore(), gate: make(chan struct{})}
	b := &claimBatcher{store: g, timeout: 5 * time.Second, max: 1000}
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := b.claim(context.Background(), presence.SessionRef{Room: "storm", User: fmt.Sprintf("u%02d", i), Session: "s"})
			errs <- err
		}()
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		b.mu.Lock()
		defer b.mu.Unlock()
		return testkit.Want("claims in the first call or queued behind it", int64(len(b.queue))+g.first.Load(), 50)
	})
	close(g.gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := g.calls.Load(); n > 2 {
		t.Fatalf("%d store calls for 50 concurrent claims, want at most 2", n)
	}
	for i := range 50 {
		if live := e.live("storm", fmt.Sprintf("u%02d", i)); len(live) != 1 {
			t.Fatalf("u%02d holds %v", i, live)
		}
	}
}

// slowClaimStore answers every claim late, as a Redis past its capacity.
type slowClaimStore struct {
	Store
	delay time.Duration
}

func (s slowClaimStore) Claim(ctx context.Context, refs []presence.SessionRef) (presence.TouchResult, error) {
	time.Sleep(s.delay)
	return s.Store.Claim(ctx, refs)
}

// The node's join limiter follows the claims' store calls: joins into a
// store that answers claims late cut its rate.
func TestSlowClaimsCutTheJoinRate(t *testing.T) {
	e := newEnv(t)
	n := e.newNode(func(c *Config) {
		c.Store = slowClaimStore{Store: c.Store, delay: 150 * time.Millisecond}
		c.Limits.JoinRate, c.Limits.JoinRateMin, c.Limits.JoinLatency = 1000, 10, 100*time.Millisecond
	})
	before := n.joins.Rate()
	c := n.dial(t, token(t, "amy", []string{"*"}, time.Hour), "s")
	c.send(map[string]any{"type": "join", "room": "slow", "ref": "j"})
	c.expect("snapshot")
	if after := n.joins.Rate(); after >= before {
		t.Fatalf("join rate %v after a claim of 150ms (limit 100ms), want below %v", after, before)
	}
}

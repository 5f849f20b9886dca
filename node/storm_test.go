package node

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
	"github.com/presence-dev/presence/region"
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
	testkit.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		return testkit.Want("joiners waiting for snapshot reads", n.hub.flights.waiting("storm"), joiners)
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
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		return testkit.Want("joins that reached the store", gs.claims.Load(), 1)
	})
	late := n.dial(t, token(t, "late", []string{"*"}, time.Hour), "s")
	late.send(map[string]string{"type": "join", "room": "r", "ref": "j2"})
	f := late.expectError(protocol.CodeUnavailable, "j2")
	if f.RetryAfterMS <= 0 {
		t.Fatalf("refusal %s: want a retry_after_ms", f.raw)
	}
	if gs.claims.Load() != 1 {
		t.Fatal("the refused join reached the store")
	}
	close(gs.gate)
	if f := busy.expect("snapshot"); f.Ref != "j" {
		t.Fatalf("first join: %s", f.raw)
	}
	// Capacity is back; the refused client comes back after its hint (a
	// join before it is refused again: it had its attempt).
	if f, _ := joinRetrying(t, late, "r", 2*time.Second); f.Type != "snapshot" {
		t.Fatalf("late join: %s", f.raw)
	}
}

// joinRetrying sends a join and, while it is refused with unavailable,
// sends it again after retry_after_ms, as clients do; it returns the
// snapshot and the hints it was given.
func joinRetrying(t *testing.T, c *client, room string, maxHint time.Duration) (frame, []time.Duration) {
	t.Helper()
	var hints []time.Duration
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		c.send(map[string]string{"type": "join", "room": room, "ref": "j"})
		f := c.next()
		if f.Type == "snapshot" {
			return f, hints
		}
		if f.Code != protocol.CodeUnavailable {
			t.Fatalf("join: %s, want a snapshot or unavailable", f.raw)
		}
		d := time.Duration(f.RetryAfterMS) * time.Millisecond
		if d <= 0 || d > maxHint {
			t.Fatalf("retry_after_ms %d, want in (0, %v]", f.RetryAfterMS, maxHint)
		}
		hints = append(hints, d)
		time.Sleep(d) // the client honours the hint
	}
	t.Fatalf("join of %s not admitted in 20s", room)
	return frame{}, nil
}

// A storm takes longer than the TTL and the grace: clients refused at the
// join rate retry as told, and their sessions, held by a node that died
// or released into their grace, are kept meanwhile; their joins are then
// silent. A session whose client never returns ends as it would have.
func TestRefusedJoinsKeepTheirSessions(t *testing.T) {
	slow(t)
	e := newEnv(t)
	dead := e.newStore() // the old node: it refreshes nothing any more
	held, released, gone := presence.SessionRef{Room: "r", User: "jo", Session: "tab"},
		presence.SessionRef{Room: "r", User: "bo", Session: "tab"}, presence.SessionRef{Room: "r", User: "kim", Session: "tab"}
	if _, err := dead.Claim(context.Background(), []presence.SessionRef{held, released, gone}); err != nil {
		t.Fatal(err)
	}
	if err := dead.Release(context.Background(), released); err != nil {
		t.Fatal(err)
	}
	start := e.redisNow()
	// One join every 2.5 s: the first goes at once (the bucket's one
	// token), jo and bo wait past the TTL (2 s) and the grace (1 s).
	n := e.newNode(func(c *Config) {
		c.Limits.JoinRate, c.Limits.JoinRateMin = 0.4, 0.4
	})
	first := n.dial(t, token(t, "first", []string{"*"}, time.Hour), "s")
	first.join("r")
	var wg sync.WaitGroup
	hints := make([][]time.Duration, 2)
	for i, u := range []string{"jo", "bo"} {
		c := n.dial(t, token(t, u, []string{"*"}, time.Hour), "tab")
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, hints[i] = joinRetrying(t, c, "r", n.cfg.Limits.MaxRetryAfter)
		}()
	}
	wg.Wait()
	if now := e.redisNow(); now.Sub(start) < testTiming.SessionTTL+testTiming.OfflineGrace {
		t.Fatalf("admitted after %v: the storm was shorter than the TTL", now.Sub(start))
	}
	for i, h := range hints {
		if len(h) < 2 {
			t.Fatalf("client %d refused %d times, want several", i, len(h))
		}
	}
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		return testkit.Want("offlines of kim, who never came back", len(e.rec.Of(presence.Offline, "r", "kim")), 1)
	})
	e.quiesce("r")
	for _, u := range []string{"jo", "bo"} {
		if got := e.rec.Of("", "r", u); len(got) != 1 || got[0].Kind != presence.Online {
			t.Fatalf("%s's transitions: %v, want only the first online", u, got)
		}
	}
	if got := counterValue(t, n.metrics.join.Refused); got < 4 {
		t.Fatalf("joins_refused_total %v, want the refusals counted", got)
	}
	if got := counterValue(t, n.metrics.extend.Extended); got < 2 {
		t.Fatalf("extended_sessions_total %v, want both waiting sessions extended", got)
	}
}

// A reconnect storm on a real node whose join limiter admits 20 joins a
// second: half the clients resend their join every 120 ms whatever
// retry_after_ms says, half honour it with ±25 % jitter. The greedy ones
// are refused until their appointment and do not get in sooner.
func TestAStormDoesNotFavourClientsThatRetryEarly(t *testing.T) {
	slow(t)
	e := newEnv(t)
	// Hints of up to 4 s need a longer TTL than the tests' (a refused
	// client's session must outlive its hint).
	st, err := region.New(e.rdb, region.Options{Region: "eu", Sink: e.sink, Logger: quiet, Timing: presence.Timing{
		SessionTTL: 12 * time.Second, Heartbeat: 4 * time.Second, OfflineGrace: 5 * time.Second,
		ReapInterval: time.Second, LastSeenInterval: 10 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	e.runReaper(st)
	n := e.newNode(func(c *Config) {
		c.Store = st
		c.Limits.JoinRate, c.Limits.JoinRateMin = 10, 10
		// 150 clients on a loaded machine: pings the test's short pong
		// timeout would drop are not what this test is about.
		c.Limits.PingInterval, c.Limits.PongTimeout = 5*time.Second, 5*time.Second
	})
	const clients = 150
	cs := make([]*client, clients)
	for i := range cs {
		cs[i] = n.dial(t, token(t, fmt.Sprintf("u%d", i), []string{"*"}, time.Hour), "s")
	}
	type result struct {
		took  time.Duration
		tries int
		err   error
	}
	results := make(chan [2]any, clients)
	start := time.Now()
	for i, c := range cs {
		greedy := i%2 == 0
		answers := make(chan frame, 64)
		go func() { // read every frame, so pings are answered meanwhile
			for f := range c.frames {
				if f.Ref == "j" {
					answers <- f
				}
			}
			close(answers)
		}()
		go func() {
			var r result
			join := []byte(`{"type":"join","room":"storm","ref":"j"}`)
			for r.err == nil {
				r.tries++
				if r.err = c.ws.WriteMessage(1, join); r.err != nil {
					break
				}
				var f frame
				var ok bool
				select {
				case f, ok = <-answers:
				case <-time.After(30 * time.Second):
				}
				if !ok {
					r.err = fmt.Errorf("no answer to join %d (connection: %v)", r.tries, c.w.Err())
					break
				}
				if f.Type == "snapshot" {
					r.took = time.Since(start)
					break
				}
				if f.Code != protocol.CodeUnavailable {
					r.err = fmt.Errorf("join: %s %s", f.Code, f.Message)
					break
				}
				wait := time.Duration(float64(f.RetryAfterMS) * float64(time.Millisecond) * (0.75 + 0.5*rand.Float64()))
				if greedy {
					wait = 120 * time.Millisecond
				}
				time.Sleep(wait) // the client's own schedule is what the test is about
			}
			results <- [2]any{greedy, r}
		}()
	}
	var g, h []time.Duration
	greedyTries := 0
	for range clients {
		x := <-results
		r := x[1].(result)
		if r.err != nil {
			t.Fatal(r.err)
		}
		if x[0].(bool) {
			g = append(g, r.took)
			greedyTries += r.tries
		} else {
			h = append(h, r.took)
		}
	}
	slices.Sort(g)
	slices.Sort(h)
	gm, hm := g[len(g)/2], h[len(h)/2]
	t.Logf("greedy: p50 %v max %v (%d tries); honest: p50 %v max %v", gm.Round(time.Millisecond), g[len(g)-1].Round(time.Millisecond),
		greedyTries, hm.Round(time.Millisecond), h[len(h)-1].Round(time.Millisecond))
	if float64(gm) < 0.75*float64(hm) {
		t.Fatalf("clients that retry every 120 ms got in at a median %v, those that honour the hint at %v", gm, hm)
	}
}

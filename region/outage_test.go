package region

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
)

// Redis stalls for longer than the TTL (SIGSTOP: a failover or a hung
// primary), so every session's expiry passes while no node can refresh
// it. Users connected throughout are never announced offline, even one
// whose other tab closed cleanly just before (the departure it started
// waits for the node's refresh after the outage, which cancels it); a
// clean departure and a dead node's session are each announced once,
// after.
func TestRedisStallLongerThanTheTTL(t *testing.T) {
	slow(t)
	rdb, srv := testredis.Client(t)
	c := &collector{}
	// A hold of over a second, so the node's refresh after the outage
	// lands inside it however slow the machine.
	tm := presence.Timing{SessionTTL: 3 * time.Second, Heartbeat: time.Second, OfflineGrace: time.Second,
		ReapInterval: 100 * time.Millisecond, LastSeenInterval: time.Second}
	st := func() *Store { return newStore(t, rdb, c, func(o *Options) { o.Timing = tm }) }
	node, other, dead := st(), st(), st()
	var stayers []presence.SessionRef
	for i := range 5 {
		stayers = append(stayers, ref("r1", fmt.Sprintf("stay%d", i), "tab"))
	}
	stayers = append(stayers, ref("r1", "pair", "laptop"))
	touch(t, node, stayers...)
	phone := ref("r1", "pair", "phone") // the pair's other tab, on another node
	touch(t, other, phone)
	stop := refresher(t, node, stayers...)
	leaver := ref("r1", "leaver", "tab")
	touch(t, node, leaver)
	touch(t, dead, ref("r1", "ghost", "tab")) // its node dies now
	startReaper(t, other)
	startReaper(t, node) // every node runs one
	reap(t, other)       // the region's clock has seen a sweep
	release(t, node, leaver)
	release(t, other, phone)

	stop() // the node's next refresh comes after the reaper's first sweeps
	srv.Pause()
	time.Sleep(tm.SessionTTL + time.Second) // the outage itself
	srv.Resume()
	// The reaper looks at the room before the node refreshes: inside the
	// hold, as nodes get a heartbeat after the outage to come back.
	after := other.Stats().Sweeps.Load() + 2
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		return testkit.AtLeast("sweeps, two after the outage", other.Stats().Sweeps.Load(), after)
	})
	if _, err := node.Refresh(context.Background(), stayers); err != nil {
		t.Fatal(err)
	}
	refresher(t, node, stayers...)

	testkit.CheckFor(t, tm.OutageHold()+tm.SessionTTL+3*time.Second, 10*time.Millisecond, func() error {
		return c.AtLeastOf(presence.Offline, "r1", "ghost", 1)
	})
	// Let anything wrong show: another hold's worth of sweeps.
	sweeps := other.Stats().Sweeps.Load() + int64(tm.OutageHold()/tm.ReapInterval) + 3
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error { return testkit.AtLeast("sweeps", other.Stats().Sweeps.Load(), sweeps) })
	for _, r := range stayers {
		if off := c.Of(presence.Offline, "r1", r.User); len(off) != 0 {
			t.Errorf("%s, connected throughout, was announced offline: %v", r.User, off)
		}
	}
	if off := c.Of(presence.Offline, "r1", "leaver"); len(off) != 1 || off[0].Reason != presence.Left {
		t.Errorf("leaver: %v, want one offline, reason left", off)
	}
	if off := c.Of(presence.Offline, "r1", "ghost"); len(off) != 1 || off[0].Reason != presence.Expired {
		t.Errorf("ghost: %v, want one offline, reason expired", off)
	}
	onlines := 0
	for _, tr := range c.All() {
		if tr.Kind == presence.Online {
			onlines++
		}
	}
	if onlines != 8 {
		t.Errorf("%d onlines, want the 8 joins only: %v", onlines, c.All())
	}
	if other.Stats().OutageHolds.Load() == 0 {
		t.Error("the reaper did not notice the outage")
	}
	if up := c.Of(presence.Update, "r1", "pair"); len(up) != 2 || up[1].Reason != presence.Left || up[1].Session != "phone" {
		t.Errorf("pair: updates %v, want the phone's joined, then its left", up)
	}
	if m := members(t, other, "r1"); len(m) != 6 {
		t.Errorf("members %v, want the 6 stayers", m)
	}
}

// Redis restarts empty (no persistence, or a failover to a replica that
// lost the writes). Nodes restore the sessions they hold with their next
// refresh, silently; a departure whose release came while Redis was gone
// is announced once; the room's numbering starts a new epoch, which tells
// readers to take a new snapshot.
func TestRedisRestartedEmpty(t *testing.T) {
	slow(t)
	rdb, srv := testredis.Client(t)
	c := &collector{}
	node, other := newStore(t, rdb, c), newStore(t, rdb, c)
	var stayers []presence.SessionRef
	for i := range 5 {
		stayers = append(stayers, ref("r1", fmt.Sprintf("stay%d", i), "tab"))
	}
	leaver := ref("r1", "leaver", "tab")
	touch(t, node, append(stayers, leaver)...)
	refresher(t, node, stayers...)
	reap(t, other) // the region's clock has seen a sweep
	startReaper(t, other)
	before := c.All()
	epoch := before[len(before)-1].Epoch

	srv.RestartEmpty(t)
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error { return testkit.Want("data losses the node saw", node.Stats().DataLosses.Load(), 1) })
	// The node's release of the leaver failed while Redis was gone; its
	// retry reaches the new, empty Redis.
	release(t, node, leaver)
	touch(t, node, ref("r1", "newbie", "tab"))
	refresher(t, node, ref("r1", "newbie", "tab"))
	testkit.CheckFor(t, tm(t).OfflineGrace+3*time.Second, 10*time.Millisecond, func() error {
		return c.AtLeastOf(presence.Offline, "r1", "leaver", 1)
	})
	after := c.All()[len(before):]
	var kinds []string
	for _, tr := range after {
		kinds = append(kinds, fmt.Sprintf("%s/%s/%s", tr.Kind, tr.User, tr.Reason))
		if tr.Epoch <= epoch {
			t.Errorf("%v after the restart has epoch %d, not above %d", tr, tr.Epoch, epoch)
		}
	}
	if fmt.Sprint(kinds) != "[online/newbie/joined offline/leaver/left]" {
		t.Fatalf("after the restart: %v, want newbie's online and the leaver's offline only", kinds)
	}
	m := members(t, other, "r1")
	if len(m) != 6 || m["newbie"] != 1 || m["leaver"] != 0 {
		t.Fatalf("members %v, want the stayers and newbie", m)
	}
}

// tm is the timing of the tests' stores.
func tm(testing.TB) presence.Timing { return testTiming }

// After Redis lost its data, a node's sessions are restored silently by
// whichever of its refreshes comes first, however its heartbeat splits
// them into batches: each batch remembers what its own sessions were
// written in.
func TestRestoreAcrossHeartbeatBatches(t *testing.T) {
	rdb, srv := testredis.Client(t)
	c := &collector{}
	node := newStore(t, rdb, c)
	a, b := ref("r1", "ann", "tab"), ref("r1", "bob", "tab")
	touch(t, node, a, b)
	srv.RestartEmpty(t)
	for _, batch := range [][]presence.SessionRef{{a}, {b}} {
		if _, err := node.Refresh(context.Background(), batch); err != nil {
			t.Fatal(err)
		}
	}
	if got := c.All(); len(got) != 2 {
		t.Fatalf("transitions %v, want the two first onlines only", got)
	}
	if m := members(t, node, "r1"); len(m) != 2 {
		t.Fatalf("members %v", m)
	}
}

// The bus is out of reach while 1,500 users leave one room: nothing is
// dropped; once it is back every departure is delivered, in order.
func TestALongBusOutageLosesNoTransition(t *testing.T) {
	slow(t)
	rdb, _ := testredis.Client(t)
	c := &collector{}
	s := newStore(t, rdb, c)
	var refs []presence.SessionRef
	for i := range 1500 {
		refs = append(refs, ref("r1", fmt.Sprintf("u%04d", i), "tab"))
	}
	for i := 0; i < len(refs); i += 500 {
		touch(t, s, refs[i:i+500]...)
	}
	c.down.Store(true)
	for _, r := range refs {
		release(t, s, r)
	}
	waitRedisPast(t, rdb, redisNow(t, rdb).Add(testTiming.OfflineGrace))
	reap(t, s) // the departures go to the outbox; the sink refuses them
	c.down.Store(false)
	startReaper(t, s)
	testkit.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		return testkit.Want("departures", offlines(c), 1500)
	})
	seqs := map[uint64]bool{}
	for _, tr := range c.All() {
		if seqs[tr.Seq] {
			t.Fatalf("seq %d delivered twice", tr.Seq)
		}
		seqs[tr.Seq] = true
	}
	if len(seqs) != 3000 {
		t.Fatalf("%d distinct transitions, want 3000", len(seqs))
	}
}

func offlines(c *collector) int {
	n := 0
	for _, tr := range c.All() {
		if tr.Kind == presence.Offline {
			n++
		}
	}
	return n
}

// With a cap on the outbox, an overflow drops the undelivered events and
// starts a new epoch with the event that overflowed: readers that missed
// them learn it from that event and take a new snapshot.
func TestAnOutboxAtItsCapStartsANewEpoch(t *testing.T) {
	rdb, _ := testredis.Client(t)
	c := &collector{}
	s := newStore(t, rdb, c, func(o *Options) { o.MaxOutbox = 10 })
	touch(t, s, ref("r1", "first", "tab"))
	epoch := c.All()[0].Epoch
	c.down.Store(true)
	for i := range 15 {
		touch(t, s, ref("r1", fmt.Sprintf("u%02d", i), "tab"))
	}
	c.down.Store(false)
	startReaper(t, s)
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error { return testkit.Want("transitions delivered from the outbox", len(c.All()), 6) })
	for i, tr := range c.All()[1:] {
		if tr.Epoch <= epoch || tr.Seq != uint64(i+1) || tr.User != fmt.Sprintf("u%02d", 10+i) {
			t.Fatalf("after the overflow: %v, want u10..u14 numbered 1..5 under a new epoch", c.All()[1:])
		}
	}
}

// gatedSink holds every publish until its gate opens.
type gatedSink struct {
	collector
	gate chan struct{}
}

func (g *gatedSink) Publish(ctx context.Context, ts []presence.Transition) (uint64, error) {
	select {
	case <-g.gate:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	return g.collector.Publish(ctx, ts)
}

// With AsyncDelivery, joins and the heartbeat never wait on the bus: a
// bus that hangs (NATS away) holds no claim or refresh, and what they
// produced goes out, in order, once it answers.
func TestAsyncDeliveryNeverHoldsTheHeartbeat(t *testing.T) {
	rdb, _ := testredis.Client(t)
	g := &gatedSink{gate: make(chan struct{})}
	s := newStore(t, rdb, g, func(o *Options) { o.AsyncDelivery = true })
	startReaper(t, s)
	var refs []presence.SessionRef
	for i := range 20 {
		refs = append(refs, ref("r1", fmt.Sprintf("u%02d", i), "tab"))
	}
	done := make(chan error, 1)
	go func() {
		for _, r := range refs {
			if _, err := s.Claim(context.Background(), []presence.SessionRef{r}); err != nil {
				done <- err
				return
			}
		}
		_, err := s.Refresh(context.Background(), refs)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("claims and a refresh waited on a bus that does not answer")
	}
	if n := len(g.All()); n != 0 {
		t.Fatalf("%d delivered through a closed gate", n)
	}
	close(g.gate)
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error { return testkit.Want("onlines delivered", len(g.All()), 20) })
	for i, tr := range g.All() {
		if tr.Seq != uint64(i+1) {
			t.Fatalf("delivered out of order: %v", g.All())
		}
	}
}

// A call whose events overflow the outbox's cap hands on only those the
// outbox still holds, the new epoch's: the events the overflow dropped are
// not delivered as if stored.
func TestACallOverflowingTheOutboxHandsOnWhatItHolds(t *testing.T) {
	rdb, _ := testredis.Client(t)
	c := &collector{}
	s := newStore(t, rdb, c, func(o *Options) { o.MaxOutbox = 3 })
	var refs []presence.SessionRef
	for i := range 5 { // one call, one room: the fourth event finds the outbox full
		refs = append(refs, ref("r1", fmt.Sprintf("u%02d", i), "tab"))
	}
	res, err := s.Claim(context.Background(), refs)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.All(); len(res.Transitions) != 2 || len(got) != 2 {
		t.Fatalf("returned %v, delivered %v: want the two events after the overflow", res.Transitions, got)
	}
	for i, tr := range res.Transitions {
		if tr.Seq != uint64(i+1) || tr.User != fmt.Sprintf("u%02d", 3+i) {
			t.Fatalf("returned %v, want u03 and u04 numbered 1 and 2 under the new epoch", res.Transitions)
		}
	}
}

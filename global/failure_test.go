package global_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/presence-dev/presence/global"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/presence"
)

// A partition of region eu (its gateways cut, both ways) shorter than the
// drop period changes nothing globally; a longer one takes the users only
// in eu offline once each with reason region_lost; healing brings them
// back online once each.
func TestPartition(t *testing.T) {
	w := newWorld(t, "us", "eu", "us", "ap")
	// The drop period is well above the short cut plus the gateway's
	// reconnect delay (about a second) plus the resync.
	const dropAfter = 5 * time.Second
	opt := func(c *global.AggregatorConfig) { c.Regions, c.DropAfter = []string{"eu", "us", "ap"}, dropAfter }
	aggUS, _ := w.aggregator("us", opt)
	aggAP, _ := w.aggregator("ap", opt)
	leader := waitLeader(t, aggUS, aggAP)
	t.Cleanup(func() { dump(t, "us", aggUS); dump(t, "ap", aggAP) })
	rec := w.record("us")
	eu, us := w.regions["eu"], w.regions["us"]
	eu.join(t, ref("room", "only-eu-1", "s1"), ref("room", "only-eu-2", "s2"), ref("room", "both", "s3"))
	us.join(t, ref("room", "both", "s4"), ref("room", "only-us", "s5"))
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.Want("members online in the global view", len(rec.members("room")), 4) })

	// Short: eu is down (held) for a while, never dropped.
	w.sc.Isolate("eu")
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		return errors.Join(testkit.Want("eu at us", regionState(aggUS, "eu"), global.RegionDown), testkit.Want("eu at ap", regionState(aggAP, "eu"), global.RegionDown))
	})
	w.sc.Heal("eu")
	w.sc.WaitConnected(t, 20*time.Second)
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		return errors.Join(testkit.Want("eu at us", regionState(aggUS, "eu"), global.RegionLive), testkit.Want("eu at ap", regionState(aggAP, "eu"), global.RegionLive))
	})
	holds(t, grace+2*cadence, func() error {
		if ev := rec.events(); len(ev) != 4 {
			return fmt.Errorf("a short partition caused global transitions: %v", ev[4:])
		}
		return nil
	})

	// Long: eu is dropped.
	w.sc.Isolate("eu")
	testkit.CheckFor(t, dropAfter+5*time.Second, 10*time.Millisecond, func() error { return testkit.Want("transitions, with the region_lost offlines", len(rec.events()), 6) })
	for _, u := range []string{"only-eu-1", "only-eu-2"} {
		if got := rec.of("room", u); !slices.Equal(got, []string{"online joined", "offline region_lost"}) {
			t.Errorf("%s: %q", u, got)
		}
	}
	// Not before the drop period, counted from the last publication of eu
	// the writer heard: that one may have come up to a cadence before the
	// cut, so the cut itself is no reference. At is stored to the
	// millisecond; so is heard here.
	if !leader.Leader() {
		t.Fatal("the leader changed during the cut: the drop cannot be timed")
	}
	heard := regionStatus(leader, "eu").Heard.Truncate(time.Millisecond)
	if heard.IsZero() {
		t.Fatal("the leader never heard eu")
	}
	for _, tr := range rec.events() {
		if lag := tr.At.Sub(heard); tr.Reason == presence.RegionLost && lag < dropAfter {
			t.Errorf("%s dropped %v after eu was last heard, before the drop period %v", tr.User, lag, dropAfter)
		}
	}
	w.sc.Heal("eu")
	testkit.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error { return testkit.Want("transitions, with the users back", len(rec.events()), 8) })
	holds(t, grace+2*cadence, rec.exactly(8))
	for _, u := range []string{"only-eu-1", "only-eu-2"} {
		if got := rec.of("room", u); !slices.Equal(got, []string{"online joined", "offline region_lost", "online joined"}) {
			t.Errorf("%s: %q", u, got)
		}
	}
	for _, u := range []string{"both", "only-us"} {
		if got := rec.of("room", u); !slices.Equal(got, []string{"online joined"}) {
			t.Errorf("%s: %q", u, got)
		}
	}
	rec.checkOrder(t)
	if got := maps.Collect(maps.All(rec.members("room"))); len(got) != 4 {
		t.Errorf("members after heal: %v", got)
	}
}

// Two aggregators, one per region, under churn; the writing one is killed
// (its connection dropped, its lease left to expire) mid-run. Global
// transitions go on, each user's arrive exactly once, in order, and the
// end state is the union of the regional truths.
func TestAggregatorFailover(t *testing.T) {
	w := newWorld(t, "us", "eu", "us")
	aggEU, ncEU := w.aggregator("eu")
	aggUS, ncUS := w.aggregator("us")
	t.Cleanup(func() { dump(t, "eu", aggEU); dump(t, "us", aggUS) })
	leader := waitLeader(t, aggEU, aggUS)
	standby, leaderNC := aggUS, ncEU
	if leader == aggUS {
		standby, leaderNC = aggEU, ncUS
	}
	rec := w.record("eu")

	// 24 users; each joins a random region at a random moment in the
	// first 5s, and half of them leave 1.5–3s later.
	rng := rand.New(rand.NewPCG(1, 2))
	type plan struct {
		user, region string
		join, leave  time.Duration
	}
	var plans []plan
	for i := range 24 {
		p := plan{user: fmt.Sprintf("u%02d", i), region: []string{"eu", "us"}[rng.IntN(2)], join: time.Duration(rng.IntN(5000)) * time.Millisecond}
		if i%2 == 0 {
			p.leave = p.join + 1500*time.Millisecond + time.Duration(rng.IntN(1500))*time.Millisecond
		}
		plans = append(plans, p)
	}
	start := time.Now()
	var wg sync.WaitGroup
	for _, p := range plans {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, x := w.regions[p.region], ref("room", p.user, "s-"+p.user)
			time.Sleep(time.Until(start.Add(p.join)))
			r.join(t, x)
			if p.leave > 0 {
				time.Sleep(time.Until(start.Add(p.leave)))
				r.leave(t, x)
			}
		}()
	}
	// Kill the leader mid-run: once a third of the transitions are out.
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error { return testkit.AtLeast("transitions, a third of them", len(rec.events()), 12) })
	killedAt := len(rec.events())
	leaderNC.Close() // a crash: no lease release, no goodbye
	leader.Close()
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if !standby.Leader() {
			return errors.New("still waiting for the standby to take over")
		}
		return nil
	})
	wg.Wait()

	testkit.CheckFor(t, 15*time.Second, 10*time.Millisecond, func() error { return testkit.Want("transitions", len(rec.events()), 24+12) })
	holds(t, grace+2*cadence, rec.exactly(24+12))
	for _, p := range plans {
		want := []string{"online joined"}
		if p.leave > 0 {
			want = append(want, "offline left")
		}
		if got := rec.of("room", p.user); !slices.Equal(got, want) {
			t.Errorf("%s (%s, join %v leave %v): %q", p.user, p.region, p.join, p.leave, got)
		}
	}
	rec.checkOrder(t)
	if killedAt == 0 || killedAt == 36 {
		t.Errorf("the kill did not happen mid-run: %d transitions before it", killedAt)
	}
	union := w.union("room")
	if got := rec.members("room"); len(got) != len(union) {
		t.Errorf("global members %v, regional union %s", got, fmtMembers(union))
	}
	if n, _ := standby.Count(context.Background(), "room"); n != 12 {
		t.Errorf("count %d", n)
	}
}

// An aggregator started after the regions changed converges on the union
// of the regional truths within two cadences, and then announces what
// changed while it was away.
func TestConvergenceAfterRestart(t *testing.T) {
	w := newWorld(t, "us", "eu", "us")
	first, _ := w.aggregator("us")
	rec := w.record("us")
	eu, us := w.regions["eu"], w.regions["us"]
	eu.join(t, ref("room", "stays", "s1"), ref("room", "goes", "s2"))
	us.join(t, ref("room", "stays", "s3"))
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.Want("members online in the global view", len(rec.members("room")), 2) })
	first.Close()

	eu.leave(t, ref("room", "goes", "s2"))
	us.join(t, ref("room", "new", "s4"))
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return notIn(eu.truth(t, "room"), "goes", "eu's truth") })
	truth := w.union("room")

	started := time.Now()
	second, _ := w.aggregator("eu")
	t.Cleanup(func() { dump(t, "second", second) })
	var took time.Duration
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if err := testkit.Want("the second's union (the regional truths')", fmtMembers(second.Union("room")), fmtMembers(truth)); err != nil {
			return err
		}
		took = time.Since(started)
		return nil
	})
	t.Logf("converged %v after start (cadence %v)", took, cadence)
	if took > 2*cadence {
		t.Errorf("converged after %v, more than two cadences", took)
	}
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		return testkit.Want("transitions, with new online and goes offline", len(rec.events()), 4)
	})
	holds(t, grace+2*cadence, rec.exactly(4))
	if got := rec.of("room", "goes"); !slices.Equal(got, []string{"online joined", "offline left"}) {
		t.Errorf("goes: %q", got)
	}
	if got := rec.of("room", "new"); !slices.Equal(got, []string{"online joined"}) {
		t.Errorf("new: %q", got)
	}
	if got := rec.of("room", "stays"); !slices.Equal(got, []string{"online joined"}) {
		t.Errorf("stays: %q", got)
	}
	rec.checkOrder(t)
}

// Two regions, an aggregator in each, the global stream in us and the
// leader in eu, away from it. Both gateway links are cut for longer than
// the drop period. The side that holds the stream (and the lease, which
// lives beside it) takes over and announces what it sees: eu's users
// lost once the drop period is over, us's departures as they happen,
// nobody of us lost, and an aggregator started there during the cut
// starts at once. The side without it writes nothing, answers no query
// it cannot vouch for, and an aggregator started there waits for the
// heal. After the heal both sides end with the truth: eu's users
// back, and no aggregator answers with a user who left during the cut.
func TestPartitionWithTheLeaderAwayFromTheStream(t *testing.T) {
	w := newWorld(t, "us", "eu", "us")
	opt := func(c *global.AggregatorConfig) { c.Regions = []string{"eu", "us"} }
	aggEU, _ := w.aggregator("eu", opt)
	waitLeader(t, aggEU)
	aggUS, _ := w.aggregator("us", opt)
	t.Cleanup(func() { dump(t, "eu", aggEU); dump(t, "us", aggUS) })
	rec := w.record("us")
	eu, us := w.regions["eu"], w.regions["us"]
	eu.join(t, ref("room", "eu-only", "s1"), ref("room", "both", "s2"))
	us.join(t, ref("room", "both", "s3"), ref("room", "us-only", "s4"), ref("room", "us-leaves", "s5"))
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.Want("members online in the global view", len(rec.members("room")), 4) })
	if !aggEU.Leader() || aggUS.Leader() {
		t.Fatal("the leader moved before the cut")
	}
	ctx := context.Background()

	w.sc.Isolate("eu")
	// An aggregator started on the side without the stream waits.
	late := make(chan error, 1)
	lateNC := w.sc.Connect(t, "eu")
	lateJS, _ := jetstream.New(lateNC)
	lateAgg, err := global.NewAggregator(global.AggregatorConfig{
		NATS: lateNC, JetStream: lateJS, Cadence: cadence, Grace: grace, DownAfter: downAfter, DropAfter: dropAfter,
		Regions: []string{"eu", "us"}, Placement: &jetstream.Placement{Cluster: "us"}, Storage: jetstream.MemoryStorage, Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lateAgg.Close)
	go func() { late <- lateAgg.Start(ctx) }()

	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if !aggUS.Leader() {
			return errors.New("still waiting for us to lead")
		}
		return nil
	})
	// On the stream's side an aggregator starts during the cut: it only
	// looks the stream and the lease bucket up, which needs no meta leader.
	nearNC := w.sc.Connect(t, "us")
	nearJS, _ := jetstream.New(nearNC)
	near, err := global.NewAggregator(global.AggregatorConfig{
		NATS: nearNC, JetStream: nearJS, Cadence: cadence, Grace: grace, DownAfter: downAfter, DropAfter: dropAfter,
		Regions: []string{"eu", "us"}, Placement: &jetstream.Placement{Cluster: "us"}, Storage: jetstream.MemoryStorage, Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(near.Close)
	if err := near.Start(ctx); err != nil || near.Stats().StartRetries.Load() != 0 {
		t.Fatalf("an aggregator started during the cut beside the stream: %v, %d retries", err, near.Stats().StartRetries.Load())
	}
	us.leave(t, ref("room", "us-leaves", "s5"))
	testkit.CheckFor(t, dropAfter+10*time.Second, 10*time.Millisecond, func() error {
		return testkit.Want("transitions, with eu's users lost and us-leaves gone", len(rec.events()), 6)
	})
	if got := rec.of("room", "eu-only"); !slices.Equal(got, []string{"online joined", "offline region_lost"}) {
		t.Errorf("eu-only during the cut: %q", got)
	}
	if got := rec.of("room", "us-leaves"); !slices.Equal(got, []string{"online joined", "offline left"}) {
		t.Errorf("us-leaves during the cut: %q", got)
	}
	if s := regionState(aggUS, "eu"); s != global.RegionDropped {
		t.Errorf("the leader holds eu as %s after the drop period", s)
	}
	// The side without the stream cannot vouch for its view.
	if _, err := aggEU.Count(ctx, "room"); err == nil {
		t.Error("the aggregator cut off from the stream answered a query")
	}
	if aggEU.Leader() {
		t.Error("the aggregator cut off from the lease still leads")
	}
	testkit.CheckFor(t, 15*time.Second, 10*time.Millisecond, func() error {
		return testkit.AtLeast("start retries of the late aggregator", lateAgg.Stats().StartRetries.Load(), 1)
	})
	select {
	case err := <-late:
		t.Fatalf("an aggregator started during the cut returned %v", err)
	default:
	}

	w.sc.Heal("eu")
	w.sc.WaitConnected(t, 20*time.Second)
	if err := <-late; err != nil {
		t.Fatalf("the late aggregator: %v", err)
	}
	// The first answer eu's aggregator gives after the heal is already
	// without the user who left during the cut.
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		snap, err := aggEU.Snapshot(ctx, "room", 0, 100)
		if err != nil {
			return fmt.Errorf("eu's aggregator does not answer: %w", err)
		}
		for _, m := range snap.Members {
			if m.User == "us-leaves" {
				t.Fatalf("a ghost in eu's aggregator's first answer after the heal: %+v", snap)
			}
		}
		return nil
	})
	// A healed supercluster re-elects and republishes in a few cadences;
	// a loaded machine takes longer, and polling costs nothing.
	testkit.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error { return testkit.Want("transitions, with eu-only back", len(rec.events()), 7) })
	holds(t, grace+2*cadence, rec.exactly(7)) // anything else due would be out by now
	if got := rec.of("room", "eu-only"); !slices.Equal(got, []string{"online joined", "offline region_lost", "online joined"}) {
		t.Errorf("eu-only: %q", got)
	}
	for _, u := range []string{"both", "us-only"} {
		if got := rec.of("room", u); !slices.Equal(got, []string{"online joined"}) {
			t.Errorf("%s: %q", u, got)
		}
	}
	rec.checkOrder(t)
	want := fmtMembers(w.union("room"))
	for name, a := range map[string]*global.Aggregator{"eu": aggEU, "us": aggUS, "late": lateAgg, "near": near} {
		testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
			snap, err := a.Snapshot(ctx, "room", 0, 100)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			return errors.Join(testkit.Want(name+"'s snapshot members", len(snap.Members), 3),
				testkit.Want(name+"'s union (the truth)", fmtMembers(a.Union("room")), want),
				testkit.Want(name+": eu", regionState(a, "eu"), global.RegionLive), testkit.Want(name+": us", regionState(a, "us"), global.RegionLive))
		})
	}
}

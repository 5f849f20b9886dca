package global_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/presence-dev/presence/global"
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
	waitLeader(t, aggUS, aggAP)
	t.Cleanup(func() { dump(t, "us", aggUS); dump(t, "ap", aggAP) })
	rec := w.record("us")
	eu, us := w.regions["eu"], w.regions["us"]
	eu.join(t, ref("room", "only-eu-1", "s1"), ref("room", "only-eu-2", "s2"), ref("room", "both", "s3"))
	us.join(t, ref("room", "both", "s4"), ref("room", "only-us", "s5"))
	waitFor(t, 5*time.Second, "four online", func() bool { return len(rec.members("room")) == 4 })

	// Short: eu is down (held) for a while, never dropped.
	w.sc.Isolate("eu")
	waitFor(t, 5*time.Second, "eu down", func() bool {
		return regionState(aggUS, "eu") == global.RegionDown && regionState(aggAP, "eu") == global.RegionDown
	})
	w.sc.Heal("eu")
	w.sc.WaitConnected(t, 20*time.Second)
	waitFor(t, 10*time.Second, "eu live again", func() bool {
		return regionState(aggUS, "eu") == global.RegionLive && regionState(aggAP, "eu") == global.RegionLive
	})
	time.Sleep(grace + 2*cadence)
	if n := len(rec.events()); n != 4 {
		t.Fatalf("a short partition caused global transitions: %v", rec.events()[4:])
	}

	// Long: eu is dropped.
	cut := time.Now()
	w.sc.Isolate("eu")
	waitFor(t, dropAfter+5*time.Second, "region_lost offlines", func() bool { return len(rec.events()) == 6 })
	lag := time.Since(cut)
	for _, u := range []string{"only-eu-1", "only-eu-2"} {
		if got := rec.of("room", u); !slices.Equal(got, []string{"online joined", "offline region_lost"}) {
			t.Errorf("%s: %q", u, got)
		}
	}
	if lag < dropAfter {
		t.Errorf("dropped after %v, before the drop period %v", lag, dropAfter)
	}
	w.sc.Heal("eu")
	waitFor(t, 20*time.Second, "users back", func() bool { return len(rec.events()) == 8 })
	time.Sleep(grace + 2*cadence)
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
	time.Sleep(2500 * time.Millisecond)
	killedAt := len(rec.events())
	leaderNC.Close() // a crash: no lease release, no goodbye
	leader.Close()
	waitFor(t, 5*time.Second, "the standby to take over", standby.Leader)
	wg.Wait()

	waitFor(t, 15*time.Second, "every transition", func() bool { return len(rec.events()) == 24+12 })
	time.Sleep(grace + 2*cadence)
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
	waitFor(t, 5*time.Second, "two online", func() bool { return len(rec.members("room")) == 2 })
	first.Close()

	eu.leave(t, ref("room", "goes", "s2"))
	us.join(t, ref("room", "new", "s4"))
	waitFor(t, 5*time.Second, "goes to leave eu", func() bool { _, ok := eu.truth(t, "room")["goes"]; return !ok })
	truth := w.union("room")

	started := time.Now()
	second, _ := w.aggregator("eu")
	t.Cleanup(func() { dump(t, "second", second) })
	var took time.Duration
	waitFor(t, 5*time.Second, "the union of the regional truths", func() bool {
		if fmtMembers(second.Union("room")) == fmtMembers(truth) {
			took = time.Since(started)
			return true
		}
		return false
	})
	t.Logf("converged %v after start (cadence %v)", took, cadence)
	if took > 2*cadence {
		t.Errorf("converged after %v, more than two cadences", took)
	}
	waitFor(t, 10*time.Second, "new online and goes offline", func() bool { return len(rec.events()) == 4 })
	time.Sleep(grace + 2*cadence)
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

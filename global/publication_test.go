package global_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/presence-dev/presence/global"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/presence"
)

// sameAsTruth reports how an aggregator's copy of a region differs from
// the region's truth as a publisher reads it (members, sessions, states);
// nil when they agree.
func sameAsTruth(t testing.TB, agg *global.Aggregator, r *regionEnv) error {
	t.Helper()
	truth, err := global.ReadRegion(context.Background(), r.store, 1000)
	if err != nil {
		return err
	}
	rooms, states := global.RegionContribution(agg, r.name)
	for room, users := range rooms {
		if len(users) == 0 {
			delete(rooms, room)
		}
	}
	if !reflect.DeepEqual(map[string]map[string][]string(truth.Members), rooms) {
		return fmt.Errorf("members: aggregator %v, truth %v", rooms, truth.Members)
	}
	// States travel as json.Marshal writes a json.RawMessage: with <, >
	// and & escaped.
	want := map[string]map[string]map[string]string{}
	for room, users := range truth.States {
		want[room] = map[string]map[string]string{}
		for u, st := range users {
			want[room][u] = map[string]string{}
			for s, j := range st {
				var b bytes.Buffer
				json.HTMLEscape(&b, []byte(j))
				want[room][u][s] = b.String()
			}
		}
	}
	for room, users := range states {
		if len(users) == 0 {
			delete(states, room)
		}
	}
	if !reflect.DeepEqual(want, states) && !(len(want) == 0 && len(states) == 0) {
		return fmt.Errorf("states: aggregator %v, truth %v", states, want)
	}
	return nil
}

// A change the change log never saw (written to Redis behind the
// scripts' back) is found by the anti-entropy check, which re-reads the
// region a slice per cadence: with CheckEvery 4, ten rooms are read two
// or three per cadence, so after exactly four cadences every room was
// compared and repaired. Cadences are run by hand.
func TestTheCheckRepairsWhatTheChangeLogMissed(t *testing.T) {
	w := newWorldWith(t, regionTiming, func(c *global.PublisherConfig) {
		c.CheckEvery = 4
		global.Manual(c)
	}, "us", "eu", "us")
	agg, _ := w.aggregator("us")
	waitLeader(t, agg)
	eu := w.regions["eu"]
	pub := eu.pubs[0]
	ctx := context.Background()
	for i := range 10 {
		eu.join(t, ref(fmt.Sprintf("room%d", i), "ann", "tab"))
	}
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if !pub.Active() {
			return errors.New("still waiting for the publisher's lease")
		}
		return nil
	})
	global.RunCadence(ctx, pub) // the full of its term
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return sameAsTruth(t, agg, eu) })
	if pub.Stats().Fulls.Load() != 1 || pub.Stats().WholeReads.Load() != 1 {
		t.Fatalf("fulls %d whole reads %d, want 1 and 1", pub.Stats().Fulls.Load(), pub.Stats().WholeReads.Load())
	}

	// A state in every room, written without the scripts: no mark.
	for i := range 10 {
		if err := eu.rdb.HSet(ctx, fmt.Sprintf("presence:{room%d}:st", i), "ann:tab", `{"hidden":true}`).Err(); err != nil {
			t.Fatal(err)
		}
	}
	wantRepairs := []int64{2, 5, 7, 10} // slices [0,2) [2,5) [5,7) [7,10)
	for i, want := range wantRepairs {
		global.RunCadence(ctx, pub)
		if got := pub.Stats().Repairs.Load(); got != want {
			t.Fatalf("after check cadence %d: %d repairs, want %d", i+1, got, want)
		}
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		return sameAsTruth(t, agg, eu)
	})
	if n := pub.Stats().WholeReads.Load(); n != 1 {
		t.Fatalf("%d whole reads, want only the first", n)
	}
	// The next pass finds nothing more.
	for range 4 {
		global.RunCadence(ctx, pub)
	}
	if got := pub.Stats().Repairs.Load(); got != 10 {
		t.Fatalf("%d repairs after a clean pass, want still 10", got)
	}
}

// An aggregator whose copy of a region went wrong (here: a member
// forgotten, as a bug would) is caught by the next digest, asks for a
// full, and is whole again; the view announces nothing meanwhile.
func TestADigestMismatchBringsAFull(t *testing.T) {
	w := newWorldWith(t, regionTiming, func(c *global.PublisherConfig) { c.FullEvery = 2 }, "us", "eu", "us")
	agg, _ := w.aggregator("us")
	rec := w.record("us")
	waitLeader(t, agg)
	eu := w.regions["eu"]
	eu.join(t, ref("room", "ann", "a"), ref("room", "bob", "b"))
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.Want("members online in the global view", len(rec.members("room")), 2) })
	fulls := eu.pubs[0].Stats().Fulls.Load()
	global.ForgetMember(agg, "eu", "room", "bob")
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		return errors.Join(testkit.AtLeast("digest mismatches", agg.Stats().DigestMismatches.Load(), 1),
			testkit.AtLeast("fulls", eu.pubs[0].Stats().Fulls.Load(), fulls+1), sameAsTruth(t, agg, eu))
	})
	// bob was held meanwhile (the region was out of sync), never gone.
	holds(t, grace+2*cadence, rec.exactly(2))
}

// Churn with states, two publishers of which the active one stops half
// way, and a third reader of the change log that follows it all along:
// reading the log takes nothing from anyone, so the successor's deltas,
// from the change log alone (the check is too slow to read any room in
// this test), bring the aggregator to the region's truth, states
// included, with no whole read but each term's first.
func TestChurnWithStatesAndAFailoverLoseNoChange(t *testing.T) {
	w := newWorldWith(t, regionTiming, func(c *global.PublisherConfig) { c.CheckEvery = 1 << 20 }, "us", "eu", "us")
	agg, _ := w.aggregator("us")
	rec := w.record("us")
	waitLeader(t, agg)
	eu := w.regions["eu"]
	spare := eu.addPublisher(t, func(c *global.PublisherConfig) { c.CheckEvery = 1 << 20 })
	active := eu.pubs[0]
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		return errors.Join(testkit.Want("the first publisher active", active.Active(), true), testkit.Want("the spare active", spare.Active(), false))
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the third reader
		defer wg.Done()
		cursor := ""
		for ctx.Err() == nil {
			if _, next, _, err := eu.store.Changes(ctx, cursor, 1000); err == nil {
				cursor = next
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()

	rng := mrand.New(mrand.NewPCG(7, 8))
	live := map[presence.SessionRef]bool{}
	n := 0
	states := []string{`{"s":"away"}`, `{"s":"busy","note":"<b>&</b>"}`, ""}
	step := func() {
		switch k := rng.IntN(10); {
		case k < 4 || len(live) == 0: // a join
			n++
			x := ref(fmt.Sprintf("room%d", rng.IntN(4)), fmt.Sprintf("u%d", rng.IntN(12)), fmt.Sprintf("s%d", n))
			eu.join(t, x)
			live[x] = true
		case k < 7: // a state
			for x := range live {
				st := states[rng.IntN(len(states))]
				var raw []byte
				if st != "" {
					raw = []byte(st)
				}
				if _, err := eu.store.SetState(ctx, x, raw); err != nil {
					t.Fatal(err)
				}
				break
			}
		default: // a clean close
			for x := range live {
				eu.leave(t, x)
				delete(live, x)
				break
			}
		}
	}
	for i := range 200 {
		step()
		if i == 100 {
			active.Close()
		}
		time.Sleep(15 * time.Millisecond)
	}
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if !spare.Active() {
			return errors.New("still waiting for the spare to publish")
		}
		return nil
	})
	testkit.CheckFor(t, 15*time.Second, 10*time.Millisecond, func() error {
		return sameAsTruth(t, agg, eu)
	})
	// Released sessions end after the regional grace (the reaper's
	// departures are changes too): the view follows the truth there.
	settled := time.Now().Add(regionTiming.OfflineGrace + time.Second)
	testkit.CheckFor(t, 15*time.Second, 10*time.Millisecond, func() error {
		if d := time.Until(settled); d > 0 {
			return fmt.Errorf("the graces end in %v", d)
		}
		return sameAsTruth(t, agg, eu)
	})
	cancel()
	wg.Wait()
	for name, p := range map[string]*global.RegionPublisher{"first": active, "spare": spare} {
		if r, wr := p.Stats().Repairs.Load(), p.Stats().WholeReads.Load(); r != 0 || wr != 1 {
			t.Errorf("%s publisher: %d repairs, %d whole reads; want 0 and 1", name, r, wr)
		}
	}
	if agg.Stats().DigestMismatches.Load() != 0 {
		t.Errorf("%d digest mismatches", agg.Stats().DigestMismatches.Load())
	}
	rec.checkOrder(t)
}

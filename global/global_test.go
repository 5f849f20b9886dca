package global_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/presence-dev/presence/global"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/presence"
)

// A session that leaves eu and shows up in us with the same id inside
// the global grace is no global transition, and the user is never
// counted twice (nor zero times) on the way.
func TestRegionMoveIsNoGlobalTransition(t *testing.T) {
	w := newWorld(t, "us", "eu", "us")
	agg, _ := w.aggregator("us")
	rec := w.record("eu")
	eu, us := w.regions["eu"], w.regions["us"]
	cli := global.NewClient(w.sc.Connect(t, "eu"))

	mover, crasher := ref("room", "mover", "tab1"), ref("room", "crasher", "tab9")
	eu.join(t, mover, crasher)
	t.Cleanup(func() { dump(t, "agg", agg) })
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.Want("members online in the global view", len(rec.members("room")), 2) })

	// Count the room all along: it must stay 2.
	var bad atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			n, err := cli.Count(context.Background(), "room")
			if err != nil || n != 2 {
				bad.Add(1)
				t.Errorf("count %d, %v", n, err)
			}
			if s := agg.Union("room")["mover"]; len(s) > 1 {
				t.Errorf("mover has sessions %v", s)
			}
		}
	}()

	// mover closes cleanly in eu; once eu has let them go (its regional
	// grace), they reconnect to us with the same session id.
	eu.leave(t, mover)
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return notIn(eu.truth(t, "room"), "mover", "eu's truth") })
	us.join(t, mover)
	// crasher's eu node dies; they reconnect to us at once, so for the
	// session TTL both regions list the same session.
	eu.crash(crasher)
	us.join(t, crasher)
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		return testkit.WantSlice("the regions listing crasher", agg.Regions("room", "crasher"), []string{"eu", "us"})
	})
	if s := agg.Union("room")["crasher"]; !slices.Equal(s, []string{"tab9"}) {
		t.Errorf("crasher's sessions during the overlap: %v", s)
	}
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error { return notIn(eu.truth(t, "room"), "crasher", "eu's truth") })
	holds(t, grace+2*cadence, rec.exactly(2)) // anything due would be out by now
	close(stop)
	<-done

	for _, u := range []string{"mover", "crasher"} {
		if got := rec.of("room", u); !slices.Equal(got, []string{"online joined"}) {
			t.Errorf("%s: global transitions %q, want only the first online", u, got)
		}
	}
	if got := agg.Regions("room", "mover"); !slices.Equal(got, []string{"us"}) {
		t.Errorf("mover now in %v", got)
	}
	rec.checkOrder(t)
}

// Two tabs in two regions are one global member with two sessions.
func TestTwoTabsInTwoRegionsAreOneMember(t *testing.T) {
	w := newWorld(t, "us", "eu", "us")
	agg, _ := w.aggregator("us")
	rec := w.record("us")
	cli := global.NewClient(w.sc.Connect(t, "eu"))
	ctx := context.Background()

	w.regions["eu"].join(t, ref("room", "u1", "tab1"))
	w.regions["us"].join(t, ref("room", "u1", "tab2"))
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		rep, err := cli.User(ctx, "room", "u1")
		if err != nil {
			return err
		}
		if !rep.Online || len(rep.Member.Sessions) != 2 {
			return fmt.Errorf("u1 %+v, want online with two sessions", rep)
		}
		return nil
	})
	rep, _ := cli.User(ctx, "room", "u1")
	if !slices.Equal(rep.Regions, []string{"eu", "us"}) || rep.Region != "global" || rep.LastSeen != nil {
		t.Fatalf("user reply %+v", rep)
	}
	snap, err := cli.Snapshot(ctx, "room", 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Total != 1 || len(snap.Members) != 1 || snap.Region != "global" {
		t.Fatalf("snapshot %+v", snap)
	}
	var ids []string
	for _, s := range snap.Members[0].Sessions {
		ids = append(ids, s.ID)
	}
	if !slices.Equal(ids, []string{"tab1", "tab2"}) {
		t.Fatalf("sessions %v", ids)
	}
	if n, _ := cli.Count(ctx, "room"); n != 1 {
		t.Fatalf("count %d", n)
	}

	// One tab closes: still one member; the other closes: one offline.
	w.regions["eu"].leave(t, ref("room", "u1", "tab1"))
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		return testkit.WantSlice("the regions listing u1", agg.Regions("room", "u1"), []string{"us"})
	})
	w.regions["us"].leave(t, ref("room", "u1", "tab2"))
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error { return testkit.Want("u1's transitions, with the offline", len(rec.of("room", "u1")), 2) })
	if got := rec.of("room", "u1"); !slices.Equal(got, []string{"online joined", "offline left"}) {
		t.Fatalf("transitions %q", got)
	}
	rec.checkOrder(t)

	// The stream keeps the current view: u1's online, superseded, is
	// purged; the offline stays (until its TTL).
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.Want("purges, with the superseded online", agg.Stats().Purges.Load(), 1) })
	js, _ := jetstream.New(w.sc.Connect(t, "us"))
	st, err := js.Stream(ctx, global.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(">"))
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 || info.State.Subjects["presence.global.room.offline.u1"] != 1 {
		t.Fatalf("stream state %+v", info.State)
	}
}

// A session's state set in one region reaches the global view: one
// update event, and the global snapshot carries it. Moving the session to
// another region with the same state announces nothing; clearing it
// announces one update with no state. A second aggregator that takes over
// announces nothing again.
func TestSessionStateReachesTheGlobalView(t *testing.T) {
	w := newWorld(t, "us", "eu", "us")
	agg, _ := w.aggregator("us")
	rec := w.record("us")
	eu, us := w.regions["eu"], w.regions["us"]
	cli := global.NewClient(w.sc.Connect(t, "eu"))
	ctx := context.Background()

	x := ref("room", "ann", "tab")
	eu.join(t, x)
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		return testkit.Want("ann online in the recorded view", rec.members("room")["ann"], true)
	})
	if _, err := eu.store.SetState(ctx, x, []byte(`{"status":"away"}`)); err != nil {
		t.Fatal(err)
	}
	updates := func() []presence.Transition {
		var out []presence.Transition
		for _, tr := range rec.events() {
			if tr.Kind == presence.Update {
				out = append(out, tr)
			}
		}
		return out
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.Want("global updates", len(updates()), 1) })
	if u := updates()[0]; u.User != "ann" || u.Session != "tab" || string(u.State) != `{"status":"away"}` || u.Reason != presence.State || u.Sessions != 1 {
		t.Fatalf("update %+v", u)
	}
	stateOf := func() string {
		snap, err := cli.Snapshot(ctx, "room", 0, 10)
		if err != nil || len(snap.Members) != 1 || len(snap.Members[0].Sessions) != 1 {
			t.Fatalf("snapshot %+v %v", snap, err)
		}
		return string(snap.Members[0].Sessions[0].State)
	}
	if got := stateOf(); got != `{"status":"away"}` {
		t.Fatalf("global snapshot state %q", got)
	}

	// Move to us: ann's eu node dies and the tab reconnects to us at once
	// and sends its state again. Until eu's copy expires both regions list
	// the session, and eu's state (first by name) stands for it.
	eu.crash(x)
	us.join(t, x)
	if _, err := us.store.SetState(ctx, x, []byte(`{"status":"away"}`)); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		return testkit.WantSlice("the regions listing ann", agg.Regions("room", "ann"), []string{"us"})
	})
	// Nothing may follow: watch a whole grace.
	holds(t, grace+2*cadence, func() error {
		if ev := rec.events(); len(ev) != 2 {
			return fmt.Errorf("after the move: %d transitions %v, want online and one update", len(ev), ev)
		}
		return nil
	})

	// A second aggregator that takes over reads the state from the stream.
	agg2, _ := w.aggregator("eu")
	agg.Close()
	waitLeader(t, agg2)
	if _, err := us.store.SetState(ctx, x, nil); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.Want("global updates, with the clear", len(updates()), 2) })
	if u := updates()[1]; u.State != nil || u.Session != "tab" {
		t.Fatalf("clear %+v", u)
	}
	if got := stateOf(); got != "" {
		t.Fatalf("global snapshot state %q after the clear", got)
	}
	if n := len(rec.events()); n != 3 {
		t.Fatalf("%d transitions %v, want online and two updates", n, rec.events())
	}
	rec.checkOrder(t)
}

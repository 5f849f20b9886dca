package main

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/testnats"
	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
)

// Two regions, each with its own Redis and NATS cluster joined by
// gateways, a --global node in each and an aggregator process: a client in
// one region sees a user of the other join and set a state through the
// global view, and a subscriber to presence.global.> sees one online per
// user.
func TestE2EGlobalViewAcrossRegions(t *testing.T) {
	sc := testnats.StartSuperCluster(t, "a", "b")
	sc.WaitConnected(t, 10*time.Second)
	sc.WaitJetStream(t, 20*time.Second)
	regions := map[string]*env{}
	for _, name := range []string{"a", "b"} {
		rs := testredis.Start(t)
		regions[name] = &env{t: t, redis: rs.Addr, nats: sc.Server(name).ClientURL(), nc: sc.Connect(t, name)}
	}
	watch := sc.Connect(t, "a")
	globalEvents := make(chan presence.Transition, 100)
	sub, err := watch.Subscribe(bus.Root+"."+bus.GlobalRegion+".>", func(m *nats.Msg) {
		if tr, err := bus.DecodeEvent(m.Data); err == nil {
			globalEvents <- tr
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	_ = watch.Flush()

	regions["a"].start([]string{"aggregator", "--nats", sc.Server("a").ClientURL(), "--cadence", "300ms", "--regions", "a,b"}, false)
	na := regions["a"].startNodeIn("a", "--global", "--global-cadence", "300ms")
	nb := regions["b"].startNodeIn("b", "--global", "--global-cadence", "300ms")

	alice := dial(t, na.addr, "alice", "tab")
	alice.join("lobby")
	bob := dial(t, nb.addr, "bob", "tab")
	bob.join("lobby")

	// alice, in region a, sees bob of region b come online globally.
	deadline := time.After(15 * time.Second)
	for seen := false; !seen; {
		select {
		case f := <-alice.frames:
			if f["type"] == "event" {
				ev := f["event"].(map[string]any)
				seen = ev["region"] == bus.GlobalRegion && ev["user"] == "bob" && ev["kind"] == "online"
			}
		case <-deadline:
			t.Fatal("alice never saw bob's global online")
		}
	}
	// bob's state crosses over too: alice sees it as a global update.
	bob.send(map[string]any{"type": "state", "room": "lobby", "state": map[string]string{"status": "away"}, "ref": "s"})
	for seen := false; !seen; {
		select {
		case f := <-alice.frames:
			if f["type"] == "event" {
				ev := f["event"].(map[string]any)
				st, _ := ev["state"].(map[string]any)
				seen = ev["region"] == bus.GlobalRegion && ev["user"] == "bob" && ev["kind"] == "update" && ev["session"] == "tab" && st["status"] == "away"
			}
		case <-deadline:
			t.Fatal("alice never saw bob's state")
		}
	}

	got := map[string]int{}
	timeout := time.After(5 * time.Second)
	for len(got) < 2 {
		select {
		case tr := <-globalEvents:
			if tr.Kind == presence.Online {
				got[tr.User]++
			}
		case <-timeout:
			t.Fatalf("global onlines: %v, want alice and bob", got)
		}
	}
	if got["alice"] != 1 || got["bob"] != 1 {
		t.Fatalf("global onlines: %v, want one each", got)
	}
}

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/testkit"
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
	skipIfShort(t, "global: two regions on a NATS supercluster")
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

	agg := regions["a"].start([]string{"aggregator", "--nats", sc.Server("a").ClientURL(), "--cadence", "300ms", "--regions", "a,b", "--listen", "127.0.0.1:0"}, false)
	// Nodes that start before the global view answers serve the regional
	// view until it does; this test follows the global view from the start.
	waitAggregatorOK(t, agg)
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

	// Operators see it too: the aggregator's health and metrics, and the
	// nodes' store and publisher metrics.
	var aggAddr string
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		m := regexp.MustCompile(`msg="presenced: aggregator http" addr=(\S+)`).FindStringSubmatch(agg.out.String())
		if m != nil {
			aggAddr = m[1]
		}
		if m == nil {
			return errors.New("no aggregator http line in its log yet")
		}
		return nil
	})
	var h struct {
		Status  string `json:"status"`
		Leader  bool   `json:"leader"`
		Regions []struct {
			Region, State string
		} `json:"regions"`
	}
	getJSON(t, "http://"+aggAddr+"/healthz", &h)
	if h.Status != "ok" || !h.Leader || len(h.Regions) != 2 || h.Regions[0].State != "live" || h.Regions[1].State != "live" {
		t.Fatalf("aggregator health %+v", h)
	}
	expectMetrics(t, "http://"+aggAddr+"/metrics", "presence_global_leader 1", `presence_global_region_state{region="b",state="live"} 1`, "presence_global_transitions_total 3")
	expectMetrics(t, "http://"+nb.addr+"/metrics", "presence_global_publisher_active 1", "presence_region_transitions_total 2")
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	r, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	if err := json.NewDecoder(r.Body).Decode(v); err != nil {
		t.Fatalf("%s: %v", url, err)
	}
}

// tryJSON decodes the JSON body at url into v.
func tryJSON(url string, v any) error {
	r, err := http.Get(url)
	if err != nil {
		return err
	}
	defer r.Body.Close()
	return json.NewDecoder(r.Body).Decode(v)
}

// expectMetrics waits until the exposition at url has every line.
func expectMetrics(t *testing.T, url string, lines ...string) {
	t.Helper()
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		r, err := http.Get(url)
		if err != nil {
			return fmt.Errorf("%s: %w", url, err)
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		have := map[string]bool{}
		for _, l := range strings.Split(string(b), "\n") {
			have[l] = true
		}
		for _, l := range lines {
			if !have[l] {
				return fmt.Errorf("%s lacks %q", url, l)
			}
		}
		return nil
	})
}

// seenRoom is one room as a client sees it: the members and the view
// (the region) of its latest snapshot, with the events after it applied.
type seenRoom struct {
	room    string
	region  string
	members map[string]bool
}

// seen starts following a room from the reply to its join.
func seen(join map[string]any) *seenRoom {
	v := &seenRoom{room: join["room"].(string)}
	v.snapshot(join)
	return v
}

func (v *seenRoom) snapshot(f map[string]any) {
	snap := f["snapshot"].(map[string]any)
	v.region, v.members = snap["region"].(string), map[string]bool{}
	members, _ := snap["members"].([]any)
	for _, m := range members {
		v.members[m.(map[string]any)["user"].(string)] = true
	}
}

// follow applies c's frames of the room until cond holds.
func (v *seenRoom) follow(t *testing.T, c *client, within time.Duration, what string, cond func(*seenRoom) bool) {
	t.Helper()
	deadline := time.After(within)
	for !cond(v) {
		select {
		case f, ok := <-c.frames:
			if !ok {
				t.Fatalf("%s: connection closed waiting for %s", c.user, what)
			}
			switch f["type"] {
			case "snapshot":
				if f["room"] == v.room {
					v.snapshot(f)
				}
			case "event":
				ev := f["event"].(map[string]any)
				if ev["room"] != v.room || ev["region"] != v.region {
					continue
				}
				switch ev["kind"] {
				case "online":
					v.members[ev["user"].(string)] = true
				case "offline":
					delete(v.members, ev["user"].(string))
				}
			}
		case <-deadline:
			t.Fatalf("%s: no %s within %v; last view %s %v", c.user, what, within, v.region, v.members)
		}
	}
}

func (v *seenRoom) is(region string, users ...string) bool {
	if v.region != region || len(v.members) != len(users) {
		return false
	}
	for _, u := range users {
		if !v.members[u] {
			return false
		}
	}
	return true
}

// A --global node whose region is cut off from the aggregators, or whose
// aggregators are all stopped, keeps serving its region: joins work, and
// its clients are moved to the region's view (a resync snapshot whose
// region is the node's) with its events; when the global view is back
// they are moved back to it, and what happened meanwhile is in it. An
// aggregator started in the cut-off region waits for the heal (health
// "starting") instead of exiting.
func TestE2EGlobalNodeServesItsRegionWithoutTheGlobalView(t *testing.T) {
	skipIfShort(t, "global: two regions on a NATS supercluster")
	sc := testnats.StartSuperCluster(t, "a", "b")
	regions := map[string]*env{}
	for _, name := range []string{"a", "b"} {
		rs := testredis.Start(t)
		regions[name] = &env{t: t, redis: rs.Addr, nats: sc.Server(name).ClientURL(), nc: sc.Connect(t, name)}
	}
	aggArgs := func(cluster string) []string {
		return []string{"aggregator", "--nats", sc.Server(cluster).ClientURL(), "--cadence", "300ms", "--regions", "a,b",
			"--stream-cluster", "b", "--listen", "127.0.0.1:0"}
	}
	agg := regions["b"].start(aggArgs("b"), false)
	waitAggregatorOK(t, agg)
	na := regions["a"].startNodeIn("a", "--global", "--global-cadence", "300ms")
	nb := regions["b"].startNodeIn("b", "--global", "--global-cadence", "300ms")

	alice := dial(t, na.addr, "alice", "tab")
	lobby := seen(alice.join("lobby"))
	if lobby.region != bus.GlobalRegion {
		t.Fatalf("alice's join: %s, want the global view", lobby.region)
	}
	bob := dial(t, nb.addr, "bob", "tab")
	bob.join("lobby")
	lobby.follow(t, alice, 15*time.Second, "alice and bob in the global view", func(v *seenRoom) bool { return v.is(bus.GlobalRegion, "alice", "bob") })

	sc.Isolate("a")
	late := regions["a"].start(aggArgs("a"), false)
	lobby.follow(t, alice, 15*time.Second, "the regional view", func(v *seenRoom) bool { return v.is("a", "alice") })
	carol := dial(t, na.addr, "carol", "tab")
	if v := seen(carol.join("lobby")); !v.is("a", "alice", "carol") {
		t.Fatalf("carol's join during the cut: %s %v, want the regional view", v.region, v.members)
	}
	lobby.follow(t, alice, 10*time.Second, "carol in the regional view", func(v *seenRoom) bool { return v.is("a", "alice", "carol") })
	var lateAddr string
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		m := aggregatorHTTP.FindStringSubmatch(late.out.String())
		if m == nil {
			return errors.New("no http line in the late aggregator's log yet")
		}
		lateAddr = m[1]
		var h struct{ Status string }
		if err := tryJSON("http://"+lateAddr+"/healthz", &h); err != nil {
			return err
		}
		return testkit.Want("the late aggregator's health", h.Status, "starting")
	})

	sc.Heal("a")
	sc.WaitConnected(t, 20*time.Second)
	lobby.follow(t, alice, 30*time.Second, "the global view with carol", func(v *seenRoom) bool { return v.is(bus.GlobalRegion, "alice", "bob", "carol") })
	waitAggregatorOK(t, late)

	// Every aggregator stops: the node serves its region again.
	_ = agg.cmd.Process.Kill()
	_ = late.cmd.Process.Kill()
	lobby.follow(t, alice, 15*time.Second, "the regional view again", func(v *seenRoom) bool { return v.is("a", "alice", "carol") })
	dave := dial(t, na.addr, "dave", "tab")
	if v := seen(dave.join("lobby")); !v.is("a", "alice", "carol", "dave") {
		t.Fatalf("dave's join without aggregators: %s %v, want the regional view", v.region, v.members)
	}
}

package main

import (
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
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

	agg := regions["a"].start([]string{"aggregator", "--nats", sc.Server("a").ClientURL(), "--cadence", "300ms", "--regions", "a,b", "--listen", "127.0.0.1:0"}, false)
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
	waitFor(t, 5*time.Second, "the aggregator's http address", func() bool {
		m := regexp.MustCompile(`msg="presenced: aggregator http" addr=(\S+)`).FindStringSubmatch(agg.out.String())
		if m != nil {
			aggAddr = m[1]
		}
		return m != nil
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

// expectMetrics waits until the exposition at url has every line.
func expectMetrics(t *testing.T, url string, lines ...string) {
	t.Helper()
	waitFor(t, 5*time.Second, url+" to show "+strings.Join(lines, ", "), func() bool {
		r, err := http.Get(url)
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		have := map[string]bool{}
		for _, l := range strings.Split(string(b), "\n") {
			have[l] = true
		}
		for _, l := range lines {
			if !have[l] {
				return false
			}
		}
		return true
	})
}

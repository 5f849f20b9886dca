package webhook

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/presence"
)

// Two dispatchers share the lanes (one each of two), and when one stops
// the other takes its lane over: nothing is lost, and a graceful handover
// delivers nothing twice. What the docs allow, and only that: a lease
// lost (a refresh not made in time on a loaded machine) may have the
// lane's one delivery in flight sent again, by the next holder.
func TestDispatchersShareAndTakeOver(t *testing.T) {
	e := newEnv(t, "eu")
	ra, rb := newReceiver(t), newReceiver(t)
	cfg := func() *Config { return config(t, endpoint("a", ra.srv.URL), endpoint("b", rb.srv.URL)) }
	d1, reg1 := e.dispatcher(cfg())
	d2, reg2 := e.dispatcher(cfg())
	testkit.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		return errors.Join(testkit.Want("lanes of the first", len(d1.Status()), 1), testkit.Want("lanes of the second", len(d2.Status()), 1))
	})
	// A lane taken is in Status before it made its consumer, which starts
	// with the events stored after it.
	waitLanes(t, e, "a", "eu")
	waitLanes(t, e, "b", "eu")
	want := e.churn("eu", 4, 40)
	waitEvents(t, ra, len(want), 10*time.Second)
	waitEvents(t, rb, len(want), 10*time.Second)
	d1.Close()
	testkit.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error { return testkit.Want("lanes of the second", len(d2.Status()), 2) })
	more := e.churn("eu", 4, 40)
	want = append(want, more...)
	waitEvents(t, ra, len(want), 10*time.Second)
	waitEvents(t, rb, len(want), 10*time.Second)
	for _, c := range []struct {
		r        *receiver
		endpoint string
	}{{ra, "a"}, {rb, "b"}} {
		lost := gauge(reg1, "presence_webhook_leases_lost_total", c.endpoint) +
			gauge(reg2, "presence_webhook_leases_lost_total", c.endpoint)
		checkContract(t, c.r, want, lost > 0)
		if n := resent(c.r); float64(n) > lost {
			t.Errorf("endpoint %s: %d accepted deliveries sent again, with %v leases lost", c.endpoint, n, lost)
		}
	}
}

// resent counts the accepted deliveries some of whose events were sent
// again later.
func resent(r *receiver) int {
	first := map[any]int{} // event id -> the delivery that was accepted first with it
	again := map[int]bool{}
	for i, d := range r.deliveries() {
		for _, ev := range d.items {
			if j, ok := first[ev["id"]]; ok {
				again[j] = true
			} else if d.status >= 200 && d.status < 300 {
				first[ev["id"]] = i
			}
		}
	}
	return len(again)
}

// A changed file is reloaded without a restart; a bad one is refused and
// the dispatcher keeps delivering with the configuration it has.
func TestConfigFileReloads(t *testing.T) {
	e := newEnv(t, "eu")
	r1, r2 := newReceiver(t), newReceiver(t)
	path := filepath.Join(t.TempDir(), "webhooks.yaml")
	// Written whole (a rename), as a deployment tool writes it: a file
	// read while half written would be a refused reload of its own.
	write := func(body string) {
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	file := func(url string) string {
		return fmt.Sprintf("sources: [eu]\nendpoints:\n  - name: a\n    url: %s\n    secrets: [%s]\n    max_wait: 10ms\n    timeout: 1s\n    allow_networks: [127.0.0.0/8]\n", url, testSecret)
	}
	write(file(r1.srv.URL))
	cfg, err := LoadConfigFile(path)
	if err != nil {
		t.Fatal(err)
	}
	d, reg := e.dispatcher(cfg)
	go WatchConfig(t.Context(), path, 20*time.Millisecond, nil, d)
	waitLanes(t, e, "a", "eu")
	e.publish(e.transition("eu", "r", "u1", presence.Online))
	waitEvents(t, r1, 1, 10*time.Second)

	write("endpoints: [{name: a, url: nope}]\n")
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.AtLeast("refused reloads", reloads(reg, "error"), 1) })
	e.publish(e.transition("eu", "r", "u2", presence.Online))
	waitEvents(t, r1, 2, 10*time.Second)

	time.Sleep(30 * time.Millisecond) // a new modification time
	write(file(r2.srv.URL))
	// The good reload, counted apart: a file read while half written is
	// refused too, so the sum of both results says nothing.
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.AtLeast("good reloads", reloads(reg, "ok"), 1) })
	// The lanes take the new settings a moment after the reload is
	// counted: an event published meanwhile may still go to the old URL.
	// Every event reaches one of the two, and once the new URL has one,
	// the old gets nothing more.
	i := 3
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		e.publish(e.transition("eu", "r", fmt.Sprintf("u%d", i), presence.Online))
		i++
		return testkit.AtLeast("events at the new URL", len(r2.events()), 1)
	})
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		return testkit.Want("distinct events at either URL", len(eventIDs(r1.events(), r2.events())), i-1)
	})
	old := len(r1.events())
	e.publish(e.transition("eu", "r", fmt.Sprintf("u%d", i), presence.Online))
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if !hasUser(r2.events(), fmt.Sprintf("u%d", i)) {
			return fmt.Errorf("u%d's event not at the new URL (%d events there)", i, len(r2.events()))
		}
		return nil
	})
	if n := len(r1.events()); n != old {
		t.Errorf("the old URL got %d events after the new one had one", n-old)
	}
}

// eventIDs is the set of event ids in the lists.
func eventIDs(lists ...[]map[string]any) map[any]bool {
	seen := map[any]bool{}
	for _, l := range lists {
		for _, ev := range l {
			seen[ev["id"]] = true
		}
	}
	return seen
}

func hasUser(evs []map[string]any, user string) bool {
	for _, ev := range evs {
		if ev["user"] == user {
			return true
		}
	}
	return false
}

// reloads is config_reloads_total{result=result}.
func reloads(reg *prometheus.Registry, result string) float64 {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "presence_webhook_config_reloads_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// A dispatcher stopping lets the delivery in flight finish and settles
// it, and starts no other: the next holder delivers the rest, and
// nothing of the first delivery again.
func TestGracefulStopStartsNoNewDelivery(t *testing.T) {
	e := newEnv(t, "eu")
	var mu sync.Mutex
	var bodies [][]byte
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		mu.Lock()
		bodies = append(bodies, body)
		first := len(bodies) == 1
		mu.Unlock()
		if first {
			<-release
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	t.Cleanup(open)
	got := func() [][]byte {
		mu.Lock()
		defer mu.Unlock()
		return append([][]byte(nil), bodies...)
	}
	d, _ := e.dispatcher(config(t, endpoint("a", srv.URL)))
	waitLanes(t, e, "a", "eu")
	want := e.churn("eu", 1, 30)
	testkit.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error { return testkit.Want("deliveries", len(got()), 1) })
	closed := make(chan struct{})
	go func() {
		d.Close()
		close(closed)
	}()
	testkit.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error { return testkit.Want("lanes while closing", len(d.Status()), 0) })
	open()
	select {
	case <-closed:
	case <-time.After(20 * time.Second):
		t.Fatal("Close did not return")
	}
	if n := len(got()); n != 1 {
		t.Fatalf("%d deliveries, want only the one in flight at the stop", n)
	}
	var first struct {
		Events []map[string]any `json:"events"`
	}
	if err := json.Unmarshal(got()[0], &first); err != nil || len(first.Events) == 0 {
		t.Fatalf("the first delivery %q: %v", got()[0], err)
	}
	r := newReceiver(t)
	e.dispatcher(config(t, endpoint("a", r.srv.URL)))
	waitEvents(t, r, len(want)-len(first.Events), 20*time.Second)
	checkContract(t, r, want[len(first.Events):], false)
}

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/presence"
)

// A client whose TCP connection is cut reconnects with the same session id
// within the grace: a subscriber on presence.> sees nothing after the
// first online.
func TestE2EBlipIsSilent(t *testing.T) {
	e := newEnv(t)
	w := e.watch()
	n := e.startNode()
	c := dial(t, n.addr, "alice", "tab1")
	c.join("room42")
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.Want("alice's onlines", w.count(presence.Online, "alice"), 1) })

	c.cut()
	cut := time.Now()
	time.Sleep(300 * time.Millisecond) // the network is down for a moment
	c2 := dial(t, n.addr, "alice", "tab1")
	c2.join("room42")
	pastGrace(cut)
	if evs := w.All(); len(evs) != 1 {
		t.Fatalf("events after a blip: %v, want only the first online", evs)
	}
}

// Two tabs: the second is an update (joined); closing one is an update
// (left) after the grace, never an offline; closing the second announces
// one offline after the grace.
func TestE2ESecondTab(t *testing.T) {
	e := newEnv(t)
	w := e.watch()
	n := e.startNode()
	a := dial(t, n.addr, "bob", "tabA")
	a.join("room42")
	b := dial(t, n.addr, "bob", "tabB")
	b.join("room42")
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.Want("bob's onlines", w.count(presence.Online, "bob"), 1) })

	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.Want("transitions, with tabB's update", len(w.All()), 2) })
	if u := w.All()[1]; u.Kind != presence.Update || u.Reason != presence.Joined || u.Session != "tabB" || u.Sessions != 2 {
		t.Fatalf("second tab: %v, want an update (joined) of tabB", u)
	}

	_ = a.ws.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "bye"))
	closed := time.Now()
	testkit.CheckFor(t, e2eGrace+3*time.Second, 10*time.Millisecond, func() error { return testkit.Want("transitions, with tabA's end", len(w.All()), 3) })
	if u := w.All()[2]; u.Kind != presence.Update || u.Reason != presence.Left || u.Session != "tabA" || u.Sessions != 1 || u.At.Sub(closed) < e2eGrace-100*time.Millisecond {
		t.Fatalf("after closing one of two tabs: %v at %v, want an update (left) of tabA after the grace", u, u.At.Sub(closed))
	}
	_ = b.ws.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "bye"))
	closed = time.Now()
	testkit.CheckFor(t, e2eGrace+3*time.Second, 10*time.Millisecond, func() error { return testkit.Want("bob's offlines", w.count(presence.Offline, "bob"), 1) })
	off := w.All()[3]
	if off.Reason != presence.Left || off.At.Sub(closed) < e2eGrace-100*time.Millisecond {
		t.Fatalf("offline %+v %v after the close, want reason left after the grace", off, off.At.Sub(closed))
	}
	pastGrace(time.Now())
	if n := len(w.All()); n != 4 {
		t.Fatalf("%d events, want online, two updates and one offline", n)
	}
}

// A node is SIGKILLed: half its clients reconnect to another node within
// the grace (no events for them), the others never return (one offline
// each, reason expired, within TTL + reap interval).
func TestE2ECrash(t *testing.T) {
	e := newEnv(t)
	a := e.startNode()
	b := e.startNode()
	var clients []*client
	joins := e.watch()
	for i := range 10 {
		c := dial(t, a.addr, fmt.Sprintf("u%d", i), fmt.Sprintf("s%d", i))
		c.join("room42")
		clients = append(clients, c)
	}
	// A join's reply can come before its online is published: wait for
	// all ten, so that w sees only what the crash causes.
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.Want("onlines", joins.count(presence.Online, ""), 10) })
	w := e.watch()
	killed := time.Now()
	a.signal(syscall.SIGKILL)
	for _, c := range clients[:5] {
		c.closeCode()
		r := dial(t, b.addr, c.user, c.sess)
		r.join("room42")
	}
	// Sessions were refreshed at most one heartbeat before the kill; their
	// expiry is the TTL from then, rounded up to a whole second.
	deadline := killed.Add(e2eTTL + time.Second + e2eReap)
	testkit.CheckFor(t, time.Until(deadline)+2*time.Second, 10*time.Millisecond, func() error { return testkit.Want("offlines", w.count(presence.Offline, ""), 5) })
	pastGrace(time.Now())
	for i, c := range clients {
		want := 0
		if i >= 5 {
			want = 1
		}
		if got := w.count(presence.Offline, c.user); got != want {
			t.Fatalf("%s: %d offlines, want %d; events %v", c.user, got, want, w.All())
		}
	}
	for _, ev := range w.All() {
		if ev.Kind != presence.Offline || ev.Reason != presence.Expired {
			t.Fatalf("unexpected event %v", ev)
		}
		if ev.At.After(deadline.Add(200 * time.Millisecond)) {
			t.Fatalf("offline at %v, %v after the kill", ev.At, ev.At.Sub(killed))
		}
	}
}

// SIGTERM drains: clients are closed with 1012, reconnect to another node,
// and nothing is announced; the process exits 0.
func TestE2EDrainIsSilent(t *testing.T) {
	e := newEnv(t)
	a := e.startNode()
	b := e.startNode()
	var clients []*client
	joins := e.watch()
	for i := range 5 {
		c := dial(t, a.addr, fmt.Sprintf("d%d", i), fmt.Sprintf("s%d", i))
		c.join("room42")
		clients = append(clients, c)
	}
	// As in TestE2ECrash: w must not see the joins' own onlines.
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.Want("onlines", joins.count(presence.Online, ""), 5) })
	w := e.watch()
	drained := time.Now()
	a.signal(syscall.SIGTERM)
	for _, c := range clients {
		if code := c.closeCode(); code != websocket.CloseServiceRestart {
			t.Fatalf("close code %d, want 1012", code)
		}
		r := dial(t, b.addr, c.user, c.sess)
		r.join("room42")
	}
	if code := a.exit(t, 10*time.Second); code != 0 {
		t.Fatalf("drained node exited %d", code)
	}
	pastGrace(drained)
	if evs := w.All(); len(evs) != 0 {
		t.Fatalf("events during a drain: %v", evs)
	}
}

// A late subscriber takes a snapshot through the query service, replays
// the stream from its sequence, and ends with exactly the live members.
func TestE2ESnapshotThenReplay(t *testing.T) {
	e := newEnv(t)
	n := e.startNode()
	var clients []*client
	for i := range 6 {
		c := dial(t, n.addr, fmt.Sprintf("m%d", i), "s")
		c.join("room42")
		clients = append(clients, c)
	}
	clients[0].ws.Close() // leaves (after the grace)
	clients[1].ws.Close()

	resp, err := e.nc.Request(bus.APISubject("eu", bus.EndpointMembers), []byte(`{"room":"room42"}`), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var snap presence.Snapshot
	if err := json.Unmarshal(resp.Data, &snap); err != nil || snap.Room != "room42" {
		t.Fatalf("snapshot: %v %s", err, resp.Data)
	}
	view := map[string]bool{}
	for _, m := range snap.Members {
		view[m.User] = true
	}
	js, err := jetstream.New(e.nc)
	if err != nil {
		t.Fatal(err)
	}
	apply := make(chan presence.Transition, 100)
	r, err := bus.Replay(t.Context(), js, "eu", "room42", snap, func(tr presence.Transition) { apply <- tr })
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	// More churn after the snapshot.
	for i := range 3 {
		c := dial(t, n.addr, fmt.Sprintf("late%d", i), "s")
		c.join("room42")
	}
	clients[2].ws.Close()

	want := func() map[string]bool {
		resp, err := e.nc.Request(bus.APISubject("eu", bus.EndpointMembers), []byte(`{"room":"room42"}`), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var s presence.Snapshot
		_ = json.Unmarshal(resp.Data, &s)
		m := map[string]bool{}
		for _, x := range s.Members {
			m[x.User] = true
		}
		return m
	}
	same := func(a, b map[string]bool) bool {
		if len(a) != len(b) {
			return false
		}
		for k := range a {
			if !b[k] {
				return false
			}
		}
		return true
	}
	testkit.CheckFor(t, e2eGrace+5*time.Second, 10*time.Millisecond, func() error {
		for {
			select {
			case tr := <-apply:
				switch tr.Kind {
				case presence.Online:
					if view[tr.User] {
						t.Fatalf("online for %s, already a member: overlap", tr.User)
					}
					view[tr.User] = true
				case presence.Offline:
					if !view[tr.User] {
						t.Fatalf("offline for %s, not a member: gap", tr.User)
					}
					delete(view, tr.User)
				}
				continue
			default:
			}
			break
		}
		live := want()
		if len(live) != 6 || !same(view, live) {
			return fmt.Errorf("the replayed view %v, the live members %v (want 6)", view, live)
		}
		return nil
	})
}

// A join outside the token's rooms is refused with an error frame;
// malformed frames get error frames; the node keeps serving.
func TestE2EBadInput(t *testing.T) {
	e := newEnv(t)
	w := e.watch()
	n := e.startNode()
	c := dial(t, n.addr, "eve", "s", "team7-*")
	c.send(map[string]any{"type": "join", "room": "other", "ref": "x"})
	if f := c.expect("error"); f["code"] != "forbidden" || f["ref"] != "x" {
		t.Fatalf("join outside the token: %v", f)
	}
	for _, raw := range []string{`not json`, `{"type":"dance"}`, `{"type":"join","room":"a.b"}`, `{"type":"state","room":"team7-a","state":{}}`, `[1,2]`} {
		if err := c.ws.WriteMessage(websocket.TextMessage, []byte(raw)); err != nil {
			t.Fatal(err)
		}
		if f := c.expect("error"); f["code"] == "" || f["message"] == "" {
			t.Fatalf("%s: error frame without code or message: %v", raw, f)
		}
	}
	c.join("team7-a") // still serving this connection
	// Bad handshakes are refused before the upgrade.
	for _, u := range []string{
		"ws://" + n.addr + "/v1/ws?session=s",                                        // no token
		"ws://" + n.addr + "/v1/ws?session=s&access_token=garbage",                   // bad token
		"ws://" + n.addr + "/v1/ws?session=a.b&access_token=" + token(t, "eve", "*"), // bad session id
	} {
		_, resp, err := websocket.DefaultDialer.Dial(u, nil)
		if err == nil || resp == nil || (resp.StatusCode != http.StatusUnauthorized && resp.StatusCode != http.StatusBadRequest) {
			t.Fatalf("%s: %v %v", u, err, resp)
		}
	}
	r, err := http.Get("http://" + n.addr + "/healthz")
	if err != nil || r.StatusCode != 200 {
		t.Fatalf("node unhealthy after bad input: %v", err)
	}
	r.Body.Close()
	// The join's online reaches the watcher over the bus, after its reply.
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		return testkit.Want("eve's onlines (team7-a only)", w.count(presence.Online, "eve"), 1)
	})
	if strings.Contains(fmt.Sprint(w.All()), "other") {
		t.Fatal("refused join wrote something")
	}
}

// A second signal during a drain exits at once (code 1) instead of
// waiting for slow clients.
func TestE2ESecondSignalExitsAtOnce(t *testing.T) {
	e := newEnv(t)
	n := e.startNode()
	// A client that never reads, so never answers the close frame: the
	// drain waits for it (close timeout 2s).
	u := fmt.Sprintf("ws://%s/v1/ws?session=s&access_token=%s", n.addr, token(t, "mute", "*"))
	ws, _, err := websocket.DefaultDialer.Dial(u, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	// The hello comes once the node has registered the connection: only
	// then has the drain something to wait for.
	if _, _, err := ws.ReadMessage(); err != nil {
		t.Fatal(err)
	}
	n.signal(syscall.SIGTERM)
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if !strings.Contains(n.out.String(), "presenced: draining") {
			return errors.New("the node has not logged its drain")
		}
		return nil
	})
	n.signal(syscall.SIGTERM)
	// A graceful end would be 0, after the close timeout; the second
	// signal's is 1, at once.
	if code := n.exit(t, 5*time.Second); code != 1 {
		t.Fatalf("exit code %d after a second signal, want 1", code)
	}
}

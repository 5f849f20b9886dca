package main

import (
	"errors"
	"fmt"
	"github.com/presence-dev/presence/internal/testkit"
	"slices"
	"syscall"
	"testing"
	"time"
)

// The browser tests: the JavaScript client in headless Chromium against
// a real presenced, each tab's WebSocket through a proxy the test can
// cut (see browser_helpers_test.go). They skip without chromium, unless
// PRESENCE_REQUIRE_BROWSER=1, and under -short.

// Two users in two browsers see each other, each with the other's
// session.
func TestBrowserTwoUsersSeeEachOther(t *testing.T) {
	b := newBrowser(t)
	n := startDev(t)
	pg := newTestPage(t, n.addr)
	const room = "br-two"

	alice := b.open("alice", pg.url(link(t, n.addr), pageOpts{room: room, user: "alice"}), true)
	alice.waitSynced()
	bob := b.open("bob", pg.url(link(t, n.addr), pageOpts{room: room, user: "bob"}), true)
	both := func(v pageView) bool { return slices.Equal(v.users(), []string{"alice", "bob"}) }
	av := alice.waitView(10*time.Second, "alice and bob listed", both)
	bv := bob.waitView(10*time.Second, "alice and bob listed", both)
	if av.Session == "" || bv.Session == "" || av.Session == bv.Session {
		t.Fatalf("session ids: alice %q, bob %q", av.Session, bv.Session)
	}
	if got := bv.sessionIDs("alice"); !slices.Equal(got, []string{av.Session}) {
		t.Fatalf("bob sees alice's sessions %v, want [%s]", got, av.Session)
	}
	if got := av.sessionIDs("bob"); !slices.Equal(got, []string{bv.Session}) {
		t.Fatalf("alice sees bob's sessions %v, want [%s]", got, bv.Session)
	}
	joins := 0
	for _, e := range av.Events {
		if e.Type == "join" && e.User == "bob" {
			joins++
		}
	}
	if joins != 1 {
		t.Fatalf("alice got %d joins of bob, want 1: %v", joins, av.Events)
	}
	alice.noConsoleErrors()
	bob.noConsoleErrors()
}

// A tab sets its state, then its link is cut at the TCP level and
// restored inside the grace: nobody else hears of it (no leave, join or
// update), and the state survives the blip, for the others, for the tab
// itself and for a page opened afterwards.
func TestBrowserStateSurvivesBlip(t *testing.T) {
	b := newBrowser(t)
	n := startDev(t)
	pg := newTestPage(t, n.addr)
	const room = "br-blip"

	aliceLink := link(t, n.addr)
	alice := b.open("alice", pg.url(aliceLink, pageOpts{room: room, user: "alice"}), true)
	bob := b.open("bob", pg.url(link(t, n.addr), pageOpts{room: room, user: "bob"}), true)
	both := func(v pageView) bool { return slices.Equal(v.users(), []string{"alice", "bob"}) }
	sid := alice.waitView(10*time.Second, "alice and bob listed", both).Session
	bob.waitView(10*time.Second, "alice and bob listed", both)

	alice.eval(`room.setState({status: "away"}).then(() => true)`, nil)
	isAway := func(v pageView) bool { s, ok := v.status("alice", sid); return ok && s == "away" }
	bv := bob.waitView(5*time.Second, "alice's session away", isAway)
	mark := len(bv.Events)
	if aliceLink.Accepted() != 1 {
		t.Fatalf("alice's link carried %d connections before the cut, want 1", aliceLink.Accepted())
	}

	// The cut resets both ends: the node releases alice's session (the
	// grace starts), and her client starts to reconnect, held by the cut
	// link until it is restored.
	cutAt := time.Now()
	aliceLink.Cut()
	alice.waitView(5*time.Second, "alice's client to notice the cut", func(v pageView) bool { return v.Status != "open" })
	testkit.CheckFor(t, 2*time.Second, 10*time.Millisecond, func() error {
		if !metricLine("http://"+n.addr+"/metrics", `presence_node_leaves_total{how="close"} 1`) {
			return errors.New("the node has not released alice's session (no leave by close in its metrics)")
		}
		return nil
	})
	aliceLink.Restore()
	av := alice.waitView(brGrace, "alice's client open again", func(v pageView) bool { return v.Status == "open" && isAway(v) })
	back := time.Since(cutAt)
	if back > brGrace-500*time.Millisecond {
		t.Fatalf("alice came back %v after the cut: too close to the grace (%v) to test a blip", back, brGrace)
	}
	if av.Session != sid {
		t.Fatalf("alice's session id changed over the blip: %q, then %q", sid, av.Session)
	}
	if n := aliceLink.Accepted(); n < 2 {
		t.Fatalf("alice's link carried %d connections: the client did not reconnect through it", n)
	}
	t.Logf("alice reconnected %v after the cut (%d connection(s) held while cut)", back.Round(time.Millisecond), aliceLink.Held())

	// Nothing is announced while the grace runs, nor when it would have
	// ended: a marker released after alice's release leaves after her
	// departure would have been announced.
	passMarker(t, n.addr, room, "zz-marker")
	bv = bob.waitView(brGrace+5*time.Second, "the marker's leave", func(v pageView) bool { return v.sawLeave(mark, "zz-marker") })
	if ev := bv.about(mark, "alice"); len(ev) != 0 {
		t.Fatalf("bob heard of alice's blip: %+v", ev)
	}
	if !isAway(bv) {
		t.Fatalf("bob's view after the blip: %s", bv)
	}
	if av := alice.view(); !isAway(av) || av.Status != "open" {
		t.Fatalf("alice's own view after the blip: %s", av)
	}
	carol := b.open("carol", pg.url(link(t, n.addr), pageOpts{room: room, user: "carol"}), true)
	cv := carol.waitView(10*time.Second, "alice, bob and carol listed", func(v pageView) bool {
		return slices.Equal(v.users(), []string{"alice", "bob", "carol"})
	})
	if !isAway(cv) {
		t.Fatalf("carol, opened after the blip, does not see alice away: %s", cv)
	}
	bob.noConsoleErrors()
	carol.noConsoleErrors()
}

// A duplicated tab copies sessionStorage, session id included; the
// client notices the twin and takes an id of its own, so the user has
// two sessions, and a page that lists sessions shows both.
func TestBrowserDuplicatedTabGetsItsOwnSession(t *testing.T) {
	b := newBrowser(t)
	n := startDev(t)
	pg := newTestPage(t, n.addr)
	const room = "br-dup"

	first := b.open("alice", pg.url(link(t, n.addr), pageOpts{room: room, user: "alice"}), true)
	s1 := first.waitSynced().Session
	if got := first.view().Stored; got != s1 {
		t.Fatalf("sessionStorage holds %q, the client uses %q", got, s1)
	}
	second := first.duplicate("alice's duplicate")
	v2 := second.waitSynced()
	s2 := v2.Session
	if s2 == "" || s2 == s1 {
		t.Fatalf("the duplicated tab uses session %q, the first %q: want its own", s2, s1)
	}
	if v2.Stored != s2 {
		t.Fatalf("the duplicate's sessionStorage holds %q, its client uses %q", v2.Stored, s2)
	}
	if v1 := first.view(); v1.Session != s1 || v1.Stored != s1 {
		t.Fatalf("the first tab changed its session: %q (stored %q), was %q", v1.Session, v1.Stored, s1)
	}

	want := []string{s1, s2}
	slices.Sort(want)
	bob := b.open("bob", pg.url(link(t, n.addr), pageOpts{room: room, user: "bob"}), true)
	for _, tb := range []*tab{bob, first, second} {
		tb.waitView(10*time.Second, "alice with both sessions", func(v pageView) bool {
			return slices.Equal(v.sessionIDs("alice"), want)
		})
	}
	first.noConsoleErrors()
	second.noConsoleErrors()
	bob.noConsoleErrors()
}

// A connection whose tokens live a few seconds stays open past the first
// token's exp: the client refreshes it on the same socket.
func TestBrowserTokenRefreshKeepsConnection(t *testing.T) {
	b := newBrowser(t)
	n := startSecured(t)
	// A few seconds: the client refreshes a tenth of the lifetime ahead.
	const ttl = 5 * time.Second
	pg := newTestPage(t, n.addr)
	pg.serveTokens("sam", ttl)
	l := link(t, n.addr)

	sam := b.open("sam", pg.url(l, pageOpts{room: "br-token", tokens: true}), true)
	sam.waitSynced()
	minted := pg.tokens()
	if len(minted) == 0 {
		t.Fatal("the page connected without a token")
	}
	firstExp := minted[0]
	// Past the second token's expiry too: at least two refreshes.
	until := firstExp.Add(ttl + time.Second)
	v := sam.waitView(time.Until(until)+5*time.Second, "a token lifetime past the first exp", func(pageView) bool {
		return time.Now().After(until)
	})
	if v.Status != "open" {
		t.Fatalf("status %q after the first token expired: %s", v.Status, v)
	}
	for _, s := range v.Statuses {
		if s != "connecting" && s != "open" {
			t.Fatalf("the connection did not stay up: statuses %v", v.Statuses)
		}
	}
	if opens := countOf(v.Statuses, "open"); opens != 1 {
		t.Fatalf("opened %d times: statuses %v", opens, v.Statuses)
	}
	if a, o := l.Accepted(), l.Open(); a != 1 || o != 1 {
		t.Fatalf("the link carried %d connections (%d open), want the same one throughout", a, o)
	}
	if got := len(pg.tokens()); got < 3 {
		t.Fatalf("%d tokens minted past two expiries: the client did not refresh twice", got)
	}
	if _, ok := v.member("sam"); !ok {
		t.Fatalf("sam not listed: %s", v)
	}
	if len(v.Errors) != 0 {
		t.Fatalf("client errors: %v", v.Errors)
	}
	// The connection still works: a state round trip.
	sam.eval(`room.setState({status: "here"}).then(() => true)`, nil)
	sam.waitView(5*time.Second, "sam's state", func(v pageView) bool { s, _ := v.status("sam", v.Session); return s == "here" })
	sam.noConsoleErrors()
}

// Closing a user's last tab: the others see that user leave once, when
// the grace has passed, and until then still list them.
func TestBrowserLastTabCloseLeavesAfterGrace(t *testing.T) {
	b := newBrowser(t)
	n := startDev(t)
	pg := newTestPage(t, n.addr)
	const room = "br-close"

	alice := b.open("alice", pg.url(link(t, n.addr), pageOpts{room: room, user: "alice"}), true)
	bob := b.open("bob", pg.url(link(t, n.addr), pageOpts{room: room, user: "bob"}), true)
	both := func(v pageView) bool { return slices.Equal(v.users(), []string{"alice", "bob"}) }
	alice.waitView(10*time.Second, "alice and bob listed", both)
	mark := len(bob.waitView(10*time.Second, "alice and bob listed", both).Events)

	closedAt := time.Now()
	alice.close()
	time.Sleep(brGrace / 2)
	if v := bob.view(); !both(v) {
		t.Fatalf("alice gone from bob's view %v into the grace: %s", time.Since(closedAt), v)
	}
	bob.waitView(brGrace+5*time.Second, "alice's leave", func(v pageView) bool {
		_, listed := v.member("alice")
		return !listed
	})
	// A second leave would come before a marker's released after the first.
	passMarker(t, n.addr, room, "zz-marker")
	v := bob.waitView(brGrace+5*time.Second, "the marker's leave", func(v pageView) bool { return v.sawLeave(mark, "zz-marker") })
	var aliceEvents []roomEvent
	for _, e := range v.eventsSince(mark) {
		if e.User == "alice" {
			aliceEvents = append(aliceEvents, e)
		}
	}
	if len(aliceEvents) != 1 || aliceEvents[0].Type != "leave" {
		t.Fatalf("bob got %+v about alice after she closed her tab, want one leave", aliceEvents)
	}
	after := time.UnixMilli(aliceEvents[0].At).Sub(closedAt)
	if after < brGrace-50*time.Millisecond { // the page's clock is the machine's, read in whole ms
		t.Fatalf("alice's leave came %v after she closed her tab, before the grace (%v)", after, brGrace)
	}
	t.Logf("alice's leave came %v after she closed her tab (grace %v)", after.Round(time.Millisecond), brGrace)
	if !slices.Equal(v.users(), []string{"bob"}) {
		t.Fatalf("bob's view: %s", v)
	}
	bob.noConsoleErrors()
}

// A node drains (SIGTERM) while a tab is connected to it: the tab's
// socket closes with 1012, and the client reconnects at once with the
// same session id, here through its link now pointing at the region's
// other node (as a load balancer would send it). The session was kept
// alive for its TTL and the reconnect takes it over: a user watching on
// the other node hears nothing, not when the TTL would have run out
// either, and both pages still list the tab's state. The drained node
// exits 0.
func TestBrowserNodeDrain(t *testing.T) {
	b := newBrowser(t)
	e := newEnv(t)
	n1 := e.startBrowserNode()
	n2 := e.startBrowserNode()
	// One page server per user, each minting its user's tokens; both
	// forward /v1/client.js to node 2, the node that stays.
	pa := newTestPage(t, n2.addr)
	pa.serveTokens("alice", time.Hour)
	pb := newTestPage(t, n2.addr)
	pb.serveTokens("bob", time.Hour)
	const room = "br-drain"

	aliceLink := link(t, n1.addr)
	alice := b.open("alice", pa.url(aliceLink, pageOpts{room: room, tokens: true}), true)
	bob := b.open("bob", pb.url(link(t, n2.addr), pageOpts{room: room, tokens: true}), true)
	both := func(v pageView) bool { return slices.Equal(v.users(), []string{"alice", "bob"}) }
	sid := alice.waitView(10*time.Second, "alice and bob listed", both).Session
	bob.waitView(10*time.Second, "alice and bob listed", both)

	alice.eval(`room.setState({status: "away"}).then(() => true)`, nil)
	isAway := func(v pageView) bool { s, ok := v.status("alice", sid); return ok && s == "away" }
	alice.waitView(5*time.Second, "alice's own session away", isAway)
	bv := bob.waitView(5*time.Second, "alice's session away", isAway)
	mark := len(bv.Events)
	if a := aliceLink.Accepted(); a != 1 {
		t.Fatalf("alice's link carried %d connections before the drain, want 1", a)
	}

	// New connections of alice's link go to node 2 from now on; her open
	// one stays on node 1, which drains.
	aliceLink.SetTarget(n2.addr)
	drained := time.Now()
	n1.signal(syscall.SIGTERM)

	av := alice.waitView(10*time.Second, "alice's socket closed with 1012 and her client open again, away", func(v pageView) bool {
		return slices.Contains(v.Closes, 1012) && v.Status == "open" && isAway(v) && both(v)
	})
	back := time.Since(drained)
	if av.Session != sid {
		t.Fatalf("alice's session id changed over the drain: %q, then %q", sid, av.Session)
	}
	if !slices.Equal(av.Closes, []int{1012}) {
		t.Fatalf("alice's sockets closed with %v, want one close, 1012", av.Closes)
	}
	if i := slices.Index(av.Statuses, "reconnecting"); i < 0 || !slices.Contains(av.Statuses[i:], "open") {
		t.Fatalf("alice's statuses %v: want reconnecting, then open", av.Statuses)
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		return errors.Join(testkit.Want("connections alice's link accepted", aliceLink.Accepted(), 2), testkit.Want("open on alice's link", aliceLink.Open(), 1))
	})
	t.Logf("alice was open again %v after the SIGTERM", back.Round(time.Millisecond))
	if code := n1.exit(t, 10*time.Second); code != 0 {
		t.Fatalf("the drained node exited %d\n%s", code, n1.out.String())
	}

	// Past the point where the kept session would have expired had
	// nobody taken it over: its TTL from the drain (stored in whole
	// seconds: up to a second more), a reap interval, and a margin.
	until := drained.Add(brTTL + time.Second + brReap + time.Second)
	bv = bob.waitView(time.Until(until)+5*time.Second, "the drain's TTL and a reap to pass", func(pageView) bool {
		return time.Now().After(until)
	})
	var heard []roomEvent
	for _, ev := range bv.eventsSince(mark) {
		if ev.User == "alice" {
			heard = append(heard, ev)
		}
	}
	if len(heard) != 0 {
		t.Fatalf("bob heard of alice's drain: %+v", heard)
	}
	if !isAway(bv) || !both(bv) || !slices.Equal(bv.sessionIDs("alice"), []string{sid}) {
		t.Fatalf("bob's view past the drain's TTL: %s", bv)
	}
	av = alice.view()
	if !isAway(av) || !both(av) || av.Status != "open" || !slices.Equal(av.sessionIDs("alice"), []string{sid}) {
		t.Fatalf("alice's own view past the drain's TTL: %s", av)
	}
	if !slices.Equal(av.Closes, []int{1012}) || aliceLink.Accepted() != 2 {
		t.Fatalf("alice's connection did not stay up on node 2: closes %v, %d connections", av.Closes, aliceLink.Accepted())
	}
	alice.noConsoleErrors()
	bob.noConsoleErrors()
}

func countOf(xs []string, x string) int {
	n := 0
	for _, y := range xs {
		if y == x {
			n++
		}
	}
	return n
}

// Big rooms in the browser: a page keeps a count room and a watch list
// beside its member view, against the real node. The count follows
// joins and the leave after the grace; the watch lists exactly the
// watched users who are present, and drops bob when he leaves.
func TestBrowserCountRoomAndWatchList(t *testing.T) {
	b := newBrowser(t)
	n := startDev(t)
	pg := newTestPage(t, n.addr)
	const room = "br-big"

	alice := b.open("alice", pg.url(link(t, n.addr), pageOpts{room: room, user: "alice"}), true)
	alice.waitSynced()
	alice.eval(`(() => {
		window.counter = client.room("br-big-count", { view: "count" });
		window.counts = [];
		counter.on("count", c => counts.push(c));
		window.dots = client.watch("br-big", ["bob", "carol"]);
		return true;
	})()`, nil)
	type big struct {
		Count   *int     `json:"count"`
		Watched []string `json:"watched"`
		Status  string   `json:"status"`
	}
	read := func() big {
		var v big
		alice.eval(`({ count: counter.count(), watched: dots.members().map(m => m.user), status: dots.status })`, &v)
		return v
	}
	waitBig := func(what string, cond func(big) bool) big {
		t.Helper()
		var v big
		testkit.CheckFor(t, brGrace+10*time.Second, 50*time.Millisecond, func() error {
			if v = read(); !cond(v) {
				return fmt.Errorf("%s: page has %+v", what, v)
			}
			return nil
		})
		return v
	}
	// The counter room counts alice's own session there.
	waitBig("count 1, nobody watched is here", func(v big) bool {
		return v.Count != nil && *v.Count == 1 && v.Status == "active" && len(v.Watched) == 0
	})
	bob := b.open("bob", pg.url(link(t, n.addr), pageOpts{room: room, user: "bob"}), true)
	bob.waitSynced()
	bob.eval(`(() => { client.room("br-big-count", { view: "count" }); return true; })()`, nil)
	waitBig("bob watched and counted", func(v big) bool {
		return v.Count != nil && *v.Count == 2 && slices.Equal(v.Watched, []string{"bob"})
	})
	bob.close()
	waitBig("bob gone after the grace", func(v big) bool {
		return v.Count != nil && *v.Count == 1 && len(v.Watched) == 0
	})
	alice.noConsoleErrors()
}

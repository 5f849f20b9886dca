package main

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/presence-dev/presence/internal/apitest"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testnats"
	"github.com/presence-dev/presence/internal/testredis"
)

// The aggregator's console, in real Chromium: two regions on a NATS
// supercluster, a --global node in each. It lists both regions live,
// both nodes (found over NATS across the gateways) and the global rooms
// by size, the numbers of the aggregator's HTTP API; a room's view is
// read from the API, as an aggregator has no WebSocket.
func TestBrowserConsoleGlobal(t *testing.T) {
	b := newBrowser(t)
	sc := testnats.StartSuperCluster(t, "a", "b")
	sc.WaitConnected(t, 10*time.Second)
	sc.WaitJetStream(t, 20*time.Second)
	regions := map[string]*env{}
	for _, name := range []string{"a", "b"} {
		rs := testredis.Start(t)
		regions[name] = &env{t: t, redis: rs.Addr, nats: sc.Server(name).ClientURL(), nc: sc.Connect(t, name)}
	}
	agg := regions["a"].start([]string{"aggregator", "--nats", sc.Server("a").ClientURL(), "--cadence", "300ms",
		"--regions", "a,b", "--listen", "127.0.0.1:0", "--api-keys", consoleKeys}, false)
	addr := waitAggregatorOK(t, agg)
	na := regions["a"].startNodeIn("a", "--global", "--global-cadence", "300ms")
	nb := regions["b"].startNodeIn("b", "--global", "--global-cadence", "300ms")
	dial(t, na.addr, "alice", "a1").join("lobby")
	dial(t, nb.addr, "bob", "b1").join("lobby")
	dial(t, nb.addr, "carol", "c1").join("lobby")
	dial(t, na.addr, "dave", "d1").join("kitchen")

	api := apitest.New(t, "http://"+addr, consoleAdmin)
	shots := newDemoShots(t, "console-global")
	url := "http://" + addr + "/console"
	checkLoginRefusals(t, b, url, shots)
	page := b.open("console", url, true)
	page.viewport(1280, 1200)
	consoleLogin(page, consoleAdmin)
	var want map[string]string
	testkit.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		want = roomCounts(t, api)
		return errors.Join(testkit.Want("lobby's count", want["lobby"], "3"), testkit.Want("kitchen's count", want["kitchen"], "1"))
	})
	v := waitConsole(t, page, 30*time.Second, "both regions live, both nodes, the rooms by size", func(v consoleView) bool {
		return slices.Equal(column(v.Regions, "region"), []string{"a", "b"}) && slices.Equal(column(v.Regions, "state"), []string{"live", "live"}) &&
			slices.Equal(column(v.Nodes, "region"), []string{"a", "b"}) && sameRooms(v, want) && v.Rooms[0]["room"] == "lobby"
	})
	if v.View != "global" || v.Regions[0]["heard"] == "never" {
		t.Fatalf("the page shows %s", v)
	}
	shots.take(page, "overview")

	page.click(`#rooms tr[data-room="lobby"]`)
	waitConsole(t, page, 15*time.Second, "lobby's members read from the API", func(v consoleView) bool {
		return len(v.Members) == 3 && v.Members[0].User == "alice" && v.Mode != "" && v.Mode[:6] == "polled"
	})
	erin := dial(t, na.addr, "erin", "e1")
	erin.join("lobby")
	waitConsole(t, page, 20*time.Second, "erin's join", func(v consoleView) bool {
		_, ok := v.member("erin")
		return ok && v.saw("join", "erin", "")
	})
	shots.take(page, "room")
	page.noConsoleErrors()
}

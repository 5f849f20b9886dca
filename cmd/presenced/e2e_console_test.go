package main

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/presence-dev/presence/internal/apitest"
)

// startConsoleNode runs a browser-timed node of region eu with the
// console's API keys.
func startConsoleNode(e *env) *proc {
	e.t.Helper()
	return e.start([]string{"node",
		"--region", "eu", "--redis", e.redis, "--nats", e.nats, "--listen", "127.0.0.1:0",
		"--jwt-secret", e2eSecret, "--api-keys", consoleKeys,
		"--session-ttl", brTTL.String(), "--heartbeat", brBeat.String(),
		"--offline-grace", brGrace.String(), "--reap-interval", brReap.String(),
		"--last-seen-interval", "2s", "--drain-timeout", "5s",
	}, true)
}

// The console of a node, in real Chromium: it refuses a wrong key and a
// read key, logs in with an admin key, lists the region, the node and
// the rooms by size with the API's numbers, follows a room live (joins,
// state changes, leaves; hostile state rendered as text), puts a user
// who reconnects with new session ids at the top of the flapping panel
// and one who blips inside the grace nowhere, and disconnects a user.
// No console errors. With PRESENCE_SCREENSHOTS=dir each step is saved.
func TestBrowserConsoleNode(t *testing.T) {
	b := newBrowser(t)
	n := startConsoleNode(newEnv(t))
	api := apitest.New(t, "http://"+n.addr, consoleAdmin)
	shots := newDemoShots(t, "console-node")
	url := "http://" + n.addr + "/console"
	checkLoginRefusals(t, b, url, shots)

	alice := dial(t, n.addr, "alice", "a1")
	alice.join("big")
	bob := dial(t, n.addr, "bob", "b1")
	bob.join("big")
	carol := dial(t, n.addr, "carol", "c1")
	carol.join("small")

	page := b.open("console", url, true)
	page.viewport(1280, 1400)
	consoleLogin(page, consoleAdmin)
	want := roomCounts(t, api)
	v := waitConsole(t, page, 15*time.Second, "the region, the node and the rooms by size", func(v consoleView) bool {
		return v.App && len(v.Regions) == 1 && len(v.Nodes) == 1 && sameRooms(v, want) && len(v.Rooms) >= 2 && v.Rooms[0]["room"] == "big"
	})
	if v.View != "eu" || v.Regions[0]["region"] != "eu" || v.Regions[0]["state"] != "live" || v.Nodes[0]["region"] != "eu" || v.Nodes[0]["state"] != "ok" {
		t.Fatalf("the page shows %s", v)
	}
	checkNodeNumbers(t, page, api)
	shots.take(page, "overview")

	consoleRoomLive(t, page, n.addr, alice, shots)
	consoleFlapping(t, page, api, n.addr, shots)

	page.click(`#members button[data-disconnect="bob"]`)
	if code := bob.closeCode(); code != 4003 {
		t.Fatalf("bob's connection closed with %d, want 4003 (disconnected)", code)
	}
	waitConsole(t, page, 15*time.Second, "the page saying bob was disconnected", func(v consoleView) bool {
		return strings.Contains(v.Action, "Disconnected bob")
	})
	shots.take(page, "disconnected")
	page.noConsoleErrors()
	_ = carol
}

// checkNodeNumbers: the node's row shows what /v1/nodes answers, once
// the figures hold still.
func checkNodeNumbers(t *testing.T, page *tab, api *apitest.Client) {
	t.Helper()
	var rep struct {
		Nodes []struct {
			ID          string `json:"id"`
			Connections int    `json:"connections"`
			Sessions    int    `json:"sessions"`
			Rooms       int    `json:"rooms"`
		} `json:"nodes"`
	}
	api.Get("/v1/nodes").JSON(t, &rep)
	if len(rep.Nodes) != 1 {
		t.Fatalf("/v1/nodes: %+v", rep)
	}
	nd := rep.Nodes[0]
	waitConsole(t, page, 15*time.Second, "the node's figures of /v1/nodes", func(v consoleView) bool {
		r := v.Nodes[0]
		return strings.HasPrefix(nd.ID, r["id"]) && r["connections"] == itoa(nd.Connections) && r["sessions"] == itoa(nd.Sessions) && r["rooms"] == itoa(nd.Rooms)
	})
	if nd.Sessions != 3 || nd.Rooms != 2 {
		t.Fatalf("/v1/nodes: %+v, want 3 sessions in 2 rooms", nd)
	}
}

// consoleRoomLive opens room big and follows dave's join, alice's state
// (hostile markup, shown as text) and dave's leave.
func consoleRoomLive(t *testing.T, page *tab, addr string, alice *client, shots *demoShots) {
	t.Helper()
	page.click(`#rooms tr[data-room="big"]`)
	waitConsole(t, page, 15*time.Second, "room big live with alice and bob", func(v consoleView) bool {
		_, a := v.member("alice")
		_, b := v.member("bob")
		return strings.HasPrefix(v.Mode, "live, open") && a && b && len(v.Members) == 2
	})
	dave := dial(t, addr, "dave", "d1")
	dave.join("big")
	waitConsole(t, page, 15*time.Second, "dave's join", func(v consoleView) bool {
		_, ok := v.member("dave")
		return ok && v.saw("join", "dave", "joined")
	})
	const hostile = `<img src=x onerror="document.title='owned'">`
	alice.send(map[string]any{"type": "state", "room": "big", "state": map[string]string{"status": hostile}, "ref": "s"})
	v := waitConsole(t, page, 15*time.Second, "alice's state", func(v consoleView) bool {
		m, _ := v.member("alice")
		return len(m.Sessions) == 1 && strings.Contains(m.Sessions[0].State, `<img src=x onerror=`) && v.saw("update", "alice", "state")
	})
	if v.Markup != 0 {
		t.Fatalf("the page made %d elements of a state: %s", v.Markup, v)
	}
	shots.take(page, "room-state")
	dave.send(map[string]any{"type": "leave", "room": "big", "ref": "l"})
	waitConsole(t, page, 20*time.Second, "dave's leave", func(v consoleView) bool {
		_, ok := v.member("dave")
		return !ok && v.saw("leave", "dave", "")
	})
	var title string
	page.eval(`document.title`, &title)
	if title != "presence console" {
		t.Fatalf("the hostile state ran: title %q", title)
	}
	shots.take(page, "room-leave")
}

// consoleFlapping: flappy reconnects with a new session id every second
// or so; blippy's connection drops and comes back with its session
// inside the grace. The panel lists flappy first, blippy nowhere.
func consoleFlapping(t *testing.T, page *tab, api *apitest.Client, addr string, shots *demoShots) {
	t.Helper()
	blippy := dial(t, addr, "blippy", "bl1")
	blippy.join("churn")
	prev := dial(t, addr, "flappy", "f0")
	prev.join("churn")
	for i := 1; i <= 4; i++ {
		next := dial(t, addr, "flappy", "f"+itoa(i))
		next.join("churn")
		prev.w.SendClose(websocket.CloseNormalClosure, "reconnect")
		prev = next
		if i == 2 {
			blippy.cut()
			blippy = dial(t, addr, "blippy", "bl1")
			blippy.join("churn")
		}
		time.Sleep(time.Second) // the pace of the reconnects, not a wait for an outcome
	}
	v := waitConsole(t, page, 30*time.Second, "flappy at the top of the flapping panel", func(v consoleView) bool {
		return len(v.Flappers) > 0 && v.Flappers[0]["user"] == "flappy" && atoi(v.Flappers[0]["flaps"]) >= 2
	})
	if slices.Contains(column(v.Flappers, "user"), "blippy") {
		t.Fatalf("blippy, who came back inside the grace, is listed: %s", v)
	}
	// Once the last departures are in, the page shows /v1/flapping's
	// figures for flappy.
	var rep struct {
		Users []struct {
			User               string `json:"user"`
			Transitions, Flaps int
		} `json:"users"`
	}
	waitConsole(t, page, 20*time.Second, "flappy's figures of /v1/flapping", func(v consoleView) bool {
		rep.Users = nil
		api.Get("/v1/flapping?limit=100").JSON(t, &rep)
		return len(rep.Users) > 0 && rep.Users[0].User == "flappy" && rep.Users[0].Flaps == 4 &&
			v.Flappers[0]["transitions"] == itoa(rep.Users[0].Transitions) && v.Flappers[0]["flaps"] == "4"
	})
	page.eval(`(() => { const s = document.getElementById("sort"); s.value = "churn"; s.dispatchEvent(new Event("change")); return true })()`, nil)
	waitConsole(t, page, 10*time.Second, "room churn first by churn", func(v consoleView) bool {
		return len(v.Rooms) > 0 && v.Rooms[0]["room"] == "churn"
	})
	page.eval(`(() => { const f = document.getElementById("filter"); f.value = "sma"; f.dispatchEvent(new Event("input")); return true })()`, nil)
	waitConsole(t, page, 10*time.Second, "the filter keeping room small alone", func(v consoleView) bool {
		return slices.Equal(column(v.Rooms, "room"), []string{"small"})
	})
	shots.take(page, "flapping")
	page.eval(`(() => { const f = document.getElementById("filter"); f.value = ""; f.dispatchEvent(new Event("input")); return true })()`, nil)
}

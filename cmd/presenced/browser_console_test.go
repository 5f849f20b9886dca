package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/presence-dev/presence/internal/apitest"
)

// The console's browser tests read the page's DOM, what an operator
// sees, through consoleProbe.

// Keys of the console tests.
const (
	consoleAdmin = "console-admin-secret-0123456789"
	consoleRead  = "console-read-secret-0123456789a"
	consoleKeys  = "ops:admin:" + consoleAdmin + ",viewer:read:" + consoleRead
)

// consoleView is what the page shows: each table's rows as their data
// attributes and cells by data-k, the room view's members and events.
type consoleView struct {
	Ready      bool                `json:"ready"`
	App        bool                `json:"app"`
	LoginError string              `json:"loginError"`
	View       string              `json:"view"`
	Refreshed  int64               `json:"refreshed"`
	Regions    []map[string]string `json:"regions"`
	Nodes      []map[string]string `json:"nodes"`
	Rooms      []map[string]string `json:"rooms"`
	Flappers   []map[string]string `json:"flappers"`
	FlapEvents string              `json:"flapEvents"`
	Mode       string              `json:"mode"`
	Members    []consoleMember     `json:"members"`
	Events     []consoleEvent      `json:"events"`
	Markup     int                 `json:"markup"` // elements in the app that no code of the page makes
	Status     string              `json:"status"`
	Action     string              `json:"action"` // what the last action did
}

type consoleMember struct {
	User     string `json:"user"`
	Sessions []struct {
		ID    string `json:"id"`
		State string `json:"state"`
	} `json:"sessions"`
}

type consoleEvent struct{ Type, User, Text string }

func (v consoleView) String() string { b, _ := json.Marshal(v); return string(b) }

// column lists one column of rows.
func column(rows []map[string]string, k string) []string {
	var out []string
	for _, r := range rows {
		out = append(out, r[k])
	}
	return out
}

func (v consoleView) member(user string) (consoleMember, bool) {
	for _, m := range v.Members {
		if m.User == user {
			return m, true
		}
	}
	return consoleMember{}, false
}

// saw reports whether the event stream has an event of type about user
// whose text holds text.
func (v consoleView) saw(typ, user, text string) bool {
	for _, e := range v.Events {
		if e.Type == typ && e.User == user && strings.Contains(e.Text, text) {
			return true
		}
	}
	return false
}

const consoleProbe = `(() => {
  const q = (s) => [...document.querySelectorAll(s)];
  const rows = (id) => q("#" + id + " tbody tr").map((tr) => {
    const o = { ...tr.dataset };
    for (const td of tr.querySelectorAll("td[data-k]")) o[td.dataset.k] = td.textContent;
    return o;
  });
  const card = document.getElementById("room-card");
  return {
    ready: document.body.dataset.ready === "1",
    app: !document.getElementById("app").hidden,
    loginError: document.getElementById("login-error").textContent,
    view: document.body.dataset.view || "",
    refreshed: +(document.body.dataset.refreshed || 0),
    regions: rows("regions"), nodes: rows("nodes"), rooms: rows("rooms"), flappers: rows("flappers"),
    flapEvents: document.getElementById("flap-overall").dataset.events || "",
    mode: card.dataset.mode || "",
    members: q("#members > li").map((li) => ({ user: li.dataset.user,
      sessions: [...li.querySelectorAll(".session")].map((s) => ({ id: s.dataset.session, state: s.querySelector("[data-k=state]").textContent })) })),
    events: q("#events li").map((li) => ({ type: li.dataset.type, user: li.dataset.user, text: li.textContent })).reverse(),
    markup: q("#app img, #app script, #app iframe, #app b, #app i").length,
    status: document.getElementById("status").textContent,
    action: document.getElementById("action").textContent,
  };
})()`

// waitConsole polls the page until cond holds of what it shows.
func waitConsole(t *testing.T, tb *tab, within time.Duration, what string, cond func(consoleView) bool) consoleView {
	t.Helper()
	v, err := pollPage(tb, consoleProbe, within, func(v consoleView) bool { return v.Ready && cond(v) })
	if err != nil {
		t.Fatalf("%s: waiting for %s: %v; the page shows %s", tb.name, what, err, v)
	}
	return v
}

// consoleLogin types key into the login form and submits it.
func consoleLogin(tb *tab, key string) {
	tb.t.Helper()
	waitConsole(tb.t, tb, 15*time.Second, "the login form", func(v consoleView) bool { return true })
	tb.eval(fmt.Sprintf(`(() => { document.getElementById("key").value = %q; document.getElementById("login").requestSubmit(); return true })()`, key), nil)
}

// checkLoginRefusals: a wrong key and a read key are refused with the
// reason, and the app stays hidden.
func checkLoginRefusals(t *testing.T, b *browser, url string, shots *demoShots) {
	t.Helper()
	for _, c := range []struct{ name, key, want string }{
		{"wrong-key", consoleAdmin + "x", "Unknown API key"},
		{"read-key", consoleRead, "scope is read"},
	} {
		tb := b.open(c.name, url, true)
		consoleLogin(tb, c.key)
		v := waitConsole(t, tb, 15*time.Second, "the refusal", func(v consoleView) bool { return v.LoginError != "" })
		if !strings.Contains(v.LoginError, c.want) || v.App {
			t.Fatalf("%s: the page says %q (app shown %v), want %q", c.name, v.LoginError, v.App, c.want)
		}
		shots.take(tb, "refused")
		tb.close()
	}
}

// roomCounts reads every room of the API's view, with its count.
func roomCounts(t *testing.T, api *apitest.Client) map[string]string {
	t.Helper()
	var rep struct {
		Rooms []struct {
			Room  string `json:"room"`
			Count int    `json:"count"`
		} `json:"rooms"`
	}
	api.Get("/v1/rooms?limit=1000").JSON(t, &rep)
	out := map[string]string{}
	for _, r := range rep.Rooms {
		out[r.Room] = strconv.Itoa(r.Count)
	}
	return out
}

// sameRooms reports whether the page lists exactly the API's rooms with
// its counts (rooms without members but with churn listed at 0 aside).
func sameRooms(v consoleView, api map[string]string) bool {
	n := 0
	for _, r := range v.Rooms {
		if r["count"] == "0" {
			continue
		}
		if api[r["room"]] != r["count"] {
			return false
		}
		n++
	}
	return n == len(api)
}

func itoa(n int) string { return strconv.Itoa(n) }

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }

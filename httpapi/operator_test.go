package httpapi

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/presence"
)

// withOps serves the operator endpoints for region eu: its detector fed
// from the fixture's NATS, tokens minted with an HS256 secret unless
// noMint.
func withOps(noMint bool) func(*Config) {
	return func(cfg *Config) {
		fl := bus.NewFlapping(0, 0, nil)
		cfg.Ops = &bus.Operations{View: "eu", Flapping: fl,
			Regions: func() []bus.RegionInfo { return []bus.RegionInfo{{Region: "eu", State: "live"}} }}
		if !noMint {
			cfg.Ops.Mint = func(user, room string, ttl time.Duration) (string, error) {
				return testkit.Token([]byte(strings.Repeat("s", 32)), user, []string{room}, ttl)
			}
		}
	}
}

// newOpsFixture is a fixture with the operator endpoints, their NATS
// being the fixture's.
func newOpsFixture(t *testing.T, noMint bool) *fixture {
	t.Helper()
	f := newFixture(t, withOps(noMint))
	sub, err := bus.FeedFlapping(f.nc, "eu", f.api.cfg.Ops.Flapping)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := f.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return f
}

var operatorPaths = []struct{ method, path, body string }{
	{"GET", "/v1/regions", ""}, {"GET", "/v1/nodes", ""}, {"GET", "/v1/flapping", ""},
	{"POST", "/v1/observer-token", `{"room":"lobby"}`},
}

// The operator endpoints take an admin key: none or a wrong one is a
// 401, a read key a 403.
func TestOperatorEndpointsNeedAnAdminKey(t *testing.T) {
	f := newOpsFixture(t, false)
	for _, p := range operatorPaths {
		for key, code := range map[string]int{"": 401, adminSecret + "x": 401, readSecret: 403} {
			f.read.With(key).Do(p.method, p.path, p.body, nil).Error(t, code)
		}
		if r := f.admin.Do(p.method, p.path, p.body, nil); r.Status != 200 {
			t.Errorf("%s %s with the admin key: %d %s", p.method, p.path, r.Status, r.Body)
		}
	}
	// Without operations (an API without a console) they are 404.
	g := newFixture(t)
	for _, p := range operatorPaths {
		g.admin.Do(p.method, p.path, p.body, nil).Error(t, 404)
	}
}

// Bad parameters and bodies are a 400 (or 413) with the reason; a server
// that signs nothing says so with 501.
func TestOperatorEndpointsRefuseBadInput(t *testing.T) {
	f := newOpsFixture(t, false)
	for path, want := range map[string]string{
		"/v1/flapping?limit=101":        "limit must be between 1 and 100",
		"/v1/flapping?limit=-1":         "limit must be between 1 and 100",
		"/v1/flapping?limit=x":          "limit must be an integer",
		"/v1/flapping?room=a%3Cb%3E":    "room:",
		"/v1/flapping?room=a&room=b":    "given 2 times",
		"/v1/flapping?since=1":          "unknown query parameter",
		"/v1/nodes?region=us":           "unknown query parameter",
		"/v1/regions?x=1":               "unknown query parameter",
		"/v1/observer-token?room=lobby": "unknown query parameter",
	} {
		method := "GET"
		if strings.HasPrefix(path, "/v1/observer-token") {
			method = "POST"
		}
		if _, msg := f.admin.Do(method, path, `{"room":"lobby"}`, nil).Error(t, 400); !strings.Contains(msg, want) {
			t.Errorf("%s: %q, want %q", path, msg, want)
		}
	}
	for body, want := range map[string]string{
		"":                        "empty body",
		`{"room":"<img src=x>"}`:  "room:",
		`{"room":"a","user":"b"}`: "unknown field",
		`{"room":"a"} {}`:         "data after",
		`[1]`:                     "bad request JSON",
	} {
		if _, msg := f.admin.Post("/v1/observer-token", body).Error(t, 400); !strings.Contains(msg, want) {
			t.Errorf("token body %q: %q, want %q", body, msg, want)
		}
	}
	f.admin.Post("/v1/observer-token", `{"room":"`+strings.Repeat("a", 70<<10)+`"}`).Error(t, 413)
	f.admin.Get("/v1/observer-token").Error(t, 405)
	g := newOpsFixture(t, true)
	if _, msg := g.admin.Post("/v1/observer-token", `{"room":"lobby"}`).Error(t, 501); !strings.Contains(msg, "mints no tokens") {
		t.Fatalf("no signer: %q", msg)
	}
}

// The observer token is for console-<key name>, the one room.
func TestObserverToken(t *testing.T) {
	f := newOpsFixture(t, false)
	var rep bus.ObserverTokenReply
	f.admin.Post("/v1/observer-token", `{"room":"lobby"}`).JSON(t, &rep)
	if rep.User != "console-ops" || rep.Room != "lobby" || strings.Count(rep.Token, ".") != 2 ||
		rep.ExpiresAt.Before(time.Now().Add(bus.ObserverTTL-time.Minute)) {
		t.Fatalf("token reply %+v", rep)
	}
}

// Every node of the view's region that answers on NATS is listed once,
// by id; those of another region are not.
func TestNodesAreFoundOverNATS(t *testing.T) {
	f := newOpsFixture(t, false)
	for _, n := range []bus.NodeInfo{{ID: "n2", Region: "eu", State: "ok", Connections: 7}, {ID: "n1", Region: "eu", State: "draining"}, {ID: "n1", Region: "eu", State: "draining"}, {ID: "x", Region: "us"}} {
		region := n.Region
		sub, err := bus.ServeNode(f.nc, region, func() bus.NodeInfo { return n })
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	_ = f.nc.Flush()
	var rep bus.NodesReply
	f.admin.Get("/v1/nodes").JSON(t, &rep)
	if len(rep.Nodes) != 2 || rep.Nodes[0].ID != "n1" || rep.Nodes[1].Connections != 7 || rep.Nodes[0].State != "draining" {
		t.Fatalf("nodes %+v", rep)
	}
}

// The flapping report counts the events the view's NATS carries.
func TestFlappingFromNATS(t *testing.T) {
	f := newOpsFixture(t, false)
	pub := func(i int, kind presence.Kind, reason presence.Reason) {
		b, err := bus.EncodeEvent(presence.Transition{ID: fmt.Sprint("e", i), Region: "eu", Room: "lobby", User: "flappy", Kind: kind, Reason: reason, At: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		if err := f.nc.Publish("presence.eu.lobby."+string(kind)+".flappy", b); err != nil {
			t.Fatal(err)
		}
	}
	pub(0, presence.Online, presence.Joined)
	for i := 1; i <= 4; i++ {
		pub(2*i, presence.Update, presence.Left)
		pub(2*i+1, presence.Update, presence.Joined)
	}
	_ = f.nc.Publish("presence.eu.lobby.online.x", []byte("not an event"))
	var rep bus.FlapReply
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		rep = bus.FlapReply{}
		f.admin.Get("/v1/flapping?room=lobby&limit=5").JSON(t, &rep)
		return testkit.Want("events counted", rep.Overall.Events, 9)
	})
	if len(rep.Users) != 1 || rep.Users[0].User != "flappy" || rep.Users[0].Flaps != 4 || rep.Region != "eu" {
		t.Fatalf("report %+v", rep)
	}
	var regions bus.RegionsReply
	f.admin.Get("/v1/regions").JSON(t, &regions)
	if len(regions.Regions) != 1 || regions.Regions[0].State != "live" {
		t.Fatalf("regions %+v", regions)
	}
}

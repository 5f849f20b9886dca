package httpapi

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/apitest"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testnats"
	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/region"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// Keys of the tests: secrets of MinSecretLen bytes and more.
const (
	readSecret  = "read-secret-0123456789abcdef"
	adminSecret = "admin-secret-0123456789abcdef"
	testKeys    = "reader:read:" + readSecret + ",ops:admin:" + adminSecret
)

// fixture is one region on a real redis-server and nats-server: its
// store, its micro service, the API on a real HTTP server in front of
// them, and what the region's nodes are told.
type fixture struct {
	t     testing.TB
	store *region.Store
	nc    *nats.Conn
	api   *API
	srv   *httptest.Server
	read  *apitest.Client
	admin *apitest.Client
	drops *testkit.Recorder[bus.Drop]
}

// longTiming outlasts a test or benchmark: nothing refreshes the
// fixture's sessions.
var longTiming = presence.Timing{SessionTTL: 10 * time.Minute, Heartbeat: 3 * time.Minute, OfflineGrace: time.Minute,
	ReapInterval: time.Second, LastSeenInterval: 3 * time.Minute}

func newFixture(t testing.TB, edit ...func(*Config)) *fixture {
	t.Helper()
	rdb, _ := testredis.Client(t)
	ns := testnats.Start(t)
	nc := testnats.Connect(t, ns)
	st, err := region.New(rdb, region.Options{Region: "eu", Timing: longTiming, Logger: quiet,
		Sink: region.SinkFunc(func(context.Context, []presence.Transition) (uint64, error) { return 0, nil })})
	if err != nil {
		t.Fatal(err)
	}
	q, err := bus.NewQuery("eu", st, bus.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	d, err := bus.NewRegionDisconnect(nc, "eu", st, bus.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := bus.StartService(nc, "eu", st, bus.WithDisconnect(d), bus.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	keys, err := NewKeys(testKeys, "", quiet)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Query: q, Disconnect: d, Keys: keys, Rate: -1, Logger: quiet}
	for _, e := range edit {
		e(&cfg)
	}
	if cfg.Ops != nil && cfg.Ops.NATS == nil {
		cfg.Ops.NATS = nc
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	a.Mount(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	f := &fixture{t: t, store: st, nc: nc, api: a, srv: srv, drops: &testkit.Recorder[bus.Drop]{},
		read: apitest.New(t, srv.URL, readSecret), admin: apitest.New(t, srv.URL, adminSecret)}
	watcher := testnats.Connect(t, ns)
	if _, err := bus.SubscribeDrops(watcher, "eu", func(d bus.Drop) { f.drops.Add(d) }); err != nil {
		t.Fatal(err)
	}
	if err := watcher.Flush(); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) claim(refs ...presence.SessionRef) {
	f.t.Helper()
	if _, err := f.store.Claim(context.Background(), refs); err != nil {
		f.t.Fatal(err)
	}
}

// micro asks the region's micro service, the other transport of the same
// answers, and decodes the reply into out.
func (f *fixture) micro(subject, body string, out any) {
	f.t.Helper()
	m, err := f.nc.Request(subject, []byte(body), 5*time.Second)
	if err != nil {
		f.t.Fatal(err)
	}
	(&apitest.Response{Status: 200, Body: m.Data}).JSON(f.t, out)
}

// clock is a settable clock for the rate limits.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func ref(room, user, session string) presence.SessionRef {
	return presence.SessionRef{Room: room, User: user, Session: session}
}

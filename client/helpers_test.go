package client

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/nats-io/nats.go"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testnats"
	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/node"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/region"
)

// A grace long enough for a reconnect on a loaded machine to land inside
// it, short enough for a test to wait it out.
var testTiming = presence.Timing{
	SessionTTL:       6 * time.Second,
	Heartbeat:        time.Second,
	OfflineGrace:     4 * time.Second,
	ReapInterval:     100 * time.Millisecond,
	LastSeenInterval: time.Second,
}

var testSecret = []byte("0123456789abcdef0123456789abcdef-client")

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// env is a real redis-server, nats-server and node behind an HTTP server,
// with a NATS recorder of every transition.
type env struct {
	t     *testing.T
	store *region.Store
	node  *node.Node
	srv   *httptest.Server
	rec   *testkit.Log
}

func newEnv(t *testing.T, edit ...func(*node.Config)) *env {
	t.Helper()
	rdb, _ := testredis.Client(t)
	ns := testnats.Start(t)
	pub := testnats.Connect(t, ns)
	sink := region.SinkFunc(func(_ context.Context, ts []presence.Transition) (uint64, error) {
		for _, tr := range ts {
			b, err := bus.EncodeEvent(tr)
			if err != nil {
				return 0, err
			}
			if err := pub.Publish(bus.EventSubject(tr), b); err != nil {
				return 0, err
			}
		}
		return 0, pub.Flush()
	})
	st, err := region.New(rdb, region.Options{Region: "eu", Timing: testTiming, Sink: sink, PublishLease: 500 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	st.Start()
	t.Cleanup(st.Close)
	e := &env{t: t, store: st, rec: &testkit.Log{}}
	e.record(testnats.Connect(t, ns))
	cfg := node.Config{
		Region: "eu", Store: st, NATS: testnats.Connect(t, ns),
		Auth:           node.AuthConfig{HMACSecret: testSecret},
		Limits:         node.Limits{PingInterval: 500 * time.Millisecond, PongTimeout: time.Second, CloseTimeout: 500 * time.Millisecond},
		HeartbeatSlots: 5, StoreTimeout: time.Second, Logger: quiet,
	}
	for _, f := range edit {
		f(&cfg)
	}
	n, err := node.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.srv = httptest.NewUnstartedServer(n.Handler())
	e.srv.Listener = node.WrapListener(e.srv.Listener)
	e.srv.Config.ConnState = n.ConnState
	e.srv.Start()
	e.node = n
	t.Cleanup(func() { _ = n.Close(); e.srv.Close() })
	return e
}

func (e *env) record(nc *nats.Conn) {
	if _, err := nc.Subscribe(bus.Root+".>", func(m *nats.Msg) {
		if tr, err := bus.DecodeEvent(m.Data); err == nil {
			e.rec.Add(tr)
		}
	}); err != nil {
		e.t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		e.t.Fatal(err)
	}
}

// tokens is a token source for user, signing a fresh token on every call.
func tokens(user string, observe bool, ttl time.Duration) func(context.Context) (string, error) {
	return func(context.Context) (string, error) {
		c := node.Claims{Rooms: []string{"*"}, Observe: observe, RegisteredClaims: jwt.RegisteredClaims{
			Subject: user, ExpiresAt: jwt.NewNumericDate(time.Now().Add(ttl))}}
		return jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(testSecret)
	}
}

// errs collects what a client's OnError and OnDisconnect are told.
type errs struct {
	mu          sync.Mutex
	errors      []error
	disconnects []error
}

func (x *errs) onError(err error) { x.mu.Lock(); x.errors = append(x.errors, err); x.mu.Unlock() }
func (x *errs) onDisconnect(err error) {
	x.mu.Lock()
	x.disconnects = append(x.disconnects, err)
	x.mu.Unlock()
}

func (x *errs) all() (errors, disconnects []error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	return slices.Clone(x.errors), slices.Clone(x.disconnects)
}

// dial connects user with a fresh token per connect and the session id.
func (e *env) dial(user, session string, x *errs) *Client {
	e.t.Helper()
	cfg := Config{URL: e.srv.URL, Token: tokens(user, true, time.Hour), Session: session}
	if x != nil {
		cfg.OnError, cfg.OnDisconnect = x.onError, x.onDisconnect
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, cfg)
	if err != nil {
		e.t.Fatalf("Dial %s: %v", user, err)
	}
	e.t.Cleanup(func() { _ = c.Close() })
	return c
}

// testCtx bounds a test's calls: generous, for a loaded machine.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// project is snap as a view at the given detail shows it.
func project(snap presence.Snapshot, sessions bool) string {
	v := newView(sessions)
	v.reset(&snap, nil)
	return render(v.list())
}

func render(ms []Member) string {
	var b strings.Builder
	for _, m := range ms {
		fmt.Fprintf(&b, "%s{", m.User)
		for _, s := range m.Sessions {
			fmt.Fprintf(&b, "%s=%s ", s.ID, s.State)
		}
		b.WriteString("} ")
	}
	return b.String()
}

// changes records a view's changes.
type changes struct {
	mu  sync.Mutex
	all []Change
}

func (c *changes) add(ch Change) { c.mu.Lock(); c.all = append(c.all, ch); c.mu.Unlock() }

func (c *changes) events() []presence.Transition {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ts []presence.Transition
	for _, ch := range c.all {
		if ch.Kind == Applied {
			ts = append(ts, ch.Event)
		}
	}
	return ts
}

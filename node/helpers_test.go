package node

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/gorilla/websocket"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testnats"
	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
	"github.com/presence-dev/presence/region"
)

// Short timing for integration tests against real servers.
var testTiming = testkit.Timing

var testSecret = []byte("0123456789abcdef0123456789abcdef-test")

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// env is one test's Redis, NATS, event recorder and a store of its own
// (standing for another process) to place markers with.
type env struct {
	t     *testing.T
	rdb   *redis.Client
	rs    *testredis.Server
	ns    *server.Server
	sink  region.Sink
	store *region.Store
	rec   *recorder
	marks atomic.Int64
}

// natsSink publishes each transition on core NATS, standing in for the
// JetStream publisher.
func natsSink(nc *nats.Conn) region.Sink {
	return region.SinkFunc(func(_ context.Context, ts []presence.Transition) (uint64, error) {
		for _, t := range ts {
			b, err := bus.EncodeEvent(t)
			if err != nil {
				return 0, err
			}
			if err := nc.Publish(bus.EventSubject(t), b); err != nil {
				return 0, err
			}
		}
		return 0, nc.Flush()
	})
}

func newEnv(t *testing.T) *env {
	t.Helper()
	rdb, rs := testredis.Client(t)
	ns := testnats.Start(t)
	e := &env{t: t, rdb: rdb, rs: rs, ns: ns, sink: natsSink(testnats.Connect(t, ns))}
	e.rec = newRecorder(t, testnats.Connect(t, ns))
	e.store = e.newStore()
	return e
}

func (e *env) newStore() *region.Store {
	e.t.Helper()
	s, err := region.New(e.rdb, region.Options{Region: "eu", Timing: testTiming, Sink: e.sink, PublishLease: 500 * time.Millisecond, Logger: quiet})
	if err != nil {
		e.t.Fatalf("region.New: %v", err)
	}
	return s
}

// runReaper runs st's reaper until the test ends, as the node's process
// does beside it.
func (e *env) runReaper(st *region.Store) {
	st.Start()
	e.t.Cleanup(st.Close)
}

func testConfig(st Store, nc *nats.Conn) Config {
	return Config{
		Region: "eu", Store: st, NATS: nc,
		Auth:           AuthConfig{HMACSecret: testSecret},
		Limits:         Limits{PingInterval: 200 * time.Millisecond, PongTimeout: 300 * time.Millisecond, CloseTimeout: 500 * time.Millisecond},
		HeartbeatSlots: 5,
		StoreTimeout:   time.Second,
		Logger:         quiet,
	}
}

// node is a started Node behind a test HTTP server.
type node struct {
	*Node
	srv   *httptest.Server
	store *region.Store
}

// newNode starts a node with its own store (as another process would
// have) on the env's Redis and its own NATS connection.
func (e *env) newNode(edit ...func(*Config)) *node {
	e.t.Helper()
	return e.newNodeOn(e.newStore(), edit...)
}

// newNodeOn starts a node on st, whose reaper runs beside it, with its
// own NATS connection.
func (e *env) newNodeOn(st *region.Store, edit ...func(*Config)) *node {
	e.t.Helper()
	cfg := testConfig(st, testnats.Connect(e.t, e.ns))
	for _, f := range edit {
		f(&cfg)
	}
	n, err := New(cfg)
	if err != nil {
		e.t.Fatalf("New: %v", err)
	}
	if err := n.Start(context.Background()); err != nil {
		e.t.Fatalf("Start: %v", err)
	}
	e.runReaper(st)
	srv := newTestServer(n)
	e.t.Cleanup(func() { _ = n.Close(); srv.Close() })
	return &node{Node: n, srv: srv, store: st}
}

// newTestServer serves n's Handler as presenced serves it: on a batching
// listener, with the node's connection guard.
func newTestServer(n *Node) *httptest.Server {
	srv := httptest.NewUnstartedServer(n.Handler())
	srv.Listener = WrapListener(srv.Listener)
	srv.Config.ConnState = n.ConnState
	srv.Start()
	return srv
}

func (n *node) wsURL(query string) string {
	return "ws" + strings.TrimPrefix(n.srv.URL, "http") + PathWebSocket + "?" + query
}

// token signs an HS256 token with the test secret.
func token(t testing.TB, user string, rooms []string, ttl time.Duration) string {
	t.Helper()
	c := Claims{Rooms: rooms, RegisteredClaims: jwt.RegisteredClaims{Subject: user, ExpiresAt: jwt.NewNumericDate(time.Now().Add(ttl))}}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(testSecret)
	if err != nil {
		t.Fatalf("sign: %v", err)
	}
	return s
}

// frame is any server frame (protocol.Frame), with its event decoded and
// its snapshot as a value, as the tests read them.
type frame struct {
	protocol.Frame
	Snapshot presence.Snapshot `json:"snapshot"`
	Event    bus.Event         `json:"event"`
	raw      string
}

// client is a test WebSocket client (see testkit.WS) reading typed
// frames; its end is the reader's error.
type client struct {
	t      *testing.T
	w      *testkit.WS[frame]
	ws     *websocket.Conn
	frames <-chan frame // closed at the end
	hello  frame
}

// dialRaw performs a handshake only (see testkit.DialRaw).
var dialRaw = testkit.DialRaw

// decodeFrame keeps every message: one that is not JSON becomes a frame
// of type "!unparsable", for the test to see.
func decodeFrame(b []byte) (frame, bool) {
	var f frame
	if err := json.Unmarshal(b, &f); err != nil {
		f.Type = "!unparsable"
	}
	f.raw = string(b)
	return f, true
}

// dial connects with a bearer token and reads the hello frame.
func (n *node) dial(t *testing.T, tok, session string) *client {
	t.Helper()
	h := http.Header{}
	h.Set("Authorization", "Bearer "+tok)
	return n.dialWith(t, "session="+session, h)
}

func (n *node) dialWith(t *testing.T, query string, h http.Header) *client {
	t.Helper()
	w := testkit.DialWS(t, n.wsURL(query), h, decodeFrame)
	c := &client{t: t, w: w, ws: w.Conn, frames: w.Frames}
	c.hello = c.expect("hello")
	return c
}

// in returns c for subtest t: the same connection and frames, with
// failures reported to t. Subtests using it run one after another.
func (c *client) in(t *testing.T) *client {
	cc := *c
	cc.t = t
	cc.w = c.w.In(t)
	return &cc
}

func (c *client) send(v any) {
	c.t.Helper()
	c.w.Send(v)
}

func (c *client) sendRaw(mt int, b []byte) {
	c.t.Helper()
	c.w.SendRaw(mt, b)
}

// next returns the next frame, failing the test after 5s.
func (c *client) next() frame {
	c.t.Helper()
	return c.w.Next(5 * time.Second)
}

// expect returns the next frame, which must be of type typ.
func (c *client) expect(typ string) frame {
	c.t.Helper()
	f := c.next()
	if f.Type != typ {
		c.t.Fatalf("got frame %s, want type %q", f.raw, typ)
	}
	return f
}

// expectError returns the next frame, which must be an error with code.
func (c *client) expectError(code protocol.ErrorCode, ref string) frame {
	c.t.Helper()
	f := c.expect("error")
	if f.Code != code || f.Ref != ref || f.Message == "" {
		c.t.Fatalf("got error %s, want code %q ref %q and a message", f.raw, code, ref)
	}
	return f
}

// replyAndOwnEvent reads a reply and the event the request caused for
// the client itself, which may come in either order; it returns the reply.
func (c *client) replyAndOwnEvent(reply string, kind presence.Kind) frame {
	c.t.Helper()
	var r frame
	gotEvent := false
	for r.Type == "" || !gotEvent {
		f := c.next()
		switch {
		case f.Type == reply && r.Type == "":
			r = f
		case f.Type == "event" && f.Event.Kind == kind && !gotEvent:
			gotEvent = true
		default:
			c.t.Fatalf("got %s, want a %s reply and a %s event", f.raw, reply, kind)
		}
	}
	return r
}

// join joins a room with detail "sessions" and returns its snapshot frame.
func (c *client) join(room string) frame {
	c.t.Helper()
	return c.joinDetail(room, protocol.DetailSessions)
}

// joinDetail joins a room at the given detail ("" for the default).
func (c *client) joinDetail(room, detail string) frame {
	c.t.Helper()
	req := map[string]string{"type": "join", "room": room, "ref": "j-" + room}
	if detail != "" {
		req["detail"] = detail
	}
	c.send(req)
	f := c.expect("snapshot")
	if f.Ref != "j-"+room || f.Room != room || f.Reason != "join" {
		c.t.Fatalf("join reply: %s", f.raw)
	}
	return f
}

// ping round-trips an application ping: the connection is alive and every
// frame before has been handled.
func (c *client) ping() {
	c.t.Helper()
	c.send(map[string]string{"type": "ping", "ref": "p"})
	if f := c.expect("pong"); f.Ref != "p" {
		c.t.Fatalf("pong: %s", f.raw)
	}
}

// closeNormally sends a close frame and waits for the end.
func (c *client) closeNormally() {
	c.t.Helper()
	c.w.SendClose(websocket.CloseNormalClosure, "bye")
	_ = c.waitEnd() // the close code is the caller's to check, if it cares
}

// waitEnd waits for the connection to end and returns the reader error,
// skipping frames still queued.
func (c *client) waitEnd() error {
	c.t.Helper()
	_, err := c.w.End(10 * time.Second)
	return err
}

// expectClose waits for the end and checks the close code.
func (c *client) expectClose(code int) {
	c.t.Helper()
	err := c.waitEnd()
	if !websocket.IsCloseError(err, code) {
		c.t.Fatalf("connection ended with %v, want close code %d", err, code)
	}
}

// recorder records every transition published on presence.>.
type recorder struct{ testkit.Log }

func newRecorder(t *testing.T, nc *nats.Conn) *recorder {
	t.Helper()
	r := &recorder{}
	_, err := nc.Subscribe(bus.Root+".>", func(m *nats.Msg) {
		tr, err := bus.DecodeEvent(m.Data)
		if err != nil {
			t.Errorf("recorder: %v", err)
			return
		}
		r.Add(tr)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return r
}

// slow skips, under -short, a test that waits on real timers (TTLs,
// grace, token expiry, pings) or runs for seconds, so that
// go test -short ./node is a fast loop.
func slow(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("slow: waits on real timers; run without -short")
	}
}

func (e *env) redisNow() time.Time {
	e.t.Helper()
	t, err := e.rdb.Time(context.Background()).Result()
	if err != nil {
		e.t.Fatalf("TIME: %v", err)
	}
	return t
}

// waitRedisPast waits until Redis's clock, which scores every entry, is
// past at.
func (e *env) waitRedisPast(at time.Time) {
	e.t.Helper()
	testredis.WaitPast(e.t, e.rdb, at)
}

// quiesce makes the recorder complete for room: a marker session joins
// (its touch first settles every departure already due, so those are
// numbered before it), then quiesce waits until every transition of the
// room up to the marker's has been recorded. Anything not recorded by
// then was not due.
func (e *env) quiesce(room string) {
	e.t.Helper()
	user := fmt.Sprintf("zz-marker-%d", e.marks.Add(1))
	res, err := e.store.Claim(context.Background(), []presence.SessionRef{{Room: room, User: user, Session: "m"}})
	ts := res.Transitions
	if err != nil || len(ts) == 0 {
		e.t.Fatalf("marker touch: %v %v", ts, err)
	}
	upto := ts[len(ts)-1].Seq
	testkit.CheckFor(e.t, 5*time.Second, 10*time.Millisecond, func() error {
		seen := map[uint64]bool{}
		for _, t := range e.rec.All() {
			if t.Room == room {
				seen[t.Seq] = true
			}
		}
		for s := uint64(1); s <= upto; s++ {
			if !seen[s] {
				return fmt.Errorf("transition %d of %s (of 1..%d, the marker's last) not recorded", s, room, upto)
			}
		}
		return nil
	})
}

// live reports the user's live sessions in room, per Redis.
func (e *env) live(room, user string) []string {
	e.t.Helper()
	m, ok, err := e.store.Sessions(context.Background(), room, user)
	if err != nil {
		e.t.Fatalf("Sessions: %v", err)
	}
	if !ok {
		return nil
	}
	// A released session stays listed through its grace; a held one has
	// an entry ending with its holder's code, bytes that no id holds
	// (region/doc.go).
	held, err := e.rdb.ZRange(context.Background(), "presence:{"+room+"}:s", 0, -1).Result()
	if err != nil {
		e.t.Fatalf("session entries: %v", err)
	}
	var ids []string
	for _, s := range m.Sessions {
		p := user + ":" + s.ID
		if slices.ContainsFunc(held, func(m string) bool {
			return strings.HasPrefix(m, p) && len(m) > len(p) && presence.ValidateSession(m[len(p):len(p)+1]) != nil
		}) {
			ids = append(ids, s.ID)
		}
	}
	return ids
}

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/nats-io/nats.go"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testnats"
	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
)

// binary is the presenced built once for the end-to-end tests.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "presenced-e2e-")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "presenced")
	out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build presenced: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// Short timing for the end-to-end tests.
const (
	e2eTTL   = 3 * time.Second
	e2eGrace = 2 * time.Second
	e2eReap  = 200 * time.Millisecond
	e2eBeat  = time.Second
)

const e2eSecret = "0123456789abcdef0123456789abcdef-e2e"

// env is one region: a redis-server, a nats-server, nodes started on demand.
type env struct {
	t     testing.TB
	redis string
	nats  string
	nc    *nats.Conn
}

func newEnv(t *testing.T) *env {
	t.Helper()
	rs := testredis.Start(t)
	ns := testnats.Start(t)
	return &env{t: t, redis: rs.Addr, nats: ns.ClientURL(), nc: testnats.Connect(t, ns)}
}

// proc is a running presenced.
type proc struct {
	cmd  *exec.Cmd
	addr string
	out  *testkit.LockedBuffer
	done chan struct{}
	err  error
}

// startNode runs `presenced node` against e and waits until it is healthy.
func (e *env) startNode(extra ...string) *proc {
	e.t.Helper()
	return e.startNodeIn("eu", extra...)
}

// startNodeIn runs a node of the given region.
func (e *env) startNodeIn(region string, extra ...string) *proc {
	e.t.Helper()
	return e.start(e.nodeArgs(region, extra...), true)
}

// nodeArgs are the arguments of a node of region with the tests' timing.
func (e *env) nodeArgs(region string, extra ...string) []string {
	return append([]string{"node",
		"--region", region, "--redis", e.redis, "--nats", e.nats, "--listen", "127.0.0.1:0",
		"--jwt-secret", e2eSecret,
		"--session-ttl", e2eTTL.String(), "--heartbeat", e2eBeat.String(),
		"--offline-grace", e2eGrace.String(), "--reap-interval", e2eReap.String(),
		"--last-seen-interval", "2s", "--drain-timeout", "5s",
	}, extra...)
}

// listening matches the line a node logs once its listener is bound; the
// tests listen on port 0 and read the address from it, so no port is
// picked by one process and bound by another.
var listening = regexp.MustCompile(`msg="presenced: listening" addr=(\S+)`)

// start runs presenced with args; health, when set, waits for the node
// to log its address and for that address's /healthz.
func (e *env) start(args []string, health bool) *proc {
	e.t.Helper()
	return e.startEnv(args, nil, health)
}

// startEnv is start with environment variables added to the test's.
func (e *env) startEnv(args, environ []string, health bool) *proc {
	e.t.Helper()
	return e.startBin(binary, args, environ, health)
}

// startBin is startEnv with another build of presenced.
func (e *env) startBin(bin string, args, environ []string, health bool) *proc {
	e.t.Helper()
	cmd := exec.Command(bin, args...)
	if environ != nil {
		cmd.Env = append(os.Environ(), environ...)
	}
	out := &testkit.LockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	p := &proc{cmd: cmd, out: out, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	e.t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
		if e.t.Failed() {
			e.t.Logf("%s output:\n%s", args[0], out.String())
		}
	})
	if !health {
		return p
	}
	testkit.CheckFor(e.t, 15*time.Second, 10*time.Millisecond, func() error {
		select {
		case <-p.done:
			e.t.Fatalf("node exited: %v\n%s", p.err, out.String())
		default:
		}
		if p.addr == "" {
			m := listening.FindStringSubmatch(out.String())
			if m == nil {
				return errors.New("no listening line in the node's log yet")
			}
			p.addr = m[1]
		}
		r, err := http.Get("http://" + p.addr + "/healthz")
		if err != nil {
			return fmt.Errorf("the node's health: %w", err)
		}
		r.Body.Close()
		return testkit.Want("the node's health", r.StatusCode, http.StatusOK)
	})
	return p
}

// exit waits for the process to end and returns its exit code.
func (p *proc) exit(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(within):
		t.Fatalf("node did not exit within %v", within)
	}
	if ee, ok := p.err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	return 0
}

func (p *proc) signal(s syscall.Signal) { _ = p.cmd.Process.Signal(s) }

// token signs an HS256 client token for user with the given rooms claim.
func token(t *testing.T, user string, rooms ...string) string {
	t.Helper()
	s, err := testkit.Token([]byte(e2eSecret), user, rooms, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// client is a WebSocket client of a node (see testkit.WS) reading
// frames as maps.
type client struct {
	t      *testing.T
	user   string
	sess   string
	w      *testkit.WS[map[string]any]
	ws     *websocket.Conn
	frames <-chan map[string]any // closed at the end
}

func dial(t *testing.T, addr, user, session string, rooms ...string) *client {
	t.Helper()
	if len(rooms) == 0 {
		rooms = []string{"*"}
	}
	return dialURL(t, fmt.Sprintf("ws://%s/v1/ws?session=%s&access_token=%s", addr, session, token(t, user, rooms...)), user, session)
}

// dialURL connects to a WebSocket URL and reads the hello frame.
func dialURL(t *testing.T, u, user, session string) *client {
	t.Helper()
	return newClient(t, testkit.DialWS(t, u, nil, decodeMap), user, session)
}

// newClient is the client of user's session on w; it reads the hello
// frame.
func newClient(t *testing.T, w *testkit.WS[map[string]any], user, session string) *client {
	t.Helper()
	c := &client{t: t, user: user, sess: session, w: w, ws: w.Conn, frames: w.Frames}
	c.expect("hello")
	return c
}

// decodeMap drops a message that is not JSON.
func decodeMap(b []byte) (map[string]any, bool) {
	var f map[string]any
	return f, json.Unmarshal(b, &f) == nil
}

func (c *client) send(v any) {
	c.t.Helper()
	c.w.Send(v)
}

// expect returns the next frame of the given type, skipping others.
func (c *client) expect(typ string) map[string]any {
	c.t.Helper()
	return c.w.Await(10*time.Second, fmt.Sprintf("%s/%s's %q frame", c.user, c.sess, typ), func(f map[string]any) bool {
		return f["type"] == typ
	})
}

func (c *client) join(room string) map[string]any {
	c.t.Helper()
	c.send(map[string]any{"type": "join", "room": room, "ref": "j-" + room})
	for {
		f := c.expect2("snapshot", "error")
		if f["type"] == "error" {
			c.t.Fatalf("join %s: %v", room, f)
		}
		if f["ref"] == "j-"+room {
			return f
		}
	}
}

// expect2 returns the next frame of either type.
func (c *client) expect2(a, b string) map[string]any {
	c.t.Helper()
	return c.w.Await(10*time.Second, fmt.Sprintf("a %q or %q frame", a, b), func(f map[string]any) bool {
		return f["type"] == a || f["type"] == b
	})
}

// cut drops the TCP connection without a close frame, as a network does.
func (c *client) cut() { _ = c.ws.UnderlyingConn().Close() }

// closeCode waits for the server to close the connection and returns
// its close code (-1 without a close frame).
func (c *client) closeCode() int {
	c.t.Helper()
	code, _ := c.w.End(10 * time.Second) // the code says how it ended
	return code
}

// watcher is a plain NATS subscriber on presence.>.
type watcher struct{ testkit.Log }

func (e *env) watch() *watcher {
	e.t.Helper()
	w := &watcher{}
	sub, err := e.nc.Subscribe("presence.>", func(m *nats.Msg) {
		t, err := bus.DecodeEvent(m.Data)
		if err != nil {
			e.t.Errorf("undecodable event on %s: %v", m.Subject, err)
			return
		}
		w.Add(t)
	})
	if err != nil {
		e.t.Fatal(err)
	}
	if err := e.nc.Flush(); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = sub.Unsubscribe() })
	return w
}

func (w *watcher) count(kind presence.Kind, user string) int {
	n := 0
	for _, t := range w.All() {
		if t.Kind == kind && (user == "" || t.User == user) {
			n++
		}
	}
	return n
}

// pastGrace waits until a departure started at from would have been
// announced (grace plus a few reap intervals): the window in which a
// test asserts that nothing was.
func pastGrace(from time.Time) { time.Sleep(time.Until(from.Add(e2eGrace + 5*e2eReap))) }

// skipIfShort skips a slow end-to-end test under -short, the fast loop
// (make test-short); the full suite runs it.
func skipIfShort(t *testing.T, what string) {
	t.Helper()
	if testing.Short() {
		t.Skip(what + "; skipped with -short")
	}
}

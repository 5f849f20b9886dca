package node

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/nats-io/nats.go"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testnats"
	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
	"github.com/presence-dev/presence/region"
)

// The idle-connection memory guard. A node holds thousands of idle
// connections; what each costs is the figure docs/BENCHMARKS.md records
// ("Edge node: idle sessions"). The clients run in a child process (this
// test binary again), so the heap measured is the node's alone.

const (
	// idleClientsEnv, when set, makes TestIdleConnectionMemory the
	// clients' process: its value is the idleSpec, as JSON.
	idleClientsEnv = "PRESENCE_IDLE_CLIENTS"
	// idleConnsEnv overrides how many connections the guard opens, and
	// idleHeapEnv names a file for a heap profile taken with them open:
	// the same test then profiles 15,000 connections.
	idleConnsEnv = "PRESENCE_IDLE_CONNS"
	idleHeapEnv  = "PRESENCE_IDLE_HEAP"
	idleReady    = "idle-clients-ready"
	idlePerRoom  = 100 // as scripts/load.sh idle
	idleConns    = 2000
)

// Bounds, per idle connection (each one session in a room of 100, a JWT
// with its expiry timer), about 25 % over what this test measured when
// they were set, with and without -race: heap 4.2-4.6 KiB; the reader
// goroutine's stack 4.1-4.4 KiB (one 4 KiB stack: it was 8 KiB when the
// reader parked on the stack its joins had grown, conn.read).
const (
	maxIdleHeapPerConn  = 5632
	maxIdleStackPerConn = 5376
)

type idleSpec struct {
	URL   string `json:"url"`
	Conns int    `json:"conns"`
}

func TestIdleConnectionMemory(t *testing.T) {
	if spec := os.Getenv(idleClientsEnv); spec != "" {
		runIdleClients(t, spec)
		return
	}
	conns := idleConns
	if s := os.Getenv(idleConnsEnv); s != "" {
		var err error
		if conns, err = strconv.Atoi(s); err != nil || conns < 1 {
			t.Fatalf("%s=%q: want a positive number", idleConnsEnv, s)
		}
	}
	n, nc := idleNode(t)
	// Each join is a new user's online: once all are on NATS, the node
	// holds no backlog of them (counted, not kept: the count is in the
	// heap measured).
	var onlines atomic.Int64
	sub, err := nc.Subscribe(bus.Root+".>", func(m *nats.Msg) {
		if tr, err := bus.DecodeEvent(m.Data); err == nil && tr.Kind == presence.Online {
			onlines.Add(1)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	before := settledMem(t, runtime.NumGoroutine())
	goroutines := runtime.NumGoroutine()

	child := startIdleClients(t, idleSpec{URL: n.wsURL(""), Conns: conns})
	testkit.CheckFor(t, 60*time.Second, 10*time.Millisecond, func() error {
		return testkit.Want("connections the node counts", n.counts.open.Load(), int64(conns))
	})
	testkit.CheckFor(t, 60*time.Second, 10*time.Millisecond, func() error {
		return testkit.AtLeast("onlines on NATS", onlines.Load(), int64(conns))
	})
	// Each connection's reader stays; the writers that sent its hello,
	// its snapshot and its room's events exit once their queue is empty.
	after := settledMem(t, goroutines+conns)
	if path := os.Getenv(idleHeapEnv); path != "" {
		writeHeapProfile(t, path)
	}
	child.stop(t)

	heap := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(conns)
	stack := float64(int64(after.StackInuse)-int64(before.StackInuse)) / float64(conns)
	t.Logf("%d idle connections: heap %.2f KiB, stack %.2f KiB a connection (bounds %.2f, %.2f KiB)",
		conns, heap/1024, stack/1024, float64(maxIdleHeapPerConn)/1024, float64(maxIdleStackPerConn)/1024)
	if heap > maxIdleHeapPerConn {
		t.Errorf("heap per idle connection %.0f B, over the bound of %d B: something now holds memory for every connection (profile it: %s=15000 %s=heap.out)",
			heap, maxIdleHeapPerConn, idleConnsEnv, idleHeapEnv)
	}
	if stack > maxIdleStackPerConn {
		t.Errorf("stack per idle connection %.0f B, over the bound of %d B: the reader goroutine's stack grew and stays grown", stack, maxIdleStackPerConn)
	}
}

// idleNode is a node with the production limits and timing (pings every
// 25 s, a 45 s TTL: sessions neither ping nor expire during the test,
// however loaded the machine), on a real
// redis-server and nats-server, served as presenced serves it; and a
// NATS connection of the test's own.
func idleNode(t *testing.T) (*node, *nats.Conn) {
	t.Helper()
	rdb, _ := testredis.Client(t)
	ns := testnats.Start(t)
	st, err := region.New(rdb, region.Options{Region: "eu", Timing: presence.DefaultTiming(),
		Sink: natsSink(testnats.Connect(t, ns)), PublishLease: 500 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatalf("region.New: %v", err)
	}
	st.Start()
	t.Cleanup(st.Close)
	cfg := Config{Region: "eu", Store: st, NATS: testnats.Connect(t, ns),
		Auth: AuthConfig{HMACSecret: testSecret}, Logger: quiet}
	nd, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := nd.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	srv := newTestServer(nd)
	t.Cleanup(func() { _ = nd.Close(); srv.Close() })
	return &node{Node: nd, srv: srv, store: st}, testnats.Connect(t, ns)
}

// settledMem waits for the process to be down to at most goroutines
// goroutines (transient writers gone), then collects and reads memory.
func settledMem(t *testing.T, goroutines int) runtime.MemStats {
	t.Helper()
	// A few goroutines of the servers come and go (Redis pool, NATS
	// pings); the slack keeps them from failing the wait.
	const slack = 16
	testkit.CheckFor(t, 60*time.Second, 10*time.Millisecond, func() error {
		if g := runtime.NumGoroutine(); g > goroutines+slack {
			return fmt.Errorf("%d goroutines, want at most %d", g, goroutines+slack)
		}
		return nil
	})
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m
}

func writeHeapProfile(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path) // #nosec G304 G703 -- a path the person running the test gave
	if err != nil {
		t.Fatalf("heap profile: %v", err)
	}
	defer f.Close()
	if err := pprof.WriteHeapProfile(f); err != nil {
		t.Fatalf("heap profile: %v", err)
	}
}

// idleChild is the clients' process.
type idleChild struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *testkit.LockedBuffer
	done  chan error
}

// startIdleClients runs this test binary as the clients of spec and
// waits until every one has joined its room.
func startIdleClients(t *testing.T, spec idleSpec) *idleChild {
	t.Helper()
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestIdleConnectionMemory$", "-test.count=1") // #nosec G204 G702 -- this test binary
	cmd.Env = append(os.Environ(), idleClientsEnv+"="+string(b))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c := &idleChild{cmd: cmd, stdin: stdin, out: &testkit.LockedBuffer{}, done: make(chan error, 1)}
	cmd.Stderr = c.out
	if err := cmd.Start(); err != nil {
		t.Fatalf("clients' process: %v", err)
	}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == idleReady {
				close(ready)
			}
			fmt.Fprintln(c.out, sc.Text())
		}
		c.done <- cmd.Wait()
	}()
	t.Cleanup(func() { c.stop(t) })
	select {
	case <-ready:
		return c
	case err := <-c.done:
		c.done <- err
		t.Fatalf("the clients' process ended before its clients were ready (%v):\n%s", err, c.out.String())
	case <-time.After(90 * time.Second):
		t.Fatalf("the clients' process was not ready in 90s:\n%s", c.out.String())
	}
	return nil
}

// stop closes the clients' stdin, which ends them, and waits for the
// process; once.
func (c *idleChild) stop(t *testing.T) {
	t.Helper()
	if c.stdin == nil {
		return
	}
	_ = c.stdin.Close()
	c.stdin = nil
	select {
	case err := <-c.done:
		if err != nil {
			t.Errorf("the clients' process: %v\n%s", err, c.out.String())
		}
	case <-time.After(30 * time.Second):
		_ = c.cmd.Process.Kill()
		t.Errorf("the clients' process did not exit 30s after its stdin closed:\n%s", c.out.String())
	}
}

// runIdleClients is the clients' process: it opens spec.Conns
// connections, each with its own token and session, joins each to a room
// of idlePerRoom, reads whatever comes, says idleReady on stdout and
// holds them until its stdin closes.
func runIdleClients(t *testing.T, raw string) {
	var spec idleSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		t.Fatalf("%s: %v", idleClientsEnv, err)
	}
	conns := make([]*websocket.Conn, spec.Conns)
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	sem := make(chan struct{}, 32)
	for i := range conns {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			ws, err := idleClient(spec.URL, i)
			if err != nil {
				failed.CompareAndSwap(nil, &err)
				return
			}
			conns[i] = ws
			// Read from now on: gorilla answers the node's pings inside
			// NextReader, and the node closes a connection that leaves one
			// unanswered.
			go func() {
				for {
					if _, _, err := ws.NextReader(); err != nil {
						return
					}
				}
			}()
		}()
	}
	wg.Wait()
	defer func() {
		for _, ws := range conns {
			if ws != nil {
				_ = ws.Close()
			}
		}
	}()
	if err := failed.Load(); err != nil {
		t.Fatalf("idle client: %v", *err)
	}
	fmt.Println(idleReady)
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// idleClient dials as user i with a token and joins the user's room,
// retrying a join the node defers (unavailable, retry_after_ms).
func idleClient(url string, i int) (*websocket.Conn, error) {
	user := fmt.Sprintf("idle-%d", i)
	tok, err := testkit.Token(testSecret, user, []string{"*"}, time.Hour)
	if err != nil {
		return nil, err
	}
	// The token in the query, as browsers send it: nothing of the
	// request line may stay with the connection.
	d := websocket.Dialer{HandshakeTimeout: 30 * time.Second, ReadBufferSize: 512, WriteBufferSize: 512}
	ws, _, err := d.Dial(fmt.Sprintf("%ssession=s%d&%s=%s", url, i, TokenQueryParam, tok), nil)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", user, err)
	}
	if err := idleJoin(ws, fmt.Sprintf("idle-room-%d", i/idlePerRoom)); err != nil {
		_ = ws.Close()
		return nil, fmt.Errorf("join %s: %w", user, err)
	}
	return ws, nil
}

func idleJoin(ws *websocket.Conn, room string) error {
	join := map[string]string{"type": "join", "ref": "j", "room": room}
	if err := ws.WriteJSON(join); err != nil {
		return err
	}
	_ = ws.SetReadDeadline(time.Now().Add(60 * time.Second))
	defer func() { _ = ws.SetReadDeadline(time.Time{}) }()
	for {
		_, b, err := ws.ReadMessage()
		if err != nil {
			return err
		}
		f, _ := decodeFrame(b)
		switch {
		case f.Type == "snapshot" && f.Ref == "j":
			return nil
		case f.Type == "error" && f.Code == protocol.CodeUnavailable && f.RetryAfterMS > 0:
			time.Sleep(time.Duration(f.RetryAfterMS) * time.Millisecond)
			if err := ws.WriteJSON(join); err != nil {
				return err
			}
		case f.Type == "error":
			return errors.New(strings.TrimSpace(f.raw))
		}
	}
}

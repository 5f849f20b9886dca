// Package load is what the node-facing modes share: their flags
// (Options), the dialer of their WebSockets, tokens, joins, the bounded
// opener of many connections and the CPU meters the flags ask for.
package load

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/gorilla/websocket"

	"github.com/presence-dev/presence/client"
	"github.com/presence-dev/presence/protocol"
)

// Options are the flags the node-facing modes share (and cli reads), and
// what follows from them (Finish).
type Options struct {
	Addr        string        `flag:"addr" default:"127.0.0.1:8080" help:"node address (host:port)"`
	Metrics     string        `flag:"metrics" help:"node metrics URL (default http://ADDR/metrics)"`
	NatsURL     string        `flag:"nats" default:"nats://127.0.0.1:4222" help:"NATS URL (latency, sweep)"`
	Region      string        `flag:"region" default:"local" help:"the node's region"`
	Secret      string        `flag:"jwt-secret" help:"HS256 secret of the node (empty: --insecure-dev node)"`
	Deflate     bool          `flag:"deflate" help:"offer permessage-deflate, as browsers do: a batched room's events frames then come compressed (connections that do not fold their view read them off the socket without inflating them)"`
	Sources     string        `flag:"sources" default:"127.0.0.1,127.0.0.2,127.0.0.3,127.0.0.4" help:"loopback source addresses to spread connections over"`
	Sessions    int           `flag:"sessions" default:"15000" help:"idle: connections to open (each one session in one room)"`
	PerRoom     int           `flag:"per-room" help:"sessions per room (default: idle 100; latency and sweep 50 joins per room, plus its watcher)"`
	Hold        time.Duration `flag:"hold" default:"60s" help:"idle: how long to hold them and measure CPU"`
	Rate        float64       `flag:"rate" default:"1000" help:"latency: joins per second"`
	Duration    time.Duration `flag:"duration" default:"10s" help:"latency, sweep: how long to join at each rate (cut by --max-conns); hog: how long to run (0: until stopped)"`
	Sweep       string        `flag:"rates,sweep" help:"sweep: comma-separated join rates, lowest first (default 250,500,1000,1500,2000); latency: run a sweep over these rates"`
	Late        time.Duration `flag:"late" default:"1s" help:"latency, sweep: an event seen later than this after its join counts as late (it still enters the percentiles)"`
	Straggle    time.Duration `flag:"straggle" default:"30s" help:"latency, sweep: how long after the last join to wait for events still due"`
	Quiesce     time.Duration `flag:"quiesce" help:"latency, sweep, idle: after a run, wait up to this long for its users' offline events (and in latency and sweep the node's connections) to drop (default: sweep and idle 90s, latency none)"`
	MaxConns    int           `flag:"max-conns" default:"12000" help:"latency, sweep: at most this many WebSockets per run (joiners + watchers); longer runs are cut"`
	OkP99       time.Duration `flag:"ok-p99" default:"25ms" help:"sweep: the p99 target"`
	BadP99      time.Duration `flag:"bad-p99" default:"100ms" help:"sweep: the p99 that marks a collapse"`
	Hog         int           `flag:"hog" help:"latency, sweep: run a presence-load hog child process with this many busy goroutines during the runs"`
	Threads     int           `flag:"threads" default:"2" help:"hog: busy goroutines"`
	Redis       string        `flag:"redis" help:"idle, latency, sweep: Redis host:port (or redis:// URL) whose INFO cpu to read"`
	NatsPID     int           `flag:"nats-pid" help:"idle, latency, sweep: nats-server's pid: its CPU from /proc/PID/stat (exact; preferred)"`
	NatsMonitor string        `flag:"nats-monitor" help:"idle, latency, sweep: nats-server's monitoring URL (http://host:port): its CPU from /varz, sampled each second (when --nats-pid is not given)"`
	CFJoinLeave bool          `flag:"cf-join-leave" default:"true" help:"cf-latency: joiners subscribe with join_leave too, so each gets the later joins of its channel as latency's joiners get their room's later onlines: the same fan-out (false: only the observers get join pushes, a 26th of the frames)"`
	CFPresence  bool          `flag:"cf-presence" default:"false" help:"cf-latency: each joiner asks for its channel's presence in the frame of its subscribe, as a client listing who is in the room must: the work a join's snapshot does on a node"`
	Members     int           `flag:"members" default:"10000" help:"storm: members in the room before the storm"`
	Joiners     int           `flag:"joiners" default:"1000" help:"storm: connections that join the room at once"`
	Insecure    bool
	ReadBuffer  int     // a WebSocket's read buffer; 0: 512 bytes
	BaseConns   float64 // the node's connections before this tool opened any

	Given     map[string]bool // the flags given on the command line
	FileLimit uint64          // the open files this process may hold
}

// Finish completes the options of mode after parsing: what follows from
// the flags given (the metrics URL, dev mode, rooms of 100 sessions for
// the idle modes and 50 joins for the others).
func (o *Options) Finish(mode string, given map[string]bool) {
	o.Given = given
	if o.Metrics == "" {
		o.Metrics = "http://" + o.Addr + "/metrics"
	}
	o.Insecure = o.Secret == ""
	if o.PerRoom == 0 {
		o.PerRoom = 50
		if mode == "idle" || mode == "cf-idle" {
			o.PerRoom = 100
		}
	}
}

// RaiseFileLimit lifts the soft open-files limit to the hard one and
// returns the soft limit in force.
func RaiseFileLimit() uint64 {
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) != nil {
		return 1024
	}
	if l.Cur < l.Max {
		l.Cur = l.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
		_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l)
	}
	return l.Cur
}

// Dialer opens the tool's connections, each from the next of the
// loopback source addresses (one address's ephemeral ports do not reach
// 15,000 connections to one port and back).
type Dialer struct {
	o       Options
	sources []*net.TCPAddr
	n       atomic.Int64
}

// NewDialer is a dialer of o's --addr from o's --sources.
func NewDialer(o Options) (*Dialer, error) {
	d := &Dialer{o: o}
	for _, s := range strings.Split(o.Sources, ",") {
		ip := net.ParseIP(strings.TrimSpace(s))
		if ip == nil || !ip.IsLoopback() {
			return nil, fmt.Errorf("--sources: %q is not a loopback address", s)
		}
		d.sources = append(d.sources, &net.TCPAddr{IP: ip})
	}
	return d, nil
}

// Addr is the address dialed (host:port).
func (d *Dialer) Addr() string { return d.o.Addr }

// WebSocket is a WebSocket dialer with small buffers (the client side of
// the test must fit in RAM too: the read buffer is 512 bytes unless the
// scenario asks for more) whose every dial is from the next source
// address; it offers compression with --deflate.
func (d *Dialer) WebSocket() *websocket.Dialer {
	return &websocket.Dialer{
		ReadBufferSize: cmp.Or(d.o.ReadBuffer, 512), WriteBufferSize: 512, HandshakeTimeout: 10 * time.Second, EnableCompression: d.o.Deflate,
		NetDialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			src := d.sources[int(d.n.Add(1))%len(d.sources)]
			return (&net.Dialer{LocalAddr: src, Timeout: 10 * time.Second}).DialContext(ctx, network, addr)
		},
	}
}

// Dial opens one WebSocket for user/session, from the next source address,
// with small buffers (the client side of the test must fit in RAM too).
func (d *Dialer) Dial(ctx context.Context, user, session string) (*websocket.Conn, error) {
	return d.DialToken(ctx, user, session, false)
}

// DialToken is dial with a token that carries "observe":true when observe
// is set (a client that may follow a room without being in it).
func (d *Dialer) DialToken(ctx context.Context, user, session string, observe bool) (*websocket.Conn, error) {
	u := fmt.Sprintf("ws://%s%s?%s=%s", d.o.Addr, protocol.PathWebSocket, protocol.SessionQueryParam, session)
	if d.o.Insecure {
		u += "&" + protocol.UserQueryParam + "=" + user
	} else {
		tok, err := SignToken(d.o.Secret, user, observe)
		if err != nil {
			return nil, err
		}
		u += "&" + protocol.TokenQueryParam + "=" + tok
	}
	wd := d.WebSocket()
	ws, _, err := wd.DialContext(ctx, u, nil)
	return ws, err
}

// SignToken mints a client token for user, granting every room for an
// hour.
func SignToken(secret, user string, observe bool) (string, error) {
	claims := jwt.MapClaims{"sub": user, "rooms": []string{"*"}, "exp": time.Now().Add(time.Hour).Unix()}
	if observe {
		claims["observe"] = true
	}
	return jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString([]byte(secret))
}

// JoinRoom sends a join and reads until its snapshot (or an error) comes.
// It reads raw frames, not through package client: the storm times a
// join's snapshot from its send, and the members of a room of 10,000
// would otherwise decode and fold every snapshot and event of the others
// in this process, on the cores the node is measured on.
func JoinRoom(ws *websocket.Conn, room string) error {
	join := Encode(protocol.Request{Type: protocol.TypeJoin, Ref: "j", Room: room})
	if err := ws.WriteMessage(websocket.TextMessage, join); err != nil {
		return err
	}
	_ = ws.SetReadDeadline(time.Now().Add(30 * time.Second))
	defer func() { _ = ws.SetReadDeadline(time.Time{}) }()
	for {
		_, data, err := ws.ReadMessage()
		if err != nil {
			return err
		}
		s := string(data)
		if strings.HasPrefix(s, `{"type":"snapshot"`) && strings.Contains(s, `"ref":"j"`) {
			return nil
		}
		if !strings.HasPrefix(s, `{"type":"error"`) {
			continue
		}
		// unavailable: sent again after retry_after_ms with the client's
		// own jitter, as the JS client does, within the read deadline.
		var p protocol.Error
		if json.Unmarshal(data, &p) != nil || p.Code != protocol.CodeUnavailable || p.RetryAfterMS <= 0 {
			return errors.New(s)
		}
		time.Sleep(Jitter(p.RetryAfter()))
		if err := ws.WriteMessage(websocket.TextMessage, join); err != nil {
			return err
		}
	}
}

// Metric reads one sample of a Prometheus text-format metric.
func Metric(url, name string) (float64, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, name+" ") {
			return strconv.ParseFloat(strings.TrimSpace(line[len(name)+1:]), 64)
		}
	}
	return 0, fmt.Errorf("%s not in %s", name, url)
}

// OpenAll opens n connections, 64 at a time; name gives connection i's
// user, session and room ("" joins none). onOpen, if not nil, is called
// with each open (and joined) connection; it must start reading it, as a
// client does: one that does not read is closed as a slow consumer, and
// gorilla answers pings inside ReadMessage. drain is the onOpen that reads
// and drops every frame. It returns the connections (nil where one
// failed), the failures and the first error.
func OpenAll(ctx context.Context, d *Dialer, n int, name func(i int) (user, session, room string), onOpen func(i int, ws *websocket.Conn)) ([]*websocket.Conn, int, error) {
	conns := make([]*websocket.Conn, n)
	t := OpenEach(ctx, n, 64, func(i int) error {
		user, session, room := name(i)
		ws, err := d.Dial(ctx, user, session)
		if err == nil && room != "" {
			if err = JoinRoom(ws, room); err != nil {
				ws.Close()
			}
		}
		if err != nil {
			return err
		}
		conns[i] = ws
		if onOpen != nil {
			onOpen(i, ws)
		}
		return nil
	})
	var first error
	if t.FirstErr != "" {
		first = errors.New(t.FirstErr)
	}
	// Those not tried (ctx ended) failed too.
	return conns, n - t.Opened, first
}

// Drain reads and drops every frame of ws until it ends.
func Drain(_ int, ws *websocket.Conn) {
	go func() {
		// NextReader reads the previous message's rest off the socket
		// without copying (or inflating) it.
		for {
			if _, _, err := ws.NextReader(); err != nil {
				return
			}
		}
	}()
}

// CloseAll closes the connections (nil where one failed).
func CloseAll(conns []*websocket.Conn) {
	for _, c := range conns {
		if c != nil {
			c.Close()
		}
	}
}

// Client connects user with session through the project's Go client
// (package client) on this dialer's sockets; onDisconnect is told of
// every connection of it that ends (the client then reconnects).
func (d *Dialer) Client(ctx context.Context, user, session string, onDisconnect func(error)) (*client.Client, error) {
	cfg := client.Config{URL: "ws://" + d.o.Addr, Session: session, Dialer: d.WebSocket(), OnDisconnect: onDisconnect}
	if d.o.Insecure {
		cfg.User = user
	} else {
		cfg.Token = func(context.Context) (string, error) { return SignToken(d.o.Secret, user, false) }
	}
	return client.Dial(ctx, cfg)
}

package node

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/presence-dev/presence/bus"
	jsclient "github.com/presence-dev/presence/clients/js"
	"github.com/presence-dev/presence/internal/storm"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
)

// Paths served by Handler.
const (
	PathWebSocket = protocol.PathWebSocket
	PathHealth    = "/healthz"
	PathMetrics   = "/metrics"
	// PathClient serves the browser client (clients/js), PathClientTypes
	// its TypeScript declarations.
	PathClient      = "/v1/client.js"
	PathClientTypes = "/v1/client.d.ts"
)

// Node states, in order.
const (
	stateNew int32 = iota
	stateRunning
	stateDraining
	stateClosed
)

// ErrState is returned by Start on a node already started or closed.
var ErrState = errors.New("node: already started or closed")

// Node is one WebSocket edge node. It is safe for concurrent use.
//
// Node only wires its parts together and runs their loops; the parts get
// what they need injected and never reach each other through it.
type Node struct {
	cfg       Config
	log       *slog.Logger
	auth      *authenticator
	keeper    *sessionKeeper
	hub       *hub
	takeovers *takeovers
	wheel     wheel
	metrics   *metrics
	admission *admission
	joins     *storm.Gate
	drops     *dropper
	conns     *connDeps // shared by every connection
	counts    connCounts
	upgrader  websocket.Upgrader
	gatherer  prometheus.Gatherer
	handler   http.Handler
	epoch     time.Time // origin of mono()
	beats     *windows  // slowest heartbeat batches (Status)
	joinMeter *windows  // joins (Status)

	// ctx carries the store calls made for clients; Close cancels it.
	ctx    context.Context
	cancel context.CancelFunc

	mu        sync.Mutex // Start, Drain, Close
	state     atomic.Int32
	runCancel context.CancelFunc
	wg        sync.WaitGroup // background loops and resyncs
	connWG    sync.WaitGroup // connection readers, and writers while they run

	guard *connGuard
}

// New checks cfg and returns a node. Serve its Handler and call Start.
func New(cfg Config) (*Node, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	auth, err := newAuthenticator(cfg.Auth, cfg.Logger)
	if err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, log: cfg.Logger, auth: auth, epoch: time.Now(),
		admission: newAdmission(cfg.Limits.MaxInflight, cfg.Limits.AdmitWait),
		guard:     newConnGuard(cfg.Limits.MaxHTTPConns)}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	if err := n.wire(); err != nil {
		n.cancel()
		auth.close()
		return nil, err
	}
	n.upgrader = websocket.Upgrader{
		HandshakeTimeout: 10 * time.Second,
		ReadBufferSize:   cfg.Limits.ReadBufferBytes,
		WriteBufferSize:  cfg.Limits.WriteBufferBytes,
		// Idle connections hold no write buffer.
		WriteBufferPool: &sync.Pool{},
		Subprotocols:    []string{Subprotocol},
		// Negotiated when the client offers it; only shared events
		// frames are then written compressed (conn.writeFrame).
		EnableCompression: !cfg.NoCompression,
		CheckOrigin:       func(*http.Request) bool { return true }, // checked before, against AllowedOrigins
		Error: func(w http.ResponseWriter, _ *http.Request, status int, reason error) {
			http.Error(w, "node: "+reason.Error(), status)
		},
	}
	if g, ok := cfg.Metrics.(prometheus.Gatherer); ok {
		n.gatherer = g
	}
	mux := http.NewServeMux()
	mux.HandleFunc(PathWebSocket, n.serveWS)
	mux.HandleFunc(PathHealth, n.serveHealth)
	mux.Handle("GET "+PathClient, clientFile("text/javascript; charset=utf-8", jsclient.Source))
	mux.Handle("GET "+PathClientTypes, clientFile("application/typescript; charset=utf-8", jsclient.Types))
	if n.gatherer != nil {
		mux.Handle(PathMetrics, promhttp.HandlerFor(n.gatherer, promhttp.HandlerOpts{}))
	}
	auth.routes(mux)
	n.handler = mux
	if cfg.Auth.InsecureDev {
		n.log.Warn("node: INSECURE DEV AUTH: any client may claim any user id with ?user= and join any room, and " + PathDevToken + " mints tokens for anyone; never use this in production")
	}
	return n, nil
}

// wire makes the node's parts and hands each what it needs.
func (n *Node) wire() error {
	cfg := n.cfg
	n.joins = newJoinGate(cfg)
	n.beats, n.joinMeter = newWindows(statusWindow, false, n.epoch), newWindows(statusWindow, true, n.epoch)
	store := &announcing{Store: cfg.Store}
	n.keeper = newSessionKeeper(store, cfg.heartbeat, cfg.HeartbeatSlots, cfg.Limits.TouchBatch, cfg.StoreTimeout, n.log,
		func(d time.Duration, _ int, err error) {
			n.beats.add(time.Now(), float64(d))
			n.metrics.touchSeconds.Observe(d.Seconds())
			if err != nil {
				n.metrics.touchErrors.Inc()
			}
		})
	var err error
	n.metrics, err = newMetrics(cfg.Metrics, gauges{
		pendingReleases: n.keeper.pendingReleases,
		inflight:        n.admission.inflight,
		connections:     func() int { return int(n.counts.open.Load()) },
		sessions:        n.keeper.held,
		rooms:           func() int { return n.hub.count() },
		joinRate:        n.joins.Rate,
	})
	if err != nil {
		return err
	}
	n.admission.overloaded = n.metrics.overloaded
	n.wireStorm()
	n.keeper.batcher.observe = n.joins.Observe
	n.keeper.moved = func(owners []owner) {
		for _, o := range owners {
			o.sessionMoved()
		}
	}
	n.takeovers = &takeovers{id: newNodeID(), nc: cfg.NATS, subject: bus.TakeoverSubject(cfg.Region), log: n.log,
		sessions: n.keeper, ctx: n.ctx, timeout: cfg.StoreTimeout, wg: &n.wg}
	n.keeper.taken = n.takeovers.announce
	var views *views
	if cfg.Global != nil {
		views = newViews(cfg, n.log)
	}
	n.hub = newHub(n.ctx, cfg, views, n.log, n.metrics, &n.wg)
	store.stored = n.hub.stored
	n.drops = &dropper{region: cfg.Region, nc: cfg.NATS, store: cfg.Revocations, revs: newRevocations(), wheel: &n.wheel, hub: n.hub,
		every: cfg.heartbeat, timeout: cfg.StoreTimeout, log: n.log}
	n.conns = &connDeps{lim: cfg.Limits, storeTimeout: cfg.StoreTimeout, global: cfg.Global != nil, rooms: n.hub, watches: n.hub.watches, sessions: n.keeper, tokens: n.auth,
		admission: n.admission, joins: n.joins, revoked: n.drops.revs, registry: &n.wheel, counts: &n.counts, metrics: n.metrics, log: n.log, ctx: n.ctx,
		wg: &n.connWG, mono: n.mono, joined: func() {
			n.metrics.joins.Inc()
			n.joinMeter.add(time.Now(), 1)
		}}
	return nil
}

// mono is a monotonic clock in nanoseconds.
func (n *Node) mono() int64 { return int64(time.Since(n.epoch)) }

// Handler serves the WebSocket endpoint (PathWebSocket), health
// (PathHealth) and metrics (PathMetrics, when the registerer is a
// gatherer).
func (n *Node) Handler() http.Handler { return n.handler }

// Start runs the session keeper's heartbeat, the ping wheel and the NATS
// dispatcher (the store runs its own reaper) until ctx is done or Close is called. ctx should
// outlive Drain: sessions are refreshed until Close. Connections are
// refused with 503 until Start.
func (n *Node) Start(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.state.Load() != stateNew {
		return ErrState
	}
	if err := n.takeovers.subscribe(); err != nil {
		return err
	}
	if err := n.drops.start(); err != nil {
		n.takeovers.close()
		return err
	}
	run, cancel := context.WithCancel(ctx)
	n.runCancel = cancel
	for _, loop := range []func(context.Context){
		n.keeper.run,
		func(ctx context.Context) { n.wheel.run(ctx, n.cfg.Limits.PingInterval) },
		n.hub.dispatch,
		n.hub.watch,
		n.joins.Extender.Run,
		n.drops.run,
	} {
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			loop(run)
		}()
	}
	n.state.Store(stateRunning)
	n.log.Info("node: started", "region", n.cfg.Region, "heartbeat", n.cfg.heartbeat, "max_connections", n.cfg.Limits.MaxConnections)
	return nil
}

// Drain stops accepting connections (503) and closes every client with
// 1012 so that it reconnects, elsewhere, with the same session id. Their
// sessions are not released: they live out their TTL unless a reconnect
// refreshes them, which then announces nothing. Drain returns once every
// connection has ended, its in-flight store calls included, or when ctx
// is done (connections are then dropped). The heartbeat keeps
// running until Close.
func (n *Node) Drain(ctx context.Context) error {
	n.mu.Lock()
	if n.state.Load() < stateDraining {
		n.state.Store(stateDraining)
	}
	n.mu.Unlock()
	conns := n.wheel.close()
	n.log.Info("node: draining", "connections", len(conns))
	for _, c := range conns {
		c.shutdown(protocol.CloseRestart, "service restart", true)
	}
	return n.waitConns(ctx, conns)
}

// waitConns waits for conns to end, dropping them when ctx is done.
func (n *Node) waitConns(ctx context.Context, conns []*conn) error {
	done := make(chan struct{})
	go func() { n.connWG.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	for _, c := range conns {
		c.kill()
	}
	<-done
	return ctx.Err()
}

// Close stops the node: remaining connections are closed with 1001
// without releasing their sessions (as in Drain), then the background
// loops stop. It does not close the store's Redis client or the NATS
// connection, which belong to the caller.
func (n *Node) Close() error {
	n.mu.Lock()
	if n.state.Load() == stateClosed {
		n.mu.Unlock()
		return nil
	}
	n.state.Store(stateClosed)
	runCancel := n.runCancel
	n.mu.Unlock()

	conns := n.wheel.close()
	for _, c := range conns {
		c.shutdown(protocol.CloseGoingAway, "server closing", true)
	}
	ctx, cancel := context.WithTimeout(context.Background(), n.cfg.Limits.CloseTimeout)
	_ = n.waitConns(ctx, conns)
	cancel()
	if runCancel != nil {
		runCancel()
	}
	n.cancel()
	n.wg.Wait()
	n.auth.close()
	n.hub.close()
	n.takeovers.close()
	n.drops.close()
	return nil
}

// refuse answers a handshake before the upgrade.
func (n *Node) refuse(w http.ResponseWriter, status int, reason, msg string) {
	n.metrics.rejectedConns.WithLabelValues(reason).Inc()
	if status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	http.Error(w, msg, status)
}

func (n *Node) serveWS(w http.ResponseWriter, r *http.Request) {
	if !n.upgradable(w, r) {
		return
	}
	max := int64(n.cfg.Limits.MaxConnections)
	if n.counts.active.Add(1) > max {
		n.counts.active.Add(-1)
		n.refuse(w, http.StatusServiceUnavailable, "capacity", fmt.Sprintf("node: at capacity (%d connections); connect to another node", max))
		return
	}
	reserved := true
	defer func() {
		if reserved {
			n.counts.active.Add(-1)
		}
	}()
	q := r.URL.Query()
	id, err := n.auth.authenticate(r, q)
	if err != nil {
		n.refuseAuth(w, r, err)
		return
	}
	// A copy: the query's value is a slice of the request line, which
	// would keep the whole line (the token with it) for the connection's
	// life.
	session := strings.Clone(q.Get(SessionQueryParam))
	if err := presence.ValidateSession(session); err != nil {
		n.refuse(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("node: ?%s= must be a session id the client keeps across reconnects: %v", SessionQueryParam, err))
		return
	}
	ws, err := n.upgrader.Upgrade(w, r, nil)
	if err != nil {
		n.metrics.rejectedConns.WithLabelValues("bad_request").Inc()
		return // the upgrader has answered
	}
	if until, revoked := n.drops.revs.connect(id.user); revoked {
		n.metrics.rejectedConns.WithLabelValues("revoked").Inc()
		refuseRevoked(ws, until)
		return
	}
	c := newConn(n.conns, ws, id, session)
	c.deflate = !n.cfg.NoCompression && offersDeflate(r.Header)
	ws.EnableWriteCompression(false)
	if !n.wheel.add(c, &n.connWG) {
		// Drain began during the handshake.
		_ = ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(protocol.CloseRestart, "service restart"), time.Now().Add(time.Second))
		_ = ws.Close()
		return
	}
	reserved = false
	c.armExpiry()
	n.counts.open.Add(1)
	c.send(mustJSON(n.hello(id, session)))
	go c.readLoop()
}

// upgradable refuses a handshake the node takes no connection from (not
// started or draining, not a WebSocket upgrade of the protocol, an origin
// not allowed); false: it was answered.
func (n *Node) upgradable(w http.ResponseWriter, r *http.Request) bool {
	switch n.state.Load() {
	case stateNew:
		n.refuse(w, http.StatusServiceUnavailable, "draining", "node: not started")
		return false
	case stateDraining, stateClosed:
		n.refuse(w, http.StatusServiceUnavailable, "draining", "node: draining; connect to another node")
		return false
	}
	if !websocket.IsWebSocketUpgrade(r) {
		n.refuse(w, http.StatusBadRequest, "bad_request", "node: expected a WebSocket upgrade (GET with Upgrade: websocket)")
		return false
	}
	if ps := websocketSubprotocols(r); len(ps) > 0 && !slices.Contains(ps, Subprotocol) {
		n.refuse(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("node: Sec-WebSocket-Protocol must offer %q", Subprotocol))
		return false
	}
	if !n.auth.originAllowed(r) {
		n.refuse(w, http.StatusForbidden, "origin", "node: origin "+strconv.Quote(r.Header.Get("Origin"))+" is not allowed")
		return false
	}
	return true
}

// hello is a new connection's first frame.
func (n *Node) hello(id *identity, session string) protocol.Hello {
	lim := &n.cfg.Limits
	hello := protocol.Hello{Type: protocol.TypeHello, V: protocol.Version, Region: n.cfg.Region, User: id.user, Session: session,
		Limits: protocol.Limits{MaxRooms: lim.MaxRooms, MaxFrameBytes: lim.MaxFrameBytes, MaxStateBytes: presence.MaxStateBytes,
			FrameRate: lim.FrameRate, FrameBurst: lim.FrameBurst, PingIntervalMS: lim.PingInterval.Milliseconds(),
			MaxWatches: lim.MaxWatches, MaxWatchUsers: lim.MaxWatchUsers, TickMS: n.cfg.FanoutTick.Milliseconds()},
		OfflineGraceMS: n.cfg.Store.Timing().OfflineGrace.Milliseconds()}
	if !id.until.IsZero() {
		hello.TokenExpires = &id.until
	}
	return hello
}

// refuseAuth answers a handshake that failed authentication: 401, or for
// a browser's (see fromBrowser), which cannot read a 401, the upgrade and
// a close with CloseUnauthorized and the reason.
func (n *Node) refuseAuth(w http.ResponseWriter, r *http.Request, err error) {
	if !fromBrowser(r) {
		w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token", error_description=`+strconv.Quote(err.Error()))
		n.refuse(w, http.StatusUnauthorized, "auth", err.Error())
		return
	}
	n.metrics.rejectedConns.WithLabelValues("auth").Inc()
	ws, uerr := n.upgrader.Upgrade(w, r, nil)
	if uerr != nil {
		return // the upgrader has answered
	}
	refuseUpgraded(ws, protocol.CloseUnauthorized, authReason(err))
}

// Health is the body of the health endpoint.
type Health struct {
	Status string `json:"status"` // ok, degraded (NATS or the store down), starting, draining or closed
	NATS   string `json:"nats"`
	Store  string `json:"store"` // ok, or why the store did not answer a ping

	// Checks are the configured checks that fail, with why.
	Checks map[string]string `json:"checks,omitempty"`

	Connections int64 `json:"connections"`
	Sessions    int   `json:"sessions"`
	Rooms       int   `json:"rooms"`

	// Build is Config.Build: what this process is (version, commit…).
	Build map[string]string `json:"build,omitempty"`
}

// pinger is a Store that can tell whether it is reachable; the health
// endpoint asks it (*region.Store pings Redis).
type pinger interface {
	Ping(ctx context.Context) error
}

// healthPingTimeout bounds the store ping of one health request.
const healthPingTimeout = time.Second

// serveHealth answers 200 while the node accepts connections, NATS is
// connected, the store answers a ping and every configured check passes,
// else 503, so a load balancer
// stops sending clients to a draining node or to one whose joins would
// fail.
func (n *Node) serveHealth(w http.ResponseWriter, r *http.Request) {
	h := Health{NATS: n.cfg.NATS.Status().String(), Store: "ok", Connections: n.counts.open.Load(), Sessions: n.keeper.held(), Rooms: n.hub.count(), Build: n.cfg.Build}
	healthy := true
	if p, ok := n.cfg.Store.(pinger); ok {
		ctx, cancel := context.WithTimeout(r.Context(), healthPingTimeout)
		if err := p.Ping(ctx); err != nil {
			h.Store, healthy = err.Error(), false
		}
		cancel()
	}
	for name, check := range n.cfg.Checks {
		if err := check(); err != nil {
			if h.Checks == nil {
				h.Checks = map[string]string{}
			}
			h.Checks[name] = err.Error()
			healthy = false
		}
	}
	code := http.StatusServiceUnavailable
	switch n.state.Load() {
	case stateNew:
		h.Status = "starting"
	case stateRunning:
		h.Status = "ok"
		if n.cfg.NATS.IsConnected() && healthy {
			code = http.StatusOK
		} else {
			h.Status = "degraded"
		}
	case stateDraining:
		h.Status = "draining"
	default:
		h.Status = "closed"
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(h)
}

// clientFile serves one file of the browser client. Pages on any origin
// may import it (a module script from another origin needs CORS); the
// ETag, the content's hash, lets browsers revalidate it cheaply after a
// deploy changes it.
func clientFile(contentType string, body []byte) http.Handler {
	sum := sha256.Sum256(body)
	etag := `"` + hex.EncodeToString(sum[:8]) + `"`
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Type", contentType)
		h.Set("Access-Control-Allow-Origin", "*")
		h.Set("Cache-Control", "no-cache")
		h.Set("ETag", etag)
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(body))
	})
}

// offersDeflate reports whether the client offered permessage-deflate,
// which the upgrader then accepted. A wrong guess costs bytes, never
// correctness: a prepared frame is written plain where nothing was
// negotiated.
func offersDeflate(h http.Header) bool {
	for _, v := range h.Values("Sec-Websocket-Extensions") {
		for _, ext := range strings.Split(v, ",") {
			name, _, _ := strings.Cut(ext, ";")
			if strings.EqualFold(strings.TrimSpace(name), "permessage-deflate") {
				return true
			}
		}
	}
	return false
}

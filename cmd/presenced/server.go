package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/global"
	"github.com/presence-dev/presence/httpapi"
	"github.com/presence-dev/presence/internal/embedded"
	"github.com/presence-dev/presence/node"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/region"
)

// serverConfig is everything one edge node process needs.
type serverConfig struct {
	Region       string
	Redis        string // redis:// URL, or host:port[,host:port...]
	RedisCluster bool
	RedisPrefix  string // the region's key prefix (region.Options.Prefix)
	NATS         string // empty: an embedded nats-server
	NATSCreds    string // .creds file (user JWT and seed) for NATS, if set
	NATSCA       string // PEM CA that signs the NATS servers' certificates, if set
	NATSStoreDir string
	NATSPort     int
	// The embedded nats-server's client host, name and cluster (nil: a
	// server of its own).
	NATSHost       string
	NATSServerName string
	NATSCluster    *embedded.Cluster
	Listen         string
	Timing         presence.Timing
	Auth           node.AuthConfig
	Limits         node.Limits
	FanoutTick     time.Duration // node.Config.FanoutTick
	BatchFrom      int           // node.Config.BatchFrom
	FanoutBudget   int           // node.Config.FanoutBudget
	NoCompression  bool          // node.Config.NoCompression
	StreamMaxAge   time.Duration
	DrainTimeout   time.Duration
	Log            *slog.Logger
	PprofListen    string // profiling endpoint, off when empty
	// TLSCert and TLSKey, both set, make the listener serve HTTPS and WSS.
	TLSCert, TLSKey string
	// Global: this region is one of several. The node publishes the
	// region's sessions to the aggregators (one node per region is
	// active) and shows clients the global view.
	Global        bool
	GlobalCadence time.Duration
	// API configures the HTTP server API (--api-*), served on Listen.
	API apiFlags

	routes    func(*http.ServeMux)       // extra HTTP routes (dev's demo page)
	logEvents bool                       // log every transition (dev)
	ready     func(addr, natsURL string) // called once running
}

// natsAuth returns the connect options for a secured NATS: a .creds file
// (decentralized JWT auth, as managed NATS services use) and a CA for
// tls:// URLs. A file that cannot be read is a usage error, before any
// connect.
func natsAuth(creds, ca string) ([]nats.Option, error) {
	var opts []nats.Option
	for _, f := range []struct{ flag, path string }{{"--nats-creds", creds}, {"--nats-ca", ca}} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			return nil, &usageError{fmt.Sprintf("%s: %v", f.flag, err)}
		}
	}
	if creds != "" {
		opts = append(opts, nats.UserCredentials(creds))
	}
	if ca != "" {
		opts = append(opts, nats.RootCAs(ca))
	}
	return opts, nil
}

// newRedis returns a client for a redis:// URL or a list of addresses; a
// list of several, or cluster, means Redis Cluster. Contexts bound every
// call (ContextTimeoutEnabled): a stalled Redis must not hold a heartbeat,
// a join or a health check longer than its deadline.
//
// The pool holds redisPool connections (per master on a cluster) unless
// a URL's pool_size says otherwise: go-redis's default (10 per CPU) made
// requests queue for a connection, not for Redis, when a node busy with
// its fan-out was slow to read replies.
func newRedis(spec string, cluster bool) (redis.UniversalClient, error) {
	if strings.Contains(spec, "://") {
		if cluster {
			o, err := redis.ParseClusterURL(spec)
			if err != nil {
				return nil, &usageError{fmt.Sprintf("--redis %q: %v", spec, err)}
			}
			o.ContextTimeoutEnabled = true
			o.PoolSize = cmp.Or(o.PoolSize, redisPool)
			return redis.NewClusterClient(o), nil
		}
		o, err := redis.ParseURL(spec)
		if err != nil {
			return nil, &usageError{fmt.Sprintf("--redis %q: %v", spec, err)}
		}
		o.ContextTimeoutEnabled = true
		o.PoolSize = cmp.Or(o.PoolSize, redisPool)
		return redis.NewClient(o), nil
	}
	addrs := strings.Split(spec, ",")
	if cluster || len(addrs) > 1 {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true, PoolSize: redisPool}), nil
	}
	return redis.NewClient(&redis.Options{Addr: addrs[0], ContextTimeoutEnabled: true, PoolSize: redisPool}), nil
}

// redisPool is the connection pool's size to one Redis.
const redisPool = 128

// fatalError ends a retry: waiting would not mend it.
type fatalError struct{ err error }

func (e *fatalError) Error() string { return e.err.Error() }

// serve runs one edge node until ctx is done, then drains it: clients are
// closed with 1012 and their sessions kept, so a reconnect elsewhere within
// the grace is a non-event.
func serve(ctx context.Context, cfg serverConfig) error {
	s := &nodeServer{cfg: cfg, lg: cfg.Log}
	defer s.close()
	return s.run(ctx)
}

// cleanups is a command's one cleanup path: what its steps started,
// undone by close, last first.
type cleanups struct{ fs []func() }

func (c *cleanups) onClose(f func()) { c.fs = append(c.fs, f) }

// close undoes what the steps started, last first.
func (c *cleanups) close() {
	for i := len(c.fs) - 1; i >= 0; i-- {
		c.fs[i]()
	}
}

// nodeServer is one run of an edge node: the steps of run in order, and
// one cleanup path (close) for whatever they started.
type nodeServer struct {
	cleanups

	cfg serverConfig
	lg  *slog.Logger

	tlsConf   *tls.Config
	ln        net.Listener
	srv       *http.Server
	handler   atomic.Pointer[http.Handler] // swapped in once the node runs
	waiting   atomic.Pointer[string]       // what the start waits for
	served    chan error
	nc        *nats.Conn
	js        jetstream.JetStream
	streamCfg bus.StreamConfig
	publisher *bus.Publisher
	rdb       redis.UniversalClient
	store     *region.Store
	reg       *prometheus.Registry
	global    node.Snapshotter
	apiKeys   *httpapi.Keys
	query     *bus.Query
	discon    *bus.RegionDisconnect
	svcID     string // the query service instance's id: the node's, on NodesSubject
	node      *node.Node
	running   atomic.Pointer[node.Node] // node, for the server's goroutines
}

// run checks the configuration, listens at once (health says "starting"
// and what it waits for), connects NATS and Redis, retrying until they
// answer, starts the node, serves until ctx is done, then drains.
func (s *nodeServer) run(ctx context.Context) error {
	if err := s.check(); err != nil {
		return err
	}
	if err := s.listen(); err != nil {
		return err
	}
	for _, step := range []func(context.Context) error{
		s.connectNATS, s.ensureStream, s.openRedis, s.openStore, s.startGlobal, s.startNode, s.startPprof,
	} {
		if err := step(ctx); err != nil {
			if ctx.Err() != nil {
				s.lg.Info("presenced: stopped while starting")
				return nil
			}
			return err
		}
	}
	s.waiting.Store(nil)
	mux := http.NewServeMux()
	mux.Handle("/", s.node.Handler())
	actx, stopAPI := context.WithCancel(context.Background())
	s.onClose(stopAPI)
	ops, err := s.nodeOperations()
	if err != nil {
		return err
	}
	if err := s.cfg.API.mount(actx, mux, s.apiKeys, s.query, s.discon, ops, s.lg); err != nil {
		return err
	}
	if s.cfg.routes != nil {
		s.cfg.routes(mux)
	}
	h := http.Handler(mux)
	s.handler.Store(&h)
	s.lg.Info("presenced: ready", "region", s.cfg.Region)
	if s.cfg.ready != nil {
		s.cfg.ready(s.ln.Addr().String(), s.nc.ConnectedUrlRedacted())
	}
	select {
	case <-ctx.Done():
	case err := <-s.served:
		return fmt.Errorf("http: %w", err)
	}
	return s.drain()
}

// check rejects a bad configuration before anything connects: a bad
// certificate, region or timing is a usage error (exit 2).
func (s *nodeServer) check() error {
	cfg := s.cfg
	if cfg.TLSCert != "" || cfg.TLSKey != "" {
		if cfg.TLSCert == "" || cfg.TLSKey == "" {
			return &usageError{"--tls-cert-file and --tls-key-file go together"}
		}
		cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return &usageError{fmt.Sprintf("--tls-cert-file/--tls-key-file: %v", err)}
		}
		s.tlsConf = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	if err := bus.ValidateRegion(cfg.Region); err != nil {
		return &usageError{"--region: " + err.Error()}
	}
	if err := cfg.Timing.Validate(); err != nil {
		return &usageError{err.Error()}
	}
	keys, err := cfg.API.loadKeys(s.lg)
	s.apiKeys = keys
	return err
}

// idleTimeout closes keep-alive HTTP connections idle this long.
const idleTimeout = 30 * time.Second

// listen binds the listener and serves at once: until the node runs,
// /healthz answers 503 "starting" with what the start waits for, so a
// load balancer sees the node unhealthy rather than absent.
func (s *nodeServer) listen() error {
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", s.cfg.Listen, err)
	}
	ws := "ws://"
	if s.tlsConf != nil {
		ln, ws = tls.NewListener(ln, s.tlsConf), "wss://"
	}
	s.ln = node.WrapListener(ln)
	s.srv = &http.Server{
		Handler:           http.HandlerFunc(s.serveHTTP),
		ReadHeaderTimeout: s.cfg.API.headerTimeout,
		IdleTimeout:       idleTimeout,
		ConnState: func(c net.Conn, st http.ConnState) {
			if n := s.running.Load(); n != nil {
				n.ConnState(c, st)
			}
		},
	}
	s.served = make(chan error, 1)
	go func() { s.served <- s.srv.Serve(s.ln) }()
	s.onClose(func() { _ = s.srv.Close() })
	addr := s.ln.Addr().String()
	s.lg.Info("presenced: listening", "addr", addr, "region", s.cfg.Region, "websocket", ws+addr+node.PathWebSocket)
	return nil
}

// serveHTTP is the node's handler once it runs; before, 503.
func (s *nodeServer) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if h := s.handler.Load(); h != nil {
		(*h).ServeHTTP(w, r)
		return
	}
	waiting := "start"
	if p := s.waiting.Load(); p != nil {
		waiting = *p
	}
	w.Header().Set("Retry-After", "1")
	if r.URL.Path == node.PathHealth {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_ = json.NewEncoder(w).Encode(map[string]string{"status": "starting", "waiting_for": waiting})
		return
	}
	http.Error(w, "presenced: starting, waiting for "+waiting+"; connect to another node", http.StatusServiceUnavailable)
}

// retry runs f until it succeeds or ctx is done, backing off from 100ms
// to 5s; what names the dependency waited for in health and logs.
func (s *nodeServer) retry(ctx context.Context, what string, f func(context.Context) error) error {
	s.waiting.Store(&what)
	wait := 100 * time.Millisecond
	for try := 1; ; try++ {
		err := f(ctx)
		if err == nil {
			if try > 1 {
				s.lg.Info("presenced: "+what+" answers", "tries", try)
			}
			return nil
		}
		var ue *usageError
		var fe *fatalError
		var se *region.SchemaError
		if errors.As(err, &ue) || errors.As(err, &se) {
			return err // waiting would not change it
		}
		if errors.As(err, &fe) {
			return fe.err
		}
		if try == 1 || try%10 == 0 {
			s.lg.Warn("presenced: waiting for "+what, "err", err, "tries", try)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// connectNATS starts the embedded nats-server when no URL is given, then
// connects, waiting for the server to answer.
func (s *nodeServer) connectNATS(ctx context.Context) error {
	url := s.cfg.NATS
	if url == "" {
		ns, err := embedded.Start(embedded.Config{Host: s.cfg.NATSHost, Port: s.cfg.NATSPort, StoreDir: s.cfg.NATSStoreDir,
			ServerName: s.cfg.NATSServerName, Cluster: s.cfg.NATSCluster, Logger: s.natsLogger()})
		if err != nil {
			return fmt.Errorf("embedded nats-server: %w", err)
		}
		s.onClose(func() { ns.Shutdown(); ns.WaitForShutdown() })
		url = embedded.LocalURL(ns)
		s.lg.Info("presenced: embedded nats-server", "url", url, "name", ns.Name(), "clustered", s.cfg.NATSCluster != nil)
	}
	opts, err := natsAuth(s.cfg.NATSCreds, s.cfg.NATSCA)
	if err != nil {
		return err
	}
	// RetryOnFailedConnect: a NATS that is not up yet is waited for, not
	// an error; once connected, reconnects are forever.
	nc, err := nats.Connect(url, append(opts, nats.Name("presenced "+s.cfg.Region), nats.MaxReconnects(-1), nats.RetryOnFailedConnect(true))...)
	if err != nil {
		return fmt.Errorf("nats %s: %w", url, err)
	}
	s.nc = nc
	s.onClose(nc.Close)
	if err := s.retry(ctx, "nats", func(context.Context) error {
		if nc.IsConnected() {
			return nil
		}
		// Refused credentials are a configuration error, not an
		// outage: waiting would not end it.
		if err := nc.LastError(); errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) {
			return &fatalError{fmt.Errorf("nats %s: %w", url, err)}
		}
		return fmt.Errorf("not connected to %s: %v", url, nc.LastError())
	}); err != nil {
		return err
	}
	s.js, err = jetstream.New(nc)
	return err
}

// natsLogger is where a clustered embedded nats-server logs: its routes,
// gateways and JetStream elections are what an operator reads when the
// region does not come up. Its notices are debug noise otherwise, so a
// server of its own logs nothing.
func (s *nodeServer) natsLogger() *slog.Logger {
	if s.cfg.NATSCluster == nil {
		return nil
	}
	return s.lg
}

// ensureStream creates or updates the region's stream.
func (s *nodeServer) ensureStream(ctx context.Context) error {
	s.streamCfg = bus.StreamConfig{Region: s.cfg.Region, MaxAge: s.cfg.StreamMaxAge}
	return s.retry(ctx, "jetstream", func(ctx context.Context) error {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := bus.EnsureStream(sctx, s.js, s.streamCfg)
		return err
	})
}

// openRedis connects the regional Redis, waiting for it to answer.
func (s *nodeServer) openRedis(ctx context.Context) error {
	rdb, err := newRedis(s.cfg.Redis, s.cfg.RedisCluster)
	if err != nil {
		return err
	}
	s.rdb = rdb
	s.onClose(func() { _ = rdb.Close() })
	return s.retry(ctx, "redis", func(ctx context.Context) error {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := rdb.Ping(pctx).Err(); err != nil {
			return fmt.Errorf("redis %s: %w", s.cfg.Redis, err)
		}
		return nil
	})
}

// openStore makes the regional store (its sink the region's stream), its
// query service and the metrics registry.
func (s *nodeServer) openStore(ctx context.Context) error {
	s.publisher = bus.NewPublisher(s.js, s.cfg.Region, bus.WithStreamConfig(s.streamCfg))
	s.reg = prometheus.NewRegistry()
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := registerBuildInfo(s.reg); err != nil {
		return err
	}
	sink, err := newCountingSink(s.reg, s.publisher)
	if err != nil {
		return err
	}
	store, err := region.New(s.rdb, region.Options{Region: s.cfg.Region, Timing: s.cfg.Timing, Sink: sink,
		Prefix: s.cfg.RedisPrefix, AsyncDelivery: true, Logger: s.lg})
	if err != nil {
		return err
	}
	s.store = store
	if err := s.retry(ctx, "redis", store.Preload); err != nil {
		return err
	}
	// The store runs its reaper (and its deliverer) until it is closed:
	// after the node, which is closed first.
	store.Start()
	s.onClose(store.Close)
	if s.discon, err = bus.NewRegionDisconnect(s.nc, s.cfg.Region, store, bus.WithLogger(s.lg)); err != nil {
		return err
	}
	if s.query, err = bus.NewQuery(s.cfg.Region, store, bus.WithLogger(s.lg)); err != nil {
		return err
	}
	svc, err := bus.StartService(s.nc, s.cfg.Region, store, bus.WithLogger(s.lg), bus.WithDisconnect(s.discon))
	if err != nil {
		return fmt.Errorf("query service: %w", err)
	}
	s.onClose(func() { _ = svc.Stop() })
	s.svcID = svc.Info().ID
	if s.cfg.logEvents {
		sub, err := s.nc.Subscribe(bus.Root+".>", func(m *nats.Msg) {
			if t, err := bus.DecodeEvent(m.Data); err == nil {
				s.lg.Info("event", "subject", m.Subject, "kind", t.Kind, "reason", t.Reason, "sessions", t.Sessions)
			}
		})
		if err == nil {
			s.onClose(func() { _ = sub.Unsubscribe() })
		}
	}
	return registerStoreMetrics(s.reg, store)
}

// startGlobal runs the region's publisher and the global view's client
// when this region is one of several (--global).
func (s *nodeServer) startGlobal(ctx context.Context) error {
	if !s.cfg.Global {
		return nil
	}
	pub, err := global.NewRegionPublisher(global.PublisherConfig{
		Region: s.cfg.Region, Source: s.store, NATS: s.nc, JetStream: s.js, Cadence: s.cfg.GlobalCadence, Logger: s.lg,
	})
	if err != nil {
		return err
	}
	if err := s.retry(ctx, "global publisher", pub.Start); err != nil {
		return fmt.Errorf("region publisher: %w", err)
	}
	s.onClose(pub.Close)
	if err := registerPublisherMetrics(s.reg, pub); err != nil {
		return err
	}
	s.global = global.NewClient(s.nc)
	return nil
}

// startNode makes and starts the edge node. Its loops run on their own
// context: the heartbeat must keep refreshing sessions while it drains.
func (s *nodeServer) startNode(context.Context) error {
	n, err := node.New(node.Config{
		Region: s.cfg.Region, Store: s.store, NATS: s.nc, Global: s.global, Revocations: s.store,
		Auth: s.cfg.Auth, Limits: s.cfg.Limits, Logger: s.lg, Metrics: s.reg, Build: buildInfo(),
		FanoutTick: s.cfg.FanoutTick, BatchFrom: s.cfg.BatchFrom, FanoutBudget: s.cfg.FanoutBudget, NoCompression: s.cfg.NoCompression,
		Checks: map[string]func() error{"stream": s.publisher.Err},
	})
	if err != nil {
		return err
	}
	if err := n.Start(context.Background()); err != nil {
		return err
	}
	s.node = n
	s.running.Store(n)
	s.onClose(func() { _ = n.Close() })
	return nil
}

// startPprof serves /debug/pprof when --pprof-listen is set.
func (s *nodeServer) startPprof(context.Context) error {
	if s.cfg.PprofListen == "" {
		return nil
	}
	pl, err := net.Listen("tcp", s.cfg.PprofListen)
	if err != nil {
		return fmt.Errorf("--pprof-listen %s: %w", s.cfg.PprofListen, err)
	}
	pm := http.NewServeMux()
	pm.HandleFunc("/debug/pprof/", pprof.Index)
	pm.HandleFunc("/debug/pprof/profile", pprof.Profile)
	pm.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	pm.HandleFunc("/debug/pprof/trace", pprof.Trace)
	ps := &http.Server{Handler: pm, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = ps.Serve(pl) }()
	s.onClose(func() { _ = ps.Close() })
	s.lg.Info("presenced: pprof", "addr", pl.Addr().String())
	return nil
}

// drain closes every client with 1012, waits for them (at most the drain
// timeout) and stops serving.
func (s *nodeServer) drain() error {
	s.lg.Info("presenced: draining", "timeout", s.cfg.DrainTimeout)
	dctx, cancel := context.WithTimeout(context.Background(), s.cfg.DrainTimeout)
	defer cancel()
	derr := s.node.Drain(dctx)
	_ = s.srv.Shutdown(dctx)
	if derr != nil && !errors.Is(derr, context.DeadlineExceeded) {
		return derr
	}
	s.lg.Info("presenced: stopped")
	return nil
}

// newLogger writes text or JSON logs at the given level.
func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, &usageError{fmt.Sprintf("--log-level %q: want debug, info, warn or error", level)}
	}
	o := &slog.HandlerOptions{Level: l}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, o)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, o)), nil
	}
	return nil, &usageError{fmt.Sprintf("--log-format %q: want text or json", format)}
}

func readFileFlag(name, path string) ([]byte, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, &usageError{fmt.Sprintf("--%s: %v", name, err)}
	}
	return b, nil
}

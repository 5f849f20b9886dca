package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/global"
	"github.com/presence-dev/presence/node"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/region"
)

// serverConfig is everything one edge node process needs.
type serverConfig struct {
	Region       string
	Redis        string // redis:// URL, or host:port[,host:port...]
	RedisCluster bool
	NATS         string // empty: an embedded nats-server
	NATSCreds    string // .creds file (user JWT and seed) for NATS, if set
	NATSCA       string // PEM CA that signs the NATS servers' certificates, if set
	NATSStoreDir string
	NATSPort     int
	Listen       string
	Timing       presence.Timing
	Auth         node.AuthConfig
	Limits       node.Limits
	StreamMaxAge time.Duration
	DrainTimeout time.Duration
	Log          *slog.Logger
	PprofListen  string // profiling endpoint, off when empty
	// TLSCert and TLSKey, both set, make the listener serve HTTPS and WSS.
	TLSCert, TLSKey string
	// Global: this region is one of several. The node publishes the
	// region's sessions to the aggregators (one node per region is
	// active) and shows clients the global view.
	Global        bool
	GlobalCadence time.Duration

	routes    func(*http.ServeMux) // extra HTTP routes (dev's demo page)
	logEvents bool                 // log every transition (dev)
	ready     func(addr string)    // called once listening
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
func newRedis(spec string, cluster bool) (redis.UniversalClient, error) {
	if strings.Contains(spec, "://") {
		if cluster {
			o, err := redis.ParseClusterURL(spec)
			if err != nil {
				return nil, &usageError{fmt.Sprintf("--redis %q: %v", spec, err)}
			}
			o.ContextTimeoutEnabled = true
			return redis.NewClusterClient(o), nil
		}
		o, err := redis.ParseURL(spec)
		if err != nil {
			return nil, &usageError{fmt.Sprintf("--redis %q: %v", spec, err)}
		}
		o.ContextTimeoutEnabled = true
		return redis.NewClient(o), nil
	}
	addrs := strings.Split(spec, ",")
	if cluster || len(addrs) > 1 {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true}), nil
	}
	return redis.NewClient(&redis.Options{Addr: addrs[0], ContextTimeoutEnabled: true}), nil
}

// serve runs one edge node until ctx is done, then drains it: clients are
// closed with 1012 and their sessions kept, so a reconnect elsewhere within
// the grace is a non-event.
func serve(ctx context.Context, cfg serverConfig) (err error) {
	lg := cfg.Log
	var cleanups []func()
	defer func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}()
	// A bad certificate fails the start before anything connects.
	var tlsConf *tls.Config
	if cfg.TLSCert != "" || cfg.TLSKey != "" {
		if cfg.TLSCert == "" || cfg.TLSKey == "" {
			return &usageError{"--tls-cert-file and --tls-key-file go together"}
		}
		cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return &usageError{fmt.Sprintf("--tls-cert-file/--tls-key-file: %v", err)}
		}
		tlsConf = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}

	if err := bus.ValidateRegion(cfg.Region); err != nil {
		return &usageError{"--region: " + err.Error()}
	}
	if err := cfg.Timing.Validate(); err != nil {
		return &usageError{err.Error()}
	}

	// NATS: the configured server, or one in this process.
	natsURL := cfg.NATS
	if natsURL == "" {
		ns, err := bus.StartEmbedded(bus.EmbeddedConfig{Port: cfg.NATSPort, StoreDir: cfg.NATSStoreDir})
		if err != nil {
			return fmt.Errorf("embedded nats-server: %w", err)
		}
		cleanups = append(cleanups, func() { ns.Shutdown(); ns.WaitForShutdown() })
		natsURL = ns.ClientURL()
		lg.Info("presenced: embedded nats-server", "url", natsURL)
	}
	opts, err := natsAuth(cfg.NATSCreds, cfg.NATSCA)
	if err != nil {
		return err
	}
	nc, err := nats.Connect(natsURL, append(opts, nats.Name("presenced "+cfg.Region), nats.MaxReconnects(-1), nats.RetryOnFailedConnect(false))...)
	if err != nil {
		return fmt.Errorf("nats %s: %w", natsURL, err)
	}
	cleanups = append(cleanups, nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	streamCfg := bus.StreamConfig{Region: cfg.Region, MaxAge: cfg.StreamMaxAge}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = bus.EnsureStream(sctx, js, streamCfg)
	cancel()
	if err != nil {
		return err
	}

	// Redis.
	rdb, err := newRedis(cfg.Redis, cfg.RedisCluster)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, func() { _ = rdb.Close() })
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = rdb.Ping(pctx).Err()
	cancel()
	if err != nil {
		return fmt.Errorf("redis %s: %w", cfg.Redis, err)
	}
	publisher := bus.NewPublisher(js, cfg.Region, bus.WithStreamConfig(streamCfg))
	store, err := region.New(rdb, region.Options{Region: cfg.Region, Timing: cfg.Timing, Sink: publisher, Logger: lg})
	if err != nil {
		return err
	}
	if err := store.Preload(ctx); err != nil {
		return err
	}

	svc, err := bus.StartService(nc, cfg.Region, store, bus.WithLogger(lg))
	if err != nil {
		return fmt.Errorf("query service: %w", err)
	}
	cleanups = append(cleanups, func() { _ = svc.Stop() })

	if cfg.logEvents {
		sub, err := nc.Subscribe(bus.Root+".>", func(m *nats.Msg) {
			if t, err := bus.DecodeEvent(m.Data); err == nil {
				lg.Info("event", "subject", m.Subject, "kind", t.Kind, "reason", t.Reason, "sessions", t.Sessions)
			}
		})
		if err == nil {
			cleanups = append(cleanups, func() { _ = sub.Unsubscribe() })
		}
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := registerStoreMetrics(reg, store); err != nil {
		return err
	}

	var globalView node.Snapshotter
	if cfg.Global {
		pub, err := global.NewRegionPublisher(global.PublisherConfig{
			Region: cfg.Region, Source: store, NATS: nc, JetStream: js, Cadence: cfg.GlobalCadence, Logger: lg,
		})
		if err != nil {
			return err
		}
		if err := pub.Start(ctx); err != nil {
			return fmt.Errorf("region publisher: %w", err)
		}
		cleanups = append(cleanups, pub.Close)
		if err := registerPublisherMetrics(reg, pub); err != nil {
			return err
		}
		globalView = global.NewClient(nc)
	}

	n, err := node.New(node.Config{
		Region: cfg.Region, Store: store, NATS: nc, Timing: cfg.Timing, Global: globalView,
		Auth: cfg.Auth, Limits: cfg.Limits, Logger: lg, Metrics: reg,
		Checks: map[string]func() error{"stream": publisher.Err},
	})
	if err != nil {
		return err
	}
	// The node's loops run on their own context: the heartbeat must keep
	// refreshing sessions while the node drains.
	if err := n.Start(context.Background()); err != nil {
		return err
	}
	cleanups = append(cleanups, func() { _ = n.Close() })

	if cfg.PprofListen != "" {
		pl, err := net.Listen("tcp", cfg.PprofListen)
		if err != nil {
			return fmt.Errorf("--pprof-listen %s: %w", cfg.PprofListen, err)
		}
		pm := http.NewServeMux()
		pm.HandleFunc("/debug/pprof/", pprof.Index)
		pm.HandleFunc("/debug/pprof/profile", pprof.Profile)
		pm.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		pm.HandleFunc("/debug/pprof/trace", pprof.Trace)
		ps := &http.Server{Handler: pm, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = ps.Serve(pl) }()
		cleanups = append(cleanups, func() { _ = ps.Close() })
		lg.Info("presenced: pprof", "addr", pl.Addr().String())
	}

	mux := http.NewServeMux()
	mux.Handle("/", n.Handler())
	if cfg.routes != nil {
		cfg.routes(mux)
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	ws := "ws://"
	if tlsConf != nil {
		ln, ws = tls.NewListener(ln, tlsConf), "wss://"
	}
	ln = node.WrapListener(ln)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	addr := ln.Addr().String()
	lg.Info("presenced: listening", "addr", addr, "region", cfg.Region, "websocket", ws+addr+node.PathWebSocket)
	if cfg.ready != nil {
		cfg.ready(addr)
	}

	select {
	case <-ctx.Done():
	case err := <-served:
		return fmt.Errorf("http: %w", err)
	}
	lg.Info("presenced: draining", "timeout", cfg.DrainTimeout)
	dctx, cancel := context.WithTimeout(context.Background(), cfg.DrainTimeout)
	defer cancel()
	derr := n.Drain(dctx)
	_ = srv.Shutdown(dctx)
	if derr != nil && !errors.Is(derr, context.DeadlineExceeded) {
		return derr
	}
	lg.Info("presenced: stopped")
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

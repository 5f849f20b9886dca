package main

import (
	"cmp"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/presence-dev/presence/node"
)

// serveOps serves /metrics from reg and /healthz from health on listen,
// and whatever mount adds (nil: nothing), for the commands whose HTTP is
// their operations (aggregator, webhooks); it logs the address as
// "<what> http" and returns what stops it. headerTimeout 0 is 10s.
func serveOps(listen string, reg *prometheus.Registry, health http.HandlerFunc, mount func(*http.ServeMux) error,
	headerTimeout time.Duration, lg *slog.Logger, what string) (func(), error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("--listen %s: %w", listen, err)
	}
	mux := http.NewServeMux()
	mux.Handle(node.PathMetrics, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc(node.PathHealth, health)
	if mount != nil {
		if err := mount(mux); err != nil {
			_ = ln.Close()
			return nil, err
		}
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: cmp.Or(headerTimeout, 10*time.Second), IdleTimeout: idleTimeout}
	go func() { _ = srv.Serve(ln) }()
	lg.Info("presenced: "+what+" http", "addr", ln.Addr().String())
	return func() { _ = srv.Close() }, nil
}

// connectForever connects to NATS as name, waiting for a server that
// does not answer yet and reconnecting forever once connected.
func connectForever(url, creds, ca, name string) (*nats.Conn, error) {
	opts, err := natsAuth(creds, ca)
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(url, append(opts, nats.Name(name), nats.MaxReconnects(-1), nats.RetryOnFailedConnect(true))...)
	if err != nil {
		return nil, fmt.Errorf("nats %s: %w", url, err)
	}
	return nc, nil
}

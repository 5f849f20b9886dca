package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/presence-dev/presence/global"
	"github.com/presence-dev/presence/node"
)

// runAggregatorCommand runs one aggregator until ctx is done. Run two or
// more (one per region, say): one leads, the others take over.
func runAggregatorCommand(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("presenced aggregator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		natsURL, regions, cluster, logLevel, logFormat, listen string
		natsCreds, natsCA                                      string
		cadence, grace, downAfter, dropAfter                   time.Duration
		replicas, maxFullBytes                                 int
	)
	fs.StringVar(&natsURL, "nats", "nats://127.0.0.1:4222", "NATS server URL (the supercluster)")
	fs.StringVar(&natsCreds, "nats-creds", "", "NATS .creds file (user JWT and seed), for a secured NATS")
	fs.StringVar(&natsCA, "nats-ca", "", "PEM CA of the NATS servers' certificates (tls:// URLs)")
	fs.DurationVar(&cadence, "cadence", global.DefaultCadence, "the regions' publication cadence")
	durationFlag(fs, &grace, "grace", "global offline grace (default 3 cadences)")
	durationFlag(fs, &downAfter, "down-after", "a region silent this long is held (default 5 cadences)")
	durationFlag(fs, &dropAfter, "drop-after", "a region silent this long is dropped: its users go offline, region_lost (default 60s)")
	fs.StringVar(&regions, "regions", "", "comma-separated regions expected to publish; publications of any other are dropped (optional, advised)")
	fs.IntVar(&maxFullBytes, "max-full-bytes", global.DefaultMaxFullBytes, "largest full snapshot of one region, in bytes; a larger one is dropped")
	fs.StringVar(&cluster, "stream-cluster", "", "NATS cluster that holds the global stream (optional)")
	fs.IntVar(&replicas, "replicas", 1, "replicas of the global stream and lease")
	fs.StringVar(&listen, "listen", "", "serve /metrics and /healthz on this address (e.g. :9090); off when empty")
	fs.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&logFormat, "log-format", "text", "text or json")
	if err := parseFlags(fs, args); err != nil {
		if err == flag.ErrHelp {
			return nil
		}
		return err
	}
	lg, err := newLogger(stderr, logLevel, logFormat)
	if err != nil {
		return err
	}
	opts, err := natsAuth(natsCreds, natsCA)
	if err != nil {
		return err
	}
	nc, err := nats.Connect(natsURL, append(opts, nats.Name("presenced aggregator"), nats.MaxReconnects(-1))...)
	if err != nil {
		return fmt.Errorf("nats %s: %w", natsURL, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cfg := global.AggregatorConfig{
		NATS: nc, JetStream: js, Cadence: cadence, Grace: grace, DownAfter: downAfter, DropAfter: dropAfter,
		Replicas: replicas, MaxFullBytes: maxFullBytes, Logger: lg,
	}
	if regions != "" {
		cfg.Regions = strings.Split(regions, ",")
	} else {
		lg.Warn("presenced: aggregator without --regions takes publications of any region name; list the regions")
	}
	if cluster != "" {
		cfg.Placement = &jetstream.Placement{Cluster: cluster}
	}
	a, err := global.NewAggregator(cfg)
	if err != nil {
		return &usageError{err.Error()}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := registerAggregatorMetrics(reg, a); err != nil {
		return err
	}
	if err := registerAggregatorSafety(reg, a); err != nil {
		return err
	}
	// Health is served from the start: while JetStream does not answer
	// (a partition, a stream another aggregator is creating) Start waits
	// and retries, and /healthz says "starting".
	var started atomic.Bool
	if listen != "" {
		ln, err := net.Listen("tcp", listen)
		if err != nil {
			return fmt.Errorf("--listen %s: %w", listen, err)
		}
		mux := http.NewServeMux()
		mux.Handle(node.PathMetrics, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc(node.PathHealth, func(w http.ResponseWriter, _ *http.Request) {
			serveAggregatorHealth(w, nc, a, started.Load())
		})
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
		lg.Info("presenced: aggregator http", "addr", ln.Addr().String())
	}
	if err := a.Start(ctx); err != nil {
		if ctx.Err() != nil {
			lg.Info("presenced: aggregator stopped while starting")
			return nil // a signal, not a failure
		}
		return err
	}
	defer a.Close()
	started.Store(true)
	lg.Info("presenced: aggregator running", "nats", natsURL, "cadence", cadence)
	<-ctx.Done()
	lg.Info("presenced: aggregator stopping")
	return nil
}

// aggregatorHealth is the body of an aggregator's health endpoint.
type aggregatorHealth struct {
	Status  string                `json:"status"` // ok, starting, or nats_disconnected
	NATS    string                `json:"nats"`
	Leader  bool                  `json:"leader"`
	Regions []global.RegionStatus `json:"regions"`
}

// serveAggregatorHealth answers 200 once started while NATS is connected,
// else 503. A standby is healthy: it answers queries and is ready to take
// over.
func serveAggregatorHealth(w http.ResponseWriter, nc *nats.Conn, a *global.Aggregator, started bool) {
	h := aggregatorHealth{Status: "ok", NATS: nc.Status().String(), Leader: a.Leader(), Regions: a.RegionStatuses()}
	code := http.StatusOK
	switch {
	case !nc.IsConnected():
		h.Status, code = "nats_disconnected", http.StatusServiceUnavailable
	case !started:
		h.Status, code = "starting", http.StatusServiceUnavailable
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(h)
}

// registerAggregatorSafety exports the counters of what an aggregator
// refused or survived (presence_global_*): input it dropped, its own
// stalls, and JetStream not answering.
func registerAggregatorSafety(reg prometheus.Registerer, a *global.Aggregator) error {
	st := a.Stats()
	return registerCounters(reg, "global", []counter{
		{"unknown_regions", "Publications of regions not in --regions, dropped.", &st.UnknownRegions},
		{"contenders", "Publications of a second publisher while a region's current one publishes, dropped.", &st.Contenders},
		{"dropped_fulls", "Full snapshots dropped before they completed (a lost part, too large, too slow).", &st.DroppedFulls},
		{"oversize_fulls", "Full snapshots dropped for exceeding --max-full-bytes.", &st.OversizeFulls},
		{"stalls", "Ticks more than a cadence apart: the aggregator itself stalled, and the time was not held against any region.", &st.Stalls},
		{"start_retries", "Failed attempts to reach JetStream while starting.", &st.StartRetries},
		{"read_errors", "Failed reads of the global stream.", &st.ReadErrors},
	})
}

package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/global"
	"github.com/presence-dev/presence/httpapi"
)

// runAggregatorCommand runs one aggregator until ctx is done. Run two or
// more (one per region, say): one leads, the others take over.
func runAggregatorCommand(ctx context.Context, args []string, stderr io.Writer) error {
	return runCommand(ctx, &aggregatorCommand{}, args, stderr)
}

// aggregatorCommand is one run of an aggregator: parse, then the steps of
// run in order, and one cleanup path (close) for whatever they started,
// as nodeServer does for a node.
type aggregatorCommand struct {
	cleanups

	natsURL, regions, cluster, logLevel, logFormat, listen string
	natsCreds, natsCA                                      string
	cadence, grace, downAfter, dropAfter                   time.Duration
	replicas, maxFullBytes                                 int
	api                                                    apiFlags

	lg      *slog.Logger
	apiKeys *httpapi.Keys
	nc      *nats.Conn
	agg     *global.Aggregator
	reg     *prometheus.Registry
	started atomic.Bool // Start returned: health says "ok", not "starting"
}

// parse reads the flags; -h is flag.ErrHelp.
func (c *aggregatorCommand) parse(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("presenced aggregator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.natsURL, "nats", "nats://127.0.0.1:4222", "NATS server URL (the supercluster)")
	fs.StringVar(&c.natsCreds, "nats-creds", "", "NATS .creds file (user JWT and seed), for a secured NATS")
	fs.StringVar(&c.natsCA, "nats-ca", "", "PEM CA of the NATS servers' certificates (tls:// URLs)")
	fs.DurationVar(&c.cadence, "cadence", global.DefaultCadence, "the regions' publication cadence")
	durationFlag(fs, &c.grace, "grace", "global offline grace (default 3 cadences)")
	durationFlag(fs, &c.downAfter, "down-after", "a region silent this long is held (default 5 cadences)")
	durationFlag(fs, &c.dropAfter, "drop-after", "a region silent this long is dropped: its users go offline, region_lost (default 60s)")
	fs.StringVar(&c.regions, "regions", "", "comma-separated regions expected to publish; publications of any other are dropped (optional, advised)")
	fs.IntVar(&c.maxFullBytes, "max-full-bytes", global.DefaultMaxFullBytes, "largest full snapshot of one region, in bytes; a larger one is dropped")
	fs.StringVar(&c.cluster, "stream-cluster", "", "NATS cluster that holds the global stream (optional)")
	fs.IntVar(&c.replicas, "replicas", 1, "replicas of the global stream and lease")
	fs.StringVar(&c.listen, "listen", "", "serve /metrics, /healthz and the HTTP API (global view) on this address (e.g. :9090); off when empty")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&c.logFormat, "log-format", "text", "text or json")
	c.api.register(fs)
	fs.Usage = groupedUsage(fs, commandIntro[fs.Name()], "")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	lg, err := newLogger(stderr, c.logLevel, c.logFormat)
	c.lg = lg
	if err != nil {
		return err
	}
	if c.apiKeys, err = c.api.loadKeys(lg); err != nil {
		return err
	}
	if c.listen == "" && c.apiKeys.Len() > 0 {
		return &usageError{"API keys are given but no --listen: the HTTP API is served on --listen"}
	}
	return nil
}

// run connects NATS, makes the aggregator and its metrics, serves health
// at once (when --listen is set), starts the aggregator and runs it until
// ctx is done.
func (c *aggregatorCommand) run(ctx context.Context) error {
	for _, step := range []func() error{c.connectNATS, c.newAggregator, c.serveHTTP} {
		if err := step(); err != nil {
			return err
		}
	}
	if err := c.waitNATS(ctx); err != nil {
		if ctx.Err() != nil {
			c.lg.Info("presenced: aggregator stopped while starting")
			return nil
		}
		return err
	}
	if err := c.agg.Start(ctx); err != nil {
		if ctx.Err() != nil {
			c.lg.Info("presenced: aggregator stopped while starting")
			return nil // a signal, not a failure
		}
		return err
	}
	c.onClose(c.agg.Close)
	c.started.Store(true)
	c.lg.Info("presenced: aggregator running", "nats", c.natsURL, "cadence", c.cadence)
	<-ctx.Done()
	c.lg.Info("presenced: aggregator stopping")
	return nil
}

// connectNATS connects the supercluster. A NATS that does not answer yet
// is waited for (waitNATS), as a node waits: started beside its NATS (a
// compose file, a pod), an aggregator must not exit and back off;
// once connected, reconnects are forever.
func (c *aggregatorCommand) connectNATS() error {
	nc, err := connectForever(c.natsURL, c.natsCreds, c.natsCA, "presenced aggregator")
	if err != nil {
		return err
	}
	c.nc = nc
	c.onClose(nc.Close)
	return nil
}

// waitNATS waits until NATS is connected (health says
// "nats_disconnected" meanwhile). Refused credentials end the wait: a
// configuration error, not an outage.
func (c *aggregatorCommand) waitNATS(ctx context.Context) error {
	for try := 1; !c.nc.IsConnected(); try++ {
		if err := c.nc.LastError(); errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) {
			return fmt.Errorf("nats %s: %w", c.natsURL, err)
		}
		if try%50 == 1 {
			c.lg.Warn("presenced: aggregator waiting for nats", "url", c.natsURL, "err", c.nc.LastError())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// newAggregator makes the aggregator and the registry of its metrics; a
// bad configuration is a usage error.
func (c *aggregatorCommand) newAggregator() error {
	js, err := jetstream.New(c.nc)
	if err != nil {
		return err
	}
	cfg := global.AggregatorConfig{
		NATS: c.nc, JetStream: js, Cadence: c.cadence, Grace: c.grace, DownAfter: c.downAfter, DropAfter: c.dropAfter,
		Replicas: c.replicas, MaxFullBytes: c.maxFullBytes, Logger: c.lg,
	}
	if c.regions != "" {
		cfg.Regions = strings.Split(c.regions, ",")
	} else {
		c.lg.Warn("presenced: aggregator without --regions takes publications of any region name; list the regions")
	}
	if c.cluster != "" {
		cfg.Placement = &jetstream.Placement{Cluster: c.cluster}
	}
	a, err := global.NewAggregator(cfg)
	if err != nil {
		return &usageError{err.Error()}
	}
	c.agg = a
	c.reg = prometheus.NewRegistry()
	c.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := registerBuildInfo(c.reg); err != nil {
		return err
	}
	if err := registerAggregatorMetrics(c.reg, a); err != nil {
		return err
	}
	return registerAggregatorSafety(c.reg, a)
}

// serveHTTP serves /metrics and /healthz when --listen is set. Health is
// served from the start: while JetStream does not answer (a partition, a
// stream another aggregator is creating) Start waits and retries, and
// /healthz says "starting".
func (c *aggregatorCommand) serveHTTP() error {
	if c.listen == "" {
		return nil
	}
	q, err := bus.NewQuery(bus.GlobalRegion, c.agg, bus.WithLogger(c.lg))
	if err != nil {
		return err
	}
	actx, stopAPI := context.WithCancel(context.Background())
	c.onClose(stopAPI)
	ops, err := c.aggregatorOperations()
	if err != nil {
		return err
	}
	mount := func(mux *http.ServeMux) error { return c.api.mount(actx, mux, c.apiKeys, q, c.agg, ops, c.lg) }
	stop, err := serveOps(c.listen, c.reg, func(w http.ResponseWriter, _ *http.Request) {
		serveAggregatorHealth(w, c.nc, c.agg, c.started.Load())
	}, mount, c.api.headerTimeout, c.lg, "aggregator")
	if err != nil {
		return err
	}
	c.onClose(stop)
	return nil
}

// aggregatorHealth is the body of an aggregator's health endpoint.
type aggregatorHealth struct {
	Status  string                `json:"status"` // ok, starting, or nats_disconnected
	NATS    string                `json:"nats"`
	Leader  bool                  `json:"leader"`
	Regions []global.RegionStatus `json:"regions"`
	Build   map[string]string     `json:"build"`
}

// serveAggregatorHealth answers 200 once started while NATS is connected,
// else 503. A standby is healthy: it answers queries and is ready to take
// over.
func serveAggregatorHealth(w http.ResponseWriter, nc *nats.Conn, a *global.Aggregator, started bool) {
	h := aggregatorHealth{Status: "ok", NATS: nc.Status().String(), Leader: a.Leader(), Regions: a.RegionStatuses(), Build: buildInfo()}
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

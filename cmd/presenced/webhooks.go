package main

import (
	"context"
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/presence-dev/presence/webhook"
)

// runWebhooksCommand runs one webhook dispatcher until ctx is done. Run
// two or more with the same --config: they share the lanes.
func runWebhooksCommand(ctx context.Context, args []string, stderr io.Writer) error {
	return runCommand(ctx, &webhooksCommand{}, args, stderr)
}

// webhooksCommand is one run of a dispatcher: parse, then run's steps,
// and one cleanup path.
type webhooksCommand struct {
	cleanups

	natsURL, natsCreds, natsCA, config, listen, instance string
	logLevel, logFormat                                  string
	leaseTTL, stateMaxAge, deadLetterMaxAge, configPoll  time.Duration
	replicas                                             int

	lg  *slog.Logger
	cfg *webhook.Config
	nc  *nats.Conn
	d   *webhook.Dispatcher
	reg *prometheus.Registry
}

func (c *webhooksCommand) parse(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("presenced webhooks", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.natsURL, "nats", "nats://127.0.0.1:4222", "NATS server URL")
	fs.StringVar(&c.natsCreds, "nats-creds", "", "NATS .creds file (user JWT and seed), for a secured NATS")
	fs.StringVar(&c.natsCA, "nats-ca", "", "PEM CA of the NATS servers' certificates (tls:// URLs)")
	fs.StringVar(&c.config, "config", "", "endpoints file, YAML or JSON (required; reloaded on SIGHUP and when it changes)")
	fs.DurationVar(&c.configPoll, "config-poll", time.Second, "how often the config file is looked at for changes")
	fs.StringVar(&c.listen, "listen", "", "serve /metrics and /healthz on this address (e.g. :9091); off when empty")
	fs.StringVar(&c.instance, "instance", "", "this dispatcher's name in the leases (A-Z a-z 0-9 - _; default random)")
	fs.DurationVar(&c.leaseTTL, "lease-ttl", webhook.DefaultLeaseTTL, "a dead dispatcher's lanes are taken over within this")
	fs.DurationVar(&c.stateMaxAge, "state-max-age", webhook.DefaultStateMaxAge, "how long a room's delivery position is kept after its last event (keep it above the streams' max age)")
	fs.DurationVar(&c.deadLetterMaxAge, "dead-letter-max-age", webhook.DefaultDeadLetterMaxAge, "how long dead-lettered batches are kept")
	fs.IntVar(&c.replicas, "replicas", 1, "replicas of the state bucket and the dead-letter stream")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&c.logFormat, "log-format", "text", "text or json")
	fs.Usage = groupedUsage(fs, commandIntro[fs.Name()], "")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	lg, err := newLogger(stderr, c.logLevel, c.logFormat)
	if err != nil {
		return err
	}
	c.lg = lg
	if c.config == "" {
		return &usageError{"--config is required: the endpoints file (docs/WEBHOOKS.md)"}
	}
	if c.cfg, err = webhook.LoadConfigFile(c.config); err != nil {
		return &usageError{err.Error()}
	}
	return nil
}

// run connects NATS, serves health at once, starts the dispatcher and
// reloads its configuration on SIGHUP or a change of the file until ctx
// is done.
func (c *webhooksCommand) run(ctx context.Context) error {
	nc, err := connectForever(c.natsURL, c.natsCreds, c.natsCA, "presenced webhooks")
	if err != nil {
		return err
	}
	c.nc = nc
	c.onClose(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(webhook.PublishAsyncTimeout))
	if err != nil {
		return err
	}
	c.reg = prometheus.NewRegistry()
	c.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	c.d, err = webhook.New(webhook.Options{JetStream: js, Config: c.cfg, Instance: c.instance, LeaseTTL: c.leaseTTL,
		StateMaxAge: c.stateMaxAge, DeadLetterMaxAge: c.deadLetterMaxAge, Replicas: c.replicas, Registerer: c.reg, Logger: c.lg})
	if err != nil {
		return &usageError{err.Error()}
	}
	if err := c.serveHTTP(); err != nil {
		return err
	}
	if err := c.d.Start(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // a signal while starting
		}
		return err
	}
	c.onClose(c.d.Close)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	reload := make(chan struct{}, 1)
	go func() {
		for range hup {
			select {
			case reload <- struct{}{}:
			default:
			}
		}
	}()
	c.lg.Info("presenced: webhooks running", "nats", c.natsURL, "config", c.config, "lanes", len(c.cfg.Lanes()))
	webhook.WatchConfig(ctx, c.config, c.configPoll, reload, c.d)
	c.lg.Info("presenced: webhooks stopping")
	return nil
}

func (c *webhooksCommand) serveHTTP() error {
	if c.listen == "" {
		return nil
	}
	stop, err := serveOps(c.listen, c.reg, c.health, nil, 0, c.lg, "webhooks")
	if err != nil {
		return err
	}
	c.onClose(stop)
	return nil
}

// webhooksHealth is the body of a dispatcher's /healthz.
type webhooksHealth struct {
	Status string               `json:"status"` // ok, starting, nats_disconnected
	NATS   string               `json:"nats"`
	Lanes  []webhook.LaneStatus `json:"lanes"`
}

// health answers 200 once started while NATS is connected, else 503. A
// dispatcher holding no lane is healthy: it is ready to take over.
func (c *webhooksCommand) health(w http.ResponseWriter, _ *http.Request) {
	h := webhooksHealth{Status: "ok", NATS: c.nc.Status().String(), Lanes: c.d.Status()}
	code := http.StatusOK
	switch {
	case !c.nc.IsConnected():
		h.Status, code = "nats_disconnected", http.StatusServiceUnavailable
	case !c.d.Started():
		h.Status, code = "starting", http.StatusServiceUnavailable
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(h)
}

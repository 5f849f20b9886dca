package webhook

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	mrand "math/rand/v2"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// DefaultLeaseTTL is how long a dead dispatcher's lanes wait for
// another: the lease of a lane outlives its holder by at most this. An
// attempt starts only while the lease holds for its whole timeout, and a
// lease is refreshed every quarter TTL, so the TTL is at least twice the
// longest endpoint timeout.
const DefaultLeaseTTL = 30 * time.Second

// PublishAsyncTimeout is the publish-ack timeout the dispatcher's
// JetStream context should be made with
// (jetstream.WithPublishAsyncTimeout): positions are written pipelined,
// and without it an ack that never comes keeps its publish pending for
// good (the dispatcher's own waits end with their contexts).
const PublishAsyncTimeout = 10 * time.Second

// Options configure a Dispatcher. JetStream and Config are required.
type Options struct {
	JetStream        jetstream.JetStream // made with jetstream.WithPublishAsyncTimeout(PublishAsyncTimeout)
	Config           *Config
	Instance         string        // names this dispatcher in leases; default random
	LeaseTTL         time.Duration // default DefaultLeaseTTL, at least 1s
	StateMaxAge      time.Duration // default DefaultStateMaxAge
	DeadLetterMaxAge time.Duration // default DefaultDeadLetterMaxAge
	Replicas         int           // of the state bucket and the dead-letter stream; default 1
	Storage          jetstream.StorageType
	Registerer       prometheus.Registerer // default: a registry of its own
	Logger           *slog.Logger          // default: discard
}

// Dispatcher delivers the configured streams to the configured
// endpoints, sharing the lanes with the other dispatchers of the same
// NATS (leases in StateBucket).
type Dispatcher struct {
	opts   Options
	js     jetstream.JetStream
	st     *state
	m      *metrics
	lg     *slog.Logger
	cfg    atomic.Pointer[Config]
	leases *leases

	mu        sync.Mutex
	lanes     map[LaneID]*lane // running, lease held
	releasing map[LaneID]*lane // stopping gracefully, lease held until done
	created   map[LaneID]time.Time

	rndMu   sync.Mutex
	rndSrc  *mrand.Rand
	updates chan bool // a new config was stored; true: lift 410s too
	gone    chan LaneID
	cancel  context.CancelFunc
	done    chan struct{}
	started atomic.Bool
}

// New checks opts and returns a Dispatcher; Start runs it.
func New(opts Options) (*Dispatcher, error) {
	if opts.JetStream == nil || opts.Config == nil {
		return nil, errors.New("webhook: JetStream and Config are required")
	}
	if opts.Instance == "" {
		var b [9]byte
		_, _ = rand.Read(b[:])
		opts.Instance = base64.RawURLEncoding.EncodeToString(b[:])
	}
	if checkName(opts.Instance) != nil {
		return nil, fmt.Errorf("webhook: instance %q: only A-Z a-z 0-9 - _, at most 32 bytes", opts.Instance)
	}
	opts.LeaseTTL = max(cmpOr(opts.LeaseTTL, DefaultLeaseTTL), time.Second)
	opts.StateMaxAge = cmpOr(opts.StateMaxAge, DefaultStateMaxAge)
	opts.DeadLetterMaxAge = cmpOr(opts.DeadLetterMaxAge, DefaultDeadLetterMaxAge)
	opts.Replicas = max(opts.Replicas, 1)
	if opts.Registerer == nil {
		opts.Registerer = prometheus.NewRegistry()
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if err := checkTimeouts(opts.Config, opts.LeaseTTL); err != nil {
		return nil, err
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	st := newState(opts.JetStream, stateConfig{MaxAge: opts.StateMaxAge, Replicas: opts.Replicas, LeaseTTL: opts.LeaseTTL, Storage: opts.Storage})
	d := &Dispatcher{opts: opts, js: opts.JetStream, st: st, m: m, lg: opts.Logger,
		leases: newLeases(st, opts.Instance, opts.LeaseTTL, opts.Logger), lanes: map[LaneID]*lane{}, releasing: map[LaneID]*lane{},
		created: map[LaneID]time.Time{}, rndSrc: mrand.New(mrand.NewPCG(mrand.Uint64(), mrand.Uint64())),
		updates: make(chan bool, 1), gone: make(chan LaneID, 16), done: make(chan struct{})}
	d.cfg.Store(opts.Config)
	return d, nil
}

func cmpOr(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

func (d *Dispatcher) rnd() float64 {
	d.rndMu.Lock()
	defer d.rndMu.Unlock()
	return d.rndSrc.Float64()
}

// Start makes the state bucket and the dead-letter stream (waiting while
// JetStream does not answer, until ctx ends) and starts taking lanes.
// The dispatcher then runs until Close.
func (d *Dispatcher) Start(ctx context.Context) error {
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		err := d.prepare(ctx)
		if err == nil {
			break
		}
		d.lg.Warn("webhook: waiting for JetStream", "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
	lctx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	d.started.Store(true)
	go d.loop(lctx)
	return nil
}

func (d *Dispatcher) prepare(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := d.st.bucket(ctx); err != nil {
		return err
	}
	_, err := d.js.CreateOrUpdateStream(ctx, deadLetterConfig(d.opts.DeadLetterMaxAge, d.opts.Replicas, d.opts.Storage))
	if err != nil {
		return fmt.Errorf("webhook: dead-letter stream: %w", err)
	}
	return nil
}

// Close stops every lane (an attempt in flight is let finish), gives
// the leases up and returns once done.
func (d *Dispatcher) Close() {
	if d.cancel == nil {
		return
	}
	d.cancel()
	<-d.done
}

// Reload swaps the configuration in: lanes of removed endpoints or
// sources are given up, new ones taken, running ones take the new
// settings, and endpoints stopped by a 410 Gone deliver again.
func (d *Dispatcher) Reload(cfg *Config) error {
	if err := checkTimeouts(cfg, d.opts.LeaseTTL); err != nil {
		d.ReloadFailed()
		return err
	}
	d.cfg.Store(cfg)
	d.m.reloads.WithLabelValues("ok").Inc()
	select {
	case d.updates <- true:
	default:
	}
	return nil
}

// checkTimeouts refuses an endpoint whose attempts could outlast a lease
// refreshed a quarter TTL ago.
func checkTimeouts(c *Config, leaseTTL time.Duration) error {
	for _, e := range c.Endpoints {
		if time.Duration(e.Timeout) > leaseTTL/2 {
			return fmt.Errorf("webhook: config: endpoint %s: timeout %v must be at most half the lease TTL (%v): raise --lease-ttl",
				e.Name, time.Duration(e.Timeout), leaseTTL)
		}
	}
	return nil
}

// ReloadFailed counts a configuration that could not be used: the
// dispatcher keeps the one it has.
func (d *Dispatcher) ReloadFailed() { d.m.reloads.WithLabelValues("error").Inc() }

// Status reports the lanes this dispatcher delivers.
func (d *Dispatcher) Status() []LaneStatus {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]LaneStatus, 0, len(d.lanes))
	for _, ln := range d.lanes {
		out = append(out, *ln.status.Load())
	}
	return out
}

// Started reports whether Start has returned.
func (d *Dispatcher) Started() bool { return d.started.Load() }

func (d *Dispatcher) lastCreated(l LaneID) time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.created[l]
}

func (d *Dispatcher) setLastCreated(l LaneID, t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.created[l] = t
}

// offset spreads where dispatchers start looking for free lanes.
func (d *Dispatcher) offset(n int) int {
	h := fnv.New32a()
	h.Write([]byte(d.opts.Instance))
	return int(h.Sum32() % uint32(max(n, 1)))
}

// runtime is the endpoint's configuration and client, made once per
// change of the endpoint.
func runtimeOf(e *Endpoint, old *endpointRT) *endpointRT {
	if old != nil && reflect.DeepEqual(*old.e, *e) {
		return old
	}
	return &endpointRT{e: e, client: newClient(e)}
}

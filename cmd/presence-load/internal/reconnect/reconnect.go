// Package reconnect is the reconnect storm (docs/BENCHMARKS.md): the
// sessions of dead nodes back within a minute on one Redis, through
// stand-ins for nodes that use the node's own join limiter and extender
// on the store.
package reconnect

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/cmd/presence-load/internal/cli"
	"github.com/presence-dev/presence/cmd/presence-load/internal/measure"
	"github.com/presence-dev/presence/node"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/region"
)

type reconnectOpts struct {
	Redis       string        `flag:"redis" default:"127.0.0.1:6379" help:"the region's Redis (host:port)"`
	NatsURL     string        `flag:"nats" default:"nats://127.0.0.1:4222" help:"NATS with JetStream: the region's stream"`
	Region      string        `flag:"region" default:"storm" help:"the region"`
	Sessions    int           `flag:"sessions" default:"200000" help:"sessions that reconnect"`
	PerRoom     int           `flag:"per-room" default:"50" help:"sessions per room"`
	Nodes       int           `flag:"nodes" default:"14" help:"stand-in nodes the clients reconnect to (15,000 connections each is 14 for 200,000)"`
	OldNodes    int           `flag:"old-nodes" default:"14" help:"stand-in nodes that hold the sessions before the storm, then die"`
	Window      time.Duration `flag:"window" default:"60s" help:"clients make their first attempt uniformly within this"`
	After       time.Duration `flag:"after" default:"20s" help:"how long to keep measuring after every client is held again"`
	JoinRate    float64       `flag:"join-rate" help:"per stand-in node, as presenced --join-rate; negative: the code before the limiter (MaxInflight and AdmitWait only)"`
	JoinRateMin float64       `flag:"join-rate-min" help:"as presenced --join-rate-min (0: min(100, --join-rate))"`
	JoinLatency time.Duration `flag:"join-latency" help:"as presenced --join-latency"`
	MaxRetry    time.Duration `flag:"max-retry-after" default:"15s" help:"as presenced --max-retry-after"`
	Extend      bool          `flag:"extend" default:"true" help:"keep the sessions of refused clients (false: the code before the extender)"`
	MaxInflight int           `flag:"max-inflight" help:"joins waiting on the store per stand-in node; past it a join is refused (the node's MaxInflight)"`
	Batch       int           `flag:"batch" help:"sessions per claim and refresh call (the node's TouchBatch)"`
	Greedy      float64       `flag:"greedy" help:"share of clients (0..1) that resend their join every --greedy-every whatever retry_after_ms says"`
	GreedyEvery time.Duration `flag:"greedy-every" default:"120ms" help:"how often a greedy client resends a refused join"`
	Fair        bool          `flag:"fair" default:"true" help:"hold refused joins to their hints, as the node does (nodestorm.Appointments; false: the code before)"`
}

// rclient is one reconnecting client.
type rclient struct {
	ref      presence.SessionRef
	idx      int
	first    time.Time // its first attempt
	expires  time.Time // when its session expires unless claimed or extended
	held     atomic.Int64
	attempts atomic.Int32
	greedy   bool         // ignores the hint: resends every --greedy-every
	admitted atomic.Int64 // unix ns of the attempt that was admitted
}

// rstats are the run's counts, shared by the stand-ins.
type rstats struct {
	mu         sync.Mutex
	hints      []time.Duration
	refused    atomic.Int64
	retried    atomic.Int64
	admitted   atomic.Int64
	held       atomic.Int64
	claimErrs  atomic.Int64
	claimCalls atomic.Int64
	claimNanos atomic.Int64
	lastHeld   atomic.Int64 // unix ns
	served     atomic.Int64 // joins that got their snapshot
	lastServed atomic.Int64 // unix ns
	tickOver   atomic.Int64 // heartbeat ticks that overran their period
	tickMax    atomic.Int64 // ns
	refreshed  atomic.Int64
}

func (s *rstats) hint(d time.Duration) {
	s.mu.Lock()
	s.hints = append(s.hints, d)
	s.mu.Unlock()
}

// Run is the reconnect mode: it runs the storm and prints its figures.
func Run(ctx context.Context, args []string, out io.Writer) error {
	// The stand-in nodes' defaults are the node's.
	o := reconnectOpts{JoinRate: node.DefaultJoinRate, JoinLatency: node.DefaultJoinLatency, MaxInflight: node.DefaultMaxInflight, Batch: node.DefaultTouchBatch}
	if _, err := cli.Parse("reconnect", args, &o); err != nil {
		return err
	}
	if o.Sessions < 1 || o.PerRoom < 1 || o.Nodes < 1 || o.OldNodes < 1 || o.Batch < 1 || o.Window <= 0 {
		return errors.New("reconnect: --sessions, --per-room, --nodes, --old-nodes and --batch must be positive, --window too")
	}
	r, err := newReconnectRun(ctx, o, out)
	if err != nil {
		return err
	}
	defer r.close()
	return r.run(ctx)
}

type reconnectRun struct {
	o       reconnectOpts
	out     io.Writer
	rdb     *redis.Client
	nc      *nats.Conn
	js      jetstream.JetStream
	timing  presence.Timing
	clients []*rclient
	stats   rstats
	count   *transitionCount
	closers []func()
}

func newReconnectRun(ctx context.Context, o reconnectOpts, out io.Writer) (*reconnectRun, error) {
	r := &reconnectRun{o: o, out: out, timing: presence.Timing{}}
	r.rdb = redis.NewClient(&redis.Options{Addr: o.Redis, PoolSize: 256})
	r.closers = append(r.closers, func() { _ = r.rdb.Close() })
	if err := r.rdb.Ping(ctx).Err(); err != nil {
		r.close()
		return nil, fmt.Errorf("redis %s: %w", o.Redis, err)
	}
	nc, err := nats.Connect(o.NatsURL)
	if err != nil {
		r.close()
		return nil, fmt.Errorf("nats %s: %w", o.NatsURL, err)
	}
	r.nc = nc
	r.closers = append(r.closers, nc.Close)
	if r.js, err = jetstream.New(nc); err != nil {
		r.close()
		return nil, err
	}
	if _, err := bus.EnsureStream(ctx, r.js, bus.StreamConfig{Region: o.Region}); err != nil {
		r.close()
		return nil, err
	}
	if r.count, err = countTransitions(nc, o.Region); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

func (r *reconnectRun) close() {
	for i := len(r.closers) - 1; i >= 0; i-- {
		r.closers[i]()
	}
}

// store makes a region.Store for holder, publishing to the region's
// stream as presenced does.
func (r *reconnectRun) store(holder string, async bool) (*region.Store, error) {
	pub := bus.NewPublisher(r.js, r.o.Region)
	return region.New(r.rdb, region.Options{Region: r.o.Region, Holder: holder, Sink: pub, AsyncDelivery: async,
		Logger: slog.New(slog.DiscardHandler)})
}

func (r *reconnectRun) run(ctx context.Context) error {
	if err := r.setup(ctx); err != nil {
		return err
	}
	nctx, stopNodes := context.WithCancel(ctx)
	defer stopNodes()
	nodes, err := r.startNodes(nctx)
	if err != nil {
		return err
	}
	r.timing = nodes[0].store.Timing()
	return r.storm(ctx, nodes, stopNodes)
}

// setup has the old nodes claim every session, then die.
func (r *reconnectRun) setup(ctx context.Context) error {
	o := r.o
	r.clients = make([]*rclient, o.Sessions)
	for i := range r.clients {
		r.clients[i] = &rclient{idx: i, ref: presence.SessionRef{Room: "room" + strconv.Itoa(i/o.PerRoom),
			User: "u" + strconv.Itoa(i), Session: "s"}, greedy: float64(i%1000) < o.Greedy*1000}
	}
	t0 := time.Now()
	old := make([]*region.Store, o.OldNodes)
	for i := range old {
		s, err := r.store(fmt.Sprintf("old%d", i), false)
		if err != nil {
			return err
		}
		old[i] = s
	}
	ttl := old[0].Timing().SessionTTL
	per := (o.Sessions + o.OldNodes - 1) / o.OldNodes
	errs := make(chan error, o.OldNodes)
	for n, s := range old {
		go func() {
			errs <- r.claimAll(ctx, s, r.clients[min(n*per, o.Sessions):min((n+1)*per, o.Sessions)], ttl)
		}()
	}
	for range old {
		if err := <-errs; err != nil {
			return fmt.Errorf("setup: %w", err)
		}
	}
	fmt.Fprintf(r.out, "setup: %d sessions in %d rooms claimed by %d old nodes in %v; they refresh nothing from now on\n",
		o.Sessions, (o.Sessions+o.PerRoom-1)/o.PerRoom, o.OldNodes, time.Since(t0).Round(time.Millisecond))
	return nil
}

// claimAll claims cs on s in batches, noting when each expires.
func (r *reconnectRun) claimAll(ctx context.Context, s *region.Store, cs []*rclient, ttl time.Duration) error {
	for len(cs) > 0 {
		b := cs[:min(len(cs), r.o.Batch)]
		cs = cs[len(b):]
		refs := make([]presence.SessionRef, len(b))
		for i, c := range b {
			refs[i] = c.ref
		}
		start := time.Now()
		if _, err := s.Claim(ctx, refs); err != nil {
			return err
		}
		for _, c := range b {
			c.expires = start.Add(ttl).Truncate(time.Second).Add(time.Second) // rounded up, seconds
		}
	}
	return nil
}

// transitionCount counts the region's transitions on NATS, by client.
type transitionCount struct {
	mu     sync.Mutex
	on     bool
	byUser map[int][]string // client index -> "kind/reason"
	other  int
}

func countTransitions(nc *nats.Conn, reg string) (*transitionCount, error) {
	tc := &transitionCount{byUser: map[int][]string{}}
	_, err := nc.Subscribe(bus.Root+"."+reg+".>", func(m *nats.Msg) {
		t, err := bus.DecodeEvent(m.Data)
		tc.mu.Lock()
		defer tc.mu.Unlock()
		if !tc.on {
			return
		}
		i, perr := strconv.Atoi(strings.TrimPrefix(t.User, "u"))
		if err != nil || perr != nil || !strings.HasPrefix(t.User, "u") {
			tc.other++
			return
		}
		tc.byUser[i] = append(tc.byUser[i], string(t.Kind)+"/"+string(t.Reason))
	})
	if err != nil {
		return nil, err
	}
	return tc, nc.Flush()
}

func (tc *transitionCount) start() {
	tc.mu.Lock()
	tc.on = true
	tc.mu.Unlock()
}

// streamMsgs is the region stream's message count.
func (r *reconnectRun) streamMsgs(ctx context.Context) uint64 {
	s, err := r.js.Stream(ctx, bus.StreamName(r.o.Region))
	if err != nil {
		return 0
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0
	}
	return info.State.Msgs
}

// redisCPUSeries samples Redis's CPU each second until stop is closed:
// the share of a core per second.
func (r *reconnectRun) redisCPUSeries(stop <-chan struct{}) <-chan []float64 {
	res := make(chan []float64, 1)
	go func() {
		var series []float64
		prev, _ := measure.RedisCPU(r.o.Redis)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		last := time.Now()
		for {
			select {
			case <-stop:
				res <- series
				return
			case now := <-t.C:
				cur, err := measure.RedisCPU(r.o.Redis)
				if err == nil {
					series = append(series, (cur-prev)/now.Sub(last).Seconds())
					prev, last = cur, now
				}
			}
		}
	}()
	return res
}

// sortedHints returns a sorted copy of the hints given.
func (s *rstats) sortedHints() []time.Duration {
	s.mu.Lock()
	h := slices.Clone(s.hints)
	s.mu.Unlock()
	sort.Slice(h, func(i, j int) bool { return h[i] < h[j] })
	return h
}

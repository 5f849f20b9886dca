package main

// The reconnect mode: the storm of 200,000 sessions of a region
// coming back within a minute onto one Redis, driven on the store by
// stand-ins for nodes. A region that size needs 14 nodes of 15,000
// connections and as many client processes again (20,000 open files
// each); this machine's two cores cannot run 28 processes of WebSockets
// and still measure Redis, so the sessions' clients are goroutines and
// each stand-in node is what a node does with a join, in process, with
// the node package's own code: nodestorm.JoinLimiter admits or refuses (and
// gives the retry hint the client honours, with its own ±25 % jitter),
// nodestorm.Extender keeps the sessions of refused clients, and a
// region.Store (one holder per stand-in, its own reaper, publishing to
// the region's JetStream stream like presenced) claims, reads the
// room's snapshot and refreshes every heartbeat. Nothing of Redis,
// NATS or the store is simulated.
//
// Before the storm, --old-nodes stand-ins that then die claim every
// session (their expiry is a TTL after that); none of them refreshes
// again. Each client makes its first attempt at a uniformly random
// moment of --window. A client whose first attempt comes before its
// session expired is "inside": the goal is no transition for it.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
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
	"github.com/presence-dev/presence/node"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/region"
)

type reconnectOpts struct {
	redis, natsURL, region string
	sessions, perRoom      int
	nodes, oldNodes        int
	window, after          time.Duration
	joinRate, joinRateMin  float64
	joinLatency, maxRetry  time.Duration
	extend                 bool
	maxInflight            int
	batch                  int
	greedy                 float64       // share of clients that ignore the hint
	greedyEvery            time.Duration // how often they resend
	fair                   bool          // nodestorm.Appointments hold refused joins to their hints
}

func reconnectFlags(fs *flag.FlagSet, o *reconnectOpts) {
	fs.StringVar(&o.redis, "redis", "127.0.0.1:6379", "the region's Redis (host:port)")
	fs.StringVar(&o.natsURL, "nats", "nats://127.0.0.1:4222", "NATS with JetStream: the region's stream")
	fs.StringVar(&o.region, "region", "storm", "the region")
	fs.IntVar(&o.sessions, "sessions", 200000, "sessions that reconnect")
	fs.IntVar(&o.perRoom, "per-room", 50, "sessions per room")
	fs.IntVar(&o.nodes, "nodes", 14, "stand-in nodes the clients reconnect to (15,000 connections each is 14 for 200,000)")
	fs.IntVar(&o.oldNodes, "old-nodes", 14, "stand-in nodes that hold the sessions before the storm, then die")
	fs.DurationVar(&o.window, "window", 60*time.Second, "clients make their first attempt uniformly within this")
	fs.DurationVar(&o.after, "after", 20*time.Second, "how long to keep measuring after every client is held again")
	fs.Float64Var(&o.joinRate, "join-rate", node.DefaultJoinRate, "per stand-in node, as presenced --join-rate; negative: the code before the limiter (MaxInflight and AdmitWait only)")
	fs.Float64Var(&o.joinRateMin, "join-rate-min", 0, "as presenced --join-rate-min (0: min(100, --join-rate))")
	fs.DurationVar(&o.joinLatency, "join-latency", node.DefaultJoinLatency, "as presenced --join-latency")
	fs.DurationVar(&o.maxRetry, "max-retry-after", 15*time.Second, "as presenced --max-retry-after")
	fs.BoolVar(&o.extend, "extend", true, "keep the sessions of refused clients (false: the code before the extender)")
	fs.IntVar(&o.maxInflight, "max-inflight", node.DefaultMaxInflight, "joins waiting on the store per stand-in node; past it a join is refused (the node's MaxInflight)")
	fs.IntVar(&o.batch, "batch", node.DefaultTouchBatch, "sessions per claim and refresh call (the node's TouchBatch)")
	fs.Float64Var(&o.greedy, "greedy", 0, "share of clients (0..1) that resend their join every --greedy-every whatever retry_after_ms says")
	fs.DurationVar(&o.greedyEvery, "greedy-every", 120*time.Millisecond, "how often a greedy client resends a refused join")
	fs.BoolVar(&o.fair, "fair", true, "hold refused joins to their hints, as the node does (nodestorm.Appointments; false: the code before)")
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

// reconnect runs the storm and prints its figures.
func reconnect(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("presence-load reconnect", flag.ContinueOnError)
	var o reconnectOpts
	reconnectFlags(fs, &o)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.sessions < 1 || o.perRoom < 1 || o.nodes < 1 || o.oldNodes < 1 || o.batch < 1 || o.window <= 0 {
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
	r.rdb = redis.NewClient(&redis.Options{Addr: o.redis, PoolSize: 256})
	r.closers = append(r.closers, func() { _ = r.rdb.Close() })
	if err := r.rdb.Ping(ctx).Err(); err != nil {
		r.close()
		return nil, fmt.Errorf("redis %s: %w", o.redis, err)
	}
	nc, err := nats.Connect(o.natsURL)
	if err != nil {
		r.close()
		return nil, fmt.Errorf("nats %s: %w", o.natsURL, err)
	}
	r.nc = nc
	r.closers = append(r.closers, nc.Close)
	if r.js, err = jetstream.New(nc); err != nil {
		r.close()
		return nil, err
	}
	if _, err := bus.EnsureStream(ctx, r.js, bus.StreamConfig{Region: o.region}); err != nil {
		r.close()
		return nil, err
	}
	if r.count, err = countTransitions(nc, o.region); err != nil {
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
	pub := bus.NewPublisher(r.js, r.o.region)
	return region.New(r.rdb, region.Options{Region: r.o.region, Holder: holder, Sink: pub, AsyncDelivery: async,
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
	r.clients = make([]*rclient, o.sessions)
	for i := range r.clients {
		r.clients[i] = &rclient{idx: i, ref: presence.SessionRef{Room: "room" + strconv.Itoa(i/o.perRoom),
			User: "u" + strconv.Itoa(i), Session: "s"}, greedy: float64(i%1000) < o.greedy*1000}
	}
	t0 := time.Now()
	old := make([]*region.Store, o.oldNodes)
	for i := range old {
		s, err := r.store(fmt.Sprintf("old%d", i), false)
		if err != nil {
			return err
		}
		old[i] = s
	}
	ttl := old[0].Timing().SessionTTL
	per := (o.sessions + o.oldNodes - 1) / o.oldNodes
	errs := make(chan error, o.oldNodes)
	for n, s := range old {
		go func() {
			errs <- r.claimAll(ctx, s, r.clients[min(n*per, o.sessions):min((n+1)*per, o.sessions)], ttl)
		}()
	}
	for range old {
		if err := <-errs; err != nil {
			return fmt.Errorf("setup: %w", err)
		}
	}
	fmt.Fprintf(r.out, "setup: %d sessions in %d rooms claimed by %d old nodes in %v; they refresh nothing from now on\n",
		o.sessions, (o.sessions+o.perRoom-1)/o.perRoom, o.oldNodes, time.Since(t0).Round(time.Millisecond))
	return nil
}

// claimAll claims cs on s in batches, noting when each expires.
func (r *reconnectRun) claimAll(ctx context.Context, s *region.Store, cs []*rclient, ttl time.Duration) error {
	for len(cs) > 0 {
		b := cs[:min(len(cs), r.o.batch)]
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
	s, err := r.js.Stream(ctx, bus.StreamName(r.o.region))
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
		prev, _ := redisCPU(r.o.redis)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		last := time.Now()
		for {
			select {
			case <-stop:
				res <- series
				return
			case now := <-t.C:
				cur, err := redisCPU(r.o.redis)
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

// jitter is a client's own jitter on a hint: ±25 %, as the JS client's.
func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.75 + 0.5*rand.Float64()))
}

// Package regionload is the region mode: a region on a Redis Cluster
// driven directly on the store by region-driver child processes standing
// in for nodes, with the region's global publisher and an aggregator.
package regionload

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/cmd/presence-load/internal/cli"
	"github.com/presence-dev/presence/cmd/presence-load/internal/measure"
	"github.com/presence-dev/presence/cmd/presence-load/internal/worker"
	"github.com/presence-dev/presence/global"
	"github.com/presence-dev/presence/node"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/region"
)

// The region mode measures one region's store on a Redis Cluster, driven
// directly by region-driver child processes standing in for nodes
// (regiondriver.go): seed the sessions, refresh them flat out for a
// while (the refresh throughput), then keep them alive on the node's
// heartbeat at the default timing with every driver's reaper, a churn of
// 1 % a minute and the region's global publisher and an aggregator
// running, and report whether heartbeat rounds complete within the
// heartbeat, the reaper's and the publisher's lag, and Redis CPU per
// master (INFO cpu deltas).

type regionOpts struct {
	Cluster    string        `flag:"cluster" help:"comma-separated addresses of the Redis Cluster's masters"`
	Nats       string        `flag:"nats" help:"NATS URL (JetStream on) for the global publisher and aggregator; empty: none"`
	Sessions   int           `flag:"sessions" default:"1000000" help:"sessions of the region"`
	Room       int           `flag:"per-room" default:"100" help:"sessions per room (two per user)"`
	Drivers    int           `flag:"drivers" default:"4" help:"driver processes standing in for nodes"`
	Inflight   int           `flag:"inflight" default:"2" help:"flat-out Refresh batches in flight per driver"`
	Flat       time.Duration `flag:"flat" default:"20s" help:"flat-out refresh phase (0: skip)"`
	Warm       time.Duration `flag:"warm" default:"20s" help:"heartbeat phase before the measured window"`
	Hold       time.Duration `flag:"hold" default:"2m" help:"measured window of the heartbeat phase (0: skip the phase)"`
	Churn      float64       `flag:"churn" default:"0.01" help:"share of the sessions replaced per minute in the heartbeat phase"`
	ProbeEvery time.Duration `flag:"probe-every" default:"10s" help:"publisher-lag probes and reaper-lag reads this often"`
}

func parseRegionOpts(args []string) (regionOpts, error) {
	var o regionOpts
	if _, err := cli.Parse("region", args, &o); err != nil {
		return o, err
	}
	if o.Cluster == "" || o.Sessions < 2 || o.Drivers < 1 || o.Inflight < 1 {
		return o, errors.New("region: --cluster, --sessions >= 2, --drivers >= 1 and --inflight >= 1 are required")
	}
	return o, nil
}

// startDriver starts region-driver i.
// Each drives with the node's heartbeat slots and touch batch.
func startDriver(o regionOpts, i int) (*worker.Proc, error) {
	spec, err := json.Marshal(driverSpec{Cluster: o.Cluster, Index: i, Drivers: o.Drivers, Sessions: o.Sessions, Room: o.Room,
		Churn: o.Churn, Inflight: o.Inflight, Slots: node.DefaultHeartbeatSlots, BatchSize: node.DefaultTouchBatch})
	if err != nil {
		return nil, err
	}
	return worker.Start("region-driver", string(spec))
}

// ask sends op (with body) to every driver at once and returns their
// answers, each within timeout.
func ask(ds []*worker.Proc, op string, body any, timeout time.Duration) ([]driverReport, error) {
	out := make([]driverReport, len(ds))
	err := worker.Each(ds, func(i int, d *worker.Proc) error { return d.CallWithin(timeout, op, body, &out[i]) })
	return out, err
}

// masters returns the addresses of the cluster's masters.
func masters(ctx context.Context, cc *redis.ClusterClient) ([]string, error) {
	var mu sync.Mutex
	var out []string
	err := cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		out = append(out, c.Options().Addr)
		mu.Unlock()
		return nil
	})
	slices.Sort(out)
	return out, err
}

// cpuOf reads every master's Redis CPU (seconds).
func cpuOf(addrs []string) ([]float64, error) {
	out := make([]float64, len(addrs))
	for i, a := range addrs {
		v, err := measure.RedisCPU(a)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// toolCPU is the CPU (seconds) used so far by the drivers, in all, and by
// this process (the publisher, the aggregator and the probes).
func toolCPU(ds []*worker.Proc) (drivers, self float64) {
	for _, d := range ds {
		v, _ := measure.ProcCPU(d.Pid())
		drivers += v
	}
	self, _ = measure.ProcCPU(os.Getpid())
	return drivers, self
}

// fmtMasterCPU formats per-master CPU deltas over window as % of a core.
func fmtMasterCPU(addrs []string, a, b []float64, window time.Duration) (string, float64) {
	var parts []string
	var sum float64
	for i := range addrs {
		d := b[i] - a[i]
		sum += d
		parts = append(parts, fmt.Sprintf("%s %.1f%%", addrs[i], d/window.Seconds()*100))
	}
	return strings.Join(parts, ", "), sum
}

// Run is the region mode: a region on a Redis Cluster driven by
// region-driver children, seeded, refreshed flat out, then kept alive on
// the node's heartbeat.
func Run(ctx context.Context, args []string, out io.Writer) error {
	o, err := parseRegionOpts(args)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cc, st, err := newClusterStore(o.Cluster, region.SinkFunc(func(context.Context, []presence.Transition) (uint64, error) { return 0, nil }), log)
	if err != nil {
		return err
	}
	defer cc.Close()
	addrs, err := masters(ctx, cc)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "region: %d sessions (rooms of %d, 2 per user), %d drivers, %d masters: %s; timing %+v\n",
		o.Sessions, o.Room, o.Drivers, len(addrs), strings.Join(addrs, " "), st.Timing())
	ds := make([]*worker.Proc, 0, o.Drivers)
	defer func() {
		for _, d := range ds {
			d.Stop()
		}
	}()
	for i := range o.Drivers {
		d, err := startDriver(o, i)
		if err != nil {
			return err
		}
		ds = append(ds, d)
	}
	r := &regionRun{o: o, out: out, log: log, cc: cc, st: st, addrs: addrs, ds: ds}
	if err := r.seed(); err != nil {
		return err
	}
	if err := r.settle(ctx); err != nil {
		return err
	}
	if o.Flat > 0 {
		for _, rr := range []bool{false, true} {
			if err := r.flatOut(rr); err != nil {
				return err
			}
		}
	}
	if o.Hold > 0 {
		return r.heartbeat(ctx)
	}
	return nil
}

// regionRun is one run of the region mode.
type regionRun struct {
	o     regionOpts
	out   io.Writer
	log   *slog.Logger
	cc    *redis.ClusterClient
	st    *region.Store
	addrs []string
	ds    []*worker.Proc
}

func (r *regionRun) seed() error {
	p, err := r.phase("seed", nil, 30*time.Minute)
	if err != nil {
		return err
	}
	fmt.Fprintf(r.out, "seed: %d sessions claimed in %v (%.0f/s); Redis CPU %.1f s in all (%.2f µs/session): %s\n",
		p.n, p.took.Round(time.Millisecond), float64(p.n)/p.took.Seconds(), p.sum, p.sum*1e6/float64(p.n), p.per)
	return nil
}

// phaseResult is a phase the drivers ran: the sessions they counted, the
// errors, how long it took, and the masters' CPU over it (per master,
// and the sum in seconds).
type phaseResult struct {
	n, errs int64
	took    time.Duration
	per     string
	sum     float64
}

// phase has every driver run op (body) and reads the masters' CPU around
// it.
func (r *regionRun) phase(op string, body any, timeout time.Duration) (phaseResult, error) {
	var p phaseResult
	c0, err := cpuOf(r.addrs)
	if err != nil {
		return p, err
	}
	t0 := time.Now()
	reps, err := ask(r.ds, op, body, timeout)
	if err != nil {
		return p, err
	}
	p.took = time.Since(t0)
	c1, err := cpuOf(r.addrs)
	if err != nil {
		return p, err
	}
	for _, rep := range reps {
		p.n, p.errs = p.n+rep.N, p.errs+rep.Errors
	}
	p.per, p.sum = fmtMasterCPU(r.addrs, c0, c1, p.took)
	return p, nil
}

// settle sweeps until no room is overdue: the seed's rooms come due a
// publish lease after their claims, and no reaper runs before the
// heartbeat phase.
func (r *regionRun) settle(ctx context.Context) error {
	t0 := time.Now()
	for sweeps := 1; ; sweeps++ {
		n, err := r.st.Sweep(ctx)
		if err != nil {
			return err
		}
		d, err := r.st.Overdue(ctx)
		if err != nil {
			return err
		}
		if d < time.Second {
			fmt.Fprintf(r.out, "settled: %d sweeps, %d transitions delivered again, in %v\n", sweeps, n, time.Since(t0).Round(time.Millisecond))
			return nil
		}
		if time.Since(t0) > 5*time.Minute {
			return fmt.Errorf("settle: a room still overdue by %v after %v", d, time.Since(t0))
		}
	}
}

// flatOut runs a flat-out phase: the node's batches, or those of its
// former round-robin schedule (see flatBatches).
func (r *regionRun) flatOut(roundRobin bool) error {
	name := "flat out, the node's batches"
	if roundRobin {
		name = "flat out, the former round-robin batches"
	}
	p, err := r.phase("flat", flatReq{For: r.o.Flat, RoundRobin: roundRobin}, r.o.Flat+time.Minute)
	if err != nil {
		return err
	}
	rate := float64(p.n) / p.took.Seconds()
	fmt.Fprintf(r.out, "%s: %d refreshes in %v = %.0f sessions/s (%d batches in flight in all, %d errors); Redis %.2f µs/session; CPU per master: %s\n",
		name, p.n, p.took.Round(time.Millisecond), rate, r.o.Drivers*r.o.Inflight, p.errs, p.sum*1e6/float64(p.n), p.per)
	hb := presence.DefaultHeartbeat
	fmt.Fprintf(r.out, "  at this rate one heartbeat (%v) refreshes %.0f sessions\n", hb, rate*hb.Seconds())
	return nil
}

// startGlobal starts the region's publisher and an aggregator on NATS.
func (r *regionRun) startGlobal(ctx context.Context) (*global.RegionPublisher, *global.Aggregator, func(), error) {
	nc, err := nats.Connect(r.o.Nats)
	if err != nil {
		return nil, nil, nil, err
	}
	anc, err := nats.Connect(r.o.Nats)
	if err != nil {
		nc.Close()
		return nil, nil, nil, err
	}
	js, _ := jetstream.New(nc)
	ajs, _ := jetstream.New(anc)
	closeAll := func() { nc.Close(); anc.Close() }
	agg, err := global.NewAggregator(global.AggregatorConfig{NATS: anc, JetStream: ajs, Storage: jetstream.MemoryStorage, Logger: r.log, Regions: []string{"load"}})
	if err == nil {
		err = agg.Start(ctx)
	}
	if err != nil {
		closeAll()
		return nil, nil, nil, err
	}
	pub, err := global.NewRegionPublisher(global.PublisherConfig{Region: "load", Source: r.st, NATS: nc, JetStream: js, Storage: jetstream.MemoryStorage, Logger: r.log})
	if err == nil {
		err = pub.Start(ctx)
	}
	if err != nil {
		agg.Close()
		closeAll()
		return nil, nil, nil, err
	}
	return pub, agg, func() { pub.Close(); agg.Close(); closeAll() }, nil
}

// driverStats follows the drivers' stats lines.
type driverStats struct {
	mu      sync.Mutex
	last    []driverReport
	maxGap  float64
	stale   int
	maxBat  float64
	counted bool // gaps and stale count only once the window is open
}

// follow polls driver i for its stats every statEvery until stop is
// closed.
func (s *driverStats) follow(i int, d *worker.Proc, stop <-chan struct{}) {
	t := time.NewTicker(statEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		var rep driverReport
		if d.CallWithin(time.Minute, "stat", nil, &rep) != nil {
			return
		}
		s.mu.Lock()
		s.last[i] = rep
		if s.counted {
			s.maxGap, s.stale, s.maxBat = max(s.maxGap, rep.MaxGap), max(s.stale, rep.Stale), max(s.maxBat, rep.MaxBatch)
		}
		s.mu.Unlock()
	}
}

// statEvery is how often the heartbeat phase polls the drivers.
const statEvery = 5 * time.Second

// totals sums the drivers' last lines.
func (s *driverStats) totals() (refreshed, errs, churned, transitions int64, held int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.last {
		refreshed, errs, churned, transitions, held = refreshed+l.N, errs+l.Errors, churned+l.Churned, transitions+l.Transitions, held+l.Held
	}
	return
}

// heartbeat runs the heartbeat phase: warm-up, then the measured window.
func (r *regionRun) heartbeat(ctx context.Context) error {
	stats := &driverStats{last: make([]driverReport, len(r.ds))}
	if _, err := ask(r.ds, "run", nil, time.Minute); err != nil {
		return err
	}
	stopStats := make(chan struct{})
	var following sync.WaitGroup
	for i, d := range r.ds {
		following.Add(1)
		go func() { defer following.Done(); stats.follow(i, d, stopStats) }()
	}
	defer func() { close(stopStats); following.Wait() }()
	var pub *global.RegionPublisher
	var agg *global.Aggregator
	if r.o.Nats != "" {
		p, a, stop, err := r.startGlobal(ctx)
		if err != nil {
			return err
		}
		defer stop()
		pub, agg = p, a
	}
	fmt.Fprintf(r.out, "heartbeat: drivers keep the sessions alive on the node's heartbeat; %v warm-up, then %v measured\n", r.o.Warm, r.o.Hold)
	time.Sleep(r.o.Warm)
	c0, err := cpuOf(r.addrs)
	if err != nil {
		return err
	}
	d0, s0 := toolCPU(r.ds)
	n0, _, ch0, tr0, _ := stats.totals()
	stats.mu.Lock()
	stats.counted = true
	stats.mu.Unlock()
	t0 := time.Now()
	overdue, lags := r.probe(ctx, t0.Add(r.o.Hold), pub, agg)
	took := time.Since(t0)
	c1, err := cpuOf(r.addrs)
	if err != nil {
		return err
	}
	d1, s1 := toolCPU(r.ds)
	n1, errs, ch1, tr1, held := stats.totals()
	stats.mu.Lock()
	maxGap, stale, maxBat := stats.maxGap, stats.stale, stats.maxBat
	stats.mu.Unlock()
	per, sum := fmtMasterCPU(r.addrs, c0, c1, took)
	hb := r.st.Timing().Heartbeat
	fmt.Fprintf(r.out, "window %v: %d sessions held; %d refreshes = %.0f sessions/s (a heartbeat's worth: %.0f/s); %d errors; churn %d replaced; %d transitions delivered\n",
		took.Round(time.Millisecond), held, n1-n0, float64(n1-n0)/took.Seconds(), float64(held)/hb.Seconds(), errs, ch1-ch0, tr1-tr0)
	fmt.Fprintf(r.out, "  heartbeat: longest gap between two refreshes of one session %.2f s (heartbeat %v); at most %d sessions unrefreshed past a heartbeat and a tick; slowest batch %.0f ms\n",
		maxGap, hb, stale, maxBat)
	fmt.Fprintf(r.out, "  Redis CPU per master (%% of a core): %s; sum %.1f%% = %.2f µs/refresh\n", per, sum/took.Seconds()*100, sum*1e6/float64(max(1, n1-n0)))
	fmt.Fprintf(r.out, "  drivers' CPU %.1f%% of a core in all; this process (publisher, aggregator, probes) %.1f%%\n",
		(d1-d0)/took.Seconds()*100, (s1-s0)/took.Seconds()*100)
	fmt.Fprintf(r.out, "  reaper: most overdue room %v at worst over %d reads\n", slices.Max(append(overdue, 0)).Round(time.Millisecond), len(overdue))
	if pub != nil {
		r.reportPub(pub, lags)
	}
	// A session is due every heartbeat; a tick late is still in time.
	within := maxGap <= (hb+hb/node.DefaultHeartbeatSlots).Seconds() && stale == 0 && errs == 0
	fmt.Fprintf(r.out, "  heartbeat rounds within the heartbeat: %v\n", within)
	_, err = ask(r.ds, worker.OpClose, nil, time.Minute)
	return err
}

func (r *regionRun) reportPub(pub *global.RegionPublisher, lags []time.Duration) {
	ps := pub.Stats()
	line := fmt.Sprintf("  publisher: %d deltas, %d fulls, %d whole reads, %d read errors, %d send errors", ps.Deltas.Load(), ps.Fulls.Load(), ps.WholeReads.Load(), ps.ReadErrors.Load(), ps.SendErrors.Load())
	if len(lags) > 0 {
		slices.Sort(lags)
		line += fmt.Sprintf("; global-view lag over %d joins p50 %v max %v (cadence %v)", len(lags), lags[len(lags)/2].Round(time.Millisecond), lags[len(lags)-1].Round(time.Millisecond), global.DefaultCadence)
	}
	fmt.Fprintln(r.out, line)
}

// probe reads the reaper's lag and, with a publisher, times probe joins
// to the aggregator's view, every probeEvery until end.
func (r *regionRun) probe(ctx context.Context, end time.Time, pub *global.RegionPublisher, agg *global.Aggregator) (overdue, lags []time.Duration) {
	rng := rand.New(rand.NewPCG(5, 6))
	for i := 0; time.Now().Before(end); i++ {
		next := time.Now().Add(r.o.ProbeEvery)
		if d, err := r.st.Overdue(ctx); err == nil {
			overdue = append(overdue, d)
		} else {
			fmt.Fprintf(r.out, "  overdue read failed: %v\n", err)
		}
		if pub != nil && pub.Active() {
			x := presence.SessionRef{Room: fmt.Sprintf("room%06d", rng.IntN(max(1, r.o.Sessions/r.o.Room))), User: fmt.Sprintf("probe%03d", i), Session: "p"}
			if lag, ok := r.probeJoin(ctx, agg, x, min(time.Until(end), 4*global.DefaultCadence)); ok {
				lags = append(lags, lag)
			}
		}
		time.Sleep(time.Until(next))
	}
	return overdue, lags
}

// probeJoin claims x and times it to the aggregator's union; it releases
// x after.
func (r *regionRun) probeJoin(ctx context.Context, agg *global.Aggregator, x presence.SessionRef, wait time.Duration) (time.Duration, bool) {
	if _, err := r.st.Claim(ctx, []presence.SessionRef{x}); err != nil {
		fmt.Fprintf(r.out, "  probe claim failed: %v\n", err)
		return 0, false
	}
	defer func() { _ = r.st.Release(ctx, x) }()
	t0 := time.Now()
	for time.Since(t0) < wait {
		if len(agg.Union(x.Room)[x.User]) > 0 {
			return time.Since(t0), true
		}
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Fprintf(r.out, "  probe %s/%s not in the global view after %v\n", x.Room, x.User, wait)
	return 0, false
}

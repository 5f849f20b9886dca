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
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/cmd/presence-load/internal/worker"
	"github.com/presence-dev/presence/node"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/region"
)

// A region-driver child stands in for one node of the region mode: it
// holds its share of the region's sessions in the region's store (a
// Redis Cluster) and keeps them alive on the node's own heartbeat
// (node.HeartbeatDriver) from the moment each is claimed. Told so on
// stdin, it seeds them, refreshes them flat out besides, or starts its
// store's reaper and a churn of clean closes and new sessions. It
// answers each command with one JSON line on stdout, and once the reaper
// and churn run answers its parent's polls for stats (package worker's
// protocol: seed, flat, run, stat, close).

// driverSpec is what a driver is started with: one JSON argument, from
// its parent's flags.
type driverSpec struct {
	Cluster   string  `json:"cluster"`  // the Redis Cluster's addresses, comma-separated
	Index     int     `json:"index"`    // this driver's number, from 0
	Drivers   int     `json:"drivers"`  // drivers in all
	Sessions  int     `json:"sessions"` // sessions of the whole region
	Room      int     `json:"per_room"` // sessions per room
	Churn     float64 `json:"churn"`    // share of the sessions replaced per minute
	Inflight  int     `json:"inflight"` // flat-out Refresh batches in flight
	Slots     int     `json:"slots"`    // heartbeat slots
	BatchSize int     `json:"batch"`    // sessions per Refresh
}

// driverReport is a driver's answer to seed, flat, stat and close.
type driverReport struct {
	N        int64   `json:"n,omitempty"`
	Secs     float64 `json:"secs,omitempty"`
	Held     int     `json:"held,omitempty"`
	Batches  int64   `json:"batches,omitempty"`
	Errors   int64   `json:"errors,omitempty"`
	MaxBatch float64 `json:"max_batch_ms,omitempty"`
	// MaxGap is the longest time between two refreshes of one session
	// ended in the interval; Stale the sessions unrefreshed for longer
	// than a heartbeat and a tick when it ended.
	MaxGap      float64 `json:"max_gap_s,omitempty"`
	Stale       int     `json:"stale,omitempty"`
	Churned     int64   `json:"churned,omitempty"`
	Transitions int64   `json:"transitions,omitempty"`
	Sweeps      int64   `json:"sweeps,omitempty"`
	Claimed     int64   `json:"claimed_sweeps,omitempty"`
}

func parseDriverSpec(args []string) (driverSpec, error) {
	var d driverSpec
	if len(args) != 1 || json.Unmarshal([]byte(args[0]), &d) != nil {
		return d, errors.New("region-driver: one argument, the driver's spec as JSON, is required (the region mode starts its drivers)")
	}
	if d.Cluster == "" || d.Sessions < 2 || d.Drivers < 1 || d.Index < 0 || d.Index >= d.Drivers || d.Room < 2 || d.Slots < 1 || d.BatchSize < 1 {
		return d, errors.New("region-driver: cluster, sessions >= 2, per_room >= 2, slots and batch >= 1 and 0 <= index < drivers are required")
	}
	return d, nil
}

// regionRefs returns driver index's share of a region of n sessions:
// rooms of perRoom sessions, two per user (8-byte user ids, 12-byte
// random session ids), in a join order shared by all drivers (random,
// so a driver's batches span many rooms, as a node's do) and dealt out
// round robin.
func regionRefs(n, perRoom, index, drivers int) []presence.SessionRef {
	order := rand.New(rand.NewPCG(7, 11)).Perm(n)
	rng := rand.New(rand.NewPCG(uint64(index)+100, 13))
	refs := make([]presence.SessionRef, 0, n/drivers+1)
	for p := index; p < len(order); p += drivers {
		j := order[p]
		refs = append(refs, presence.SessionRef{Room: fmt.Sprintf("room%06d", j/perRoom), User: fmt.Sprintf("u%07d", j/2), Session: sessionID(rng)})
	}
	return refs
}

func sessionID(rng *rand.Rand) string {
	const alpha = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	var b [12]byte
	for i := range b {
		b[i] = alpha[rng.IntN(len(alpha))]
	}
	return string(b[:])
}

// newClusterStore connects to the cluster and returns a region store on
// it (region "load", default timing) delivering to sink.
func newClusterStore(addrs string, sink region.Sink, log *slog.Logger) (*redis.ClusterClient, *region.Store, error) {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(addrs, ","), PoolSize: 32})
	st, err := region.New(cc, region.Options{Region: "load", Sink: sink, Logger: log})
	if err != nil {
		_ = cc.Close()
		return nil, nil, err
	}
	if err := st.Preload(context.Background()); err != nil {
		_ = cc.Close()
		return nil, nil, err
	}
	return cc, st, nil
}

// gapStore is the store as the heartbeat sees it, timing every session's
// refreshes: the longest gap between two refreshes of one session is
// what decides whether the heartbeat keeps up with the TTL.
type gapStore struct {
	*region.Store
	mu     sync.Mutex
	last   map[presence.SessionRef]time.Time
	maxGap time.Duration // since the last stats line
}

func (g *gapStore) Refresh(ctx context.Context, refs []presence.SessionRef) (presence.TouchResult, error) {
	res, err := g.Store.Refresh(ctx, refs)
	if err == nil {
		now := time.Now()
		g.mu.Lock()
		for _, r := range refs {
			if t, ok := g.last[r]; ok {
				g.maxGap = max(g.maxGap, now.Sub(t))
				g.last[r] = now
			}
		}
		g.mu.Unlock()
	}
	return res, err
}

func (g *gapStore) track(r presence.SessionRef, now time.Time) {
	g.mu.Lock()
	g.last[r] = now
	g.mu.Unlock()
}

func (g *gapStore) untrack(r presence.SessionRef) {
	g.mu.Lock()
	delete(g.last, r)
	g.mu.Unlock()
}

// take returns the longest gap since the last call and the sessions not
// refreshed for longer than stale.
func (g *gapStore) take(stale time.Duration) (time.Duration, int) {
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, t := range g.last {
		if now.Sub(t) > stale {
			n++
		}
	}
	gap := g.maxGap
	g.maxGap = 0
	return gap, n
}

// regionDriver is the state of one driver process.
type regionDriver struct {
	spec        driverSpec
	store       *region.Store
	gaps        *gapStore
	refs        []presence.SessionRef
	transitions atomic.Int64
	batches     atomic.Int64
	errs        atomic.Int64
	refreshed   atomic.Int64
	churned     atomic.Int64
	maxBatch    atomic.Int64 // ns, since the last stats line
	hb          *node.HeartbeatDriver
}

// DriverMain is a region-driver: one node's share of the region's
// sessions, serving its parent's requests on in and out (package
// worker), its spec the one argument.
func DriverMain(ctx context.Context, args []string, in io.Reader, out io.Writer) error {
	spec, err := parseDriverSpec(args)
	if err != nil {
		return err
	}
	d := &regionDriver{spec: spec}
	sink := region.SinkFunc(func(_ context.Context, ts []presence.Transition) (uint64, error) {
		d.transitions.Add(int64(len(ts)))
		return 0, nil
	})
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cc, st, err := newClusterStore(spec.Cluster, sink, log)
	if err != nil {
		return err
	}
	defer cc.Close()
	d.store = st
	d.gaps = &gapStore{Store: st, last: map[presence.SessionRef]time.Time{}}
	d.refs = regionRefs(spec.Sessions, spec.Room, spec.Index, spec.Drivers)
	return d.serve(ctx, in, out, log)
}

// flatReq asks for a flat-out phase.
type flatReq struct {
	For        time.Duration `json:"for"`
	RoundRobin bool          `json:"round_robin,omitempty"`
}

// serve answers its parent: seed, flat, run (the heartbeat phase: the
// reaper and the churn), stat (the figures since the last stat) and
// close (stopped: the totals).
func (d *regionDriver) serve(ctx context.Context, in io.Reader, out io.Writer, log *slog.Logger) error {
	stopHB := d.startHeartbeat(ctx, log)
	defer stopHB()
	var stopRun func()
	stop := func() {
		if stopRun != nil {
			stopRun()
			stopRun = nil
		}
	}
	defer stop()
	return worker.Serve(ctx, in, out, map[string]worker.Op{
		"seed": func(ctx context.Context, _ json.RawMessage) (any, error) { return d.seed(ctx) },
		"flat": worker.Handle(func(ctx context.Context, f flatReq) (any, error) { return d.flat(ctx, f.For, f.RoundRobin), nil }),
		"run": worker.Do(func() {
			if stopRun == nil {
				stopRun = d.run(ctx)
			}
		}),
		"stat": func(context.Context, json.RawMessage) (any, error) { return d.stat(), nil },
		worker.OpClose: func(context.Context, json.RawMessage) (any, error) {
			stop()
			return driverReport{N: d.refreshed.Load(), Churned: d.churned.Load(), Transitions: d.transitions.Load(),
				Sweeps: d.store.Stats().Sweeps.Load(), Claimed: d.store.Stats().ClaimedSweeps.Load()}, nil
		},
	})
}

// seed claims the driver's sessions, and hands them to the heartbeat as
// they are claimed, 1,000 per call (a node's touch
// batch), two calls in flight: a gentle fill, not a storm (larger calls
// under a loaded machine time out their acks, and the reaper then
// delivers the events again).
func (d *regionDriver) seed(ctx context.Context) (driverReport, error) {
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	var firstErr atomic.Value
	const per = 1000
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(per)) - per
				if i >= len(d.refs) {
					return
				}
				chunk := d.refs[i:min(i+per, len(d.refs))]
				if _, err := d.store.Claim(ctx, chunk); err != nil {
					firstErr.CompareAndSwap(nil, err.Error())
					return
				}
				now := time.Now()
				for _, r := range chunk {
					d.gaps.track(r, now)
				}
				d.hb.Adopt(chunk)
			}
		}()
	}
	wg.Wait()
	if e, ok := firstErr.Load().(string); ok {
		return driverReport{}, errors.New(e)
	}
	return driverReport{N: int64(len(d.refs)), Secs: time.Since(start).Seconds()}, nil
}

// flatBatches cuts the driver's sessions as its heartbeat does (place
// and touchSlot in node/heartbeat.go, mirrored): in join order, each to
// the slot of its room's last session unless that slot holds a batch more
// than the least loaded (then to the least loaded); each slot sorted by
// room, in batches of batchSize. roundRobin is the node's schedule before
// rooms were grouped: the least loaded slot (round robin, as joins never
// leave), in join order, so a batch spans as many rooms as it has
// sessions.
func (d *regionDriver) flatBatches(roundRobin bool) [][]presence.SessionRef {
	per := make([][]presence.SessionRef, d.spec.Slots)
	roomSlot := map[string]int{}
	for i, r := range d.refs {
		best := i % len(per)
		if !roundRobin {
			for k := range per {
				if len(per[k]) < len(per[best]) {
					best = k
				}
			}
			if k, ok := roomSlot[r.Room]; ok && len(per[k]) < len(per[best])+d.spec.BatchSize {
				best = k
			}
			roomSlot[r.Room] = best
		}
		per[best] = append(per[best], r)
	}
	var out [][]presence.SessionRef
	for _, sl := range per {
		if !roundRobin {
			slices.SortStableFunc(sl, func(a, b presence.SessionRef) int { return strings.Compare(a.Room, b.Room) })
		}
		for len(sl) > 0 {
			n := min(d.spec.BatchSize, len(sl))
			out = append(out, sl[:n])
			sl = sl[n:]
		}
	}
	return out
}

// flat refreshes the driver's sessions as fast as the store takes them,
// in heartbeat-shaped batches (see flatBatches), for dur.
func (d *regionDriver) flat(ctx context.Context, dur time.Duration, roundRobin bool) driverReport {
	batches := d.flatBatches(roundRobin)
	var next, n, errs atomic.Int64
	var wg sync.WaitGroup
	hb0 := d.refreshed.Load()
	start := time.Now()
	end := start.Add(dur)
	for range d.spec.Inflight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) && ctx.Err() == nil {
				b := batches[int(next.Add(1)-1)%len(batches)]
				if _, err := d.store.Refresh(ctx, b); err != nil {
					errs.Add(1)
					continue
				}
				n.Add(int64(len(b)))
			}
		}()
	}
	wg.Wait()
	// The heartbeat's own refreshes meanwhile count too.
	return driverReport{N: n.Load() + d.refreshed.Load() - hb0, Secs: time.Since(start).Seconds(), Errors: errs.Load()}
}

// run keeps the sessions alive on the node's heartbeat, with the store's
// reaper and the churn running, until the returned stop is called.
func (d *regionDriver) run(ctx context.Context) (stop func()) {
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	d.store.Start()
	wg.Add(1)
	go func() { defer wg.Done(); d.churnLoop(rctx, d.hb) }()
	return func() {
		cancel()
		wg.Wait()
		d.store.Close()
	}
}

// startHeartbeat runs the node's heartbeat (node.HeartbeatDriver) on the
// sessions adopted, from the seed on, until the returned stop is called:
// a seed longer than the TTL would otherwise expire its first sessions.
func (d *regionDriver) startHeartbeat(ctx context.Context, log *slog.Logger) (stop func()) {
	observe := func(took time.Duration, n int, err error) {
		d.batches.Add(1)
		if err != nil {
			d.errs.Add(1)
			return
		}
		d.refreshed.Add(int64(n))
		for {
			old := d.maxBatch.Load()
			if int64(took) <= old || d.maxBatch.CompareAndSwap(old, int64(took)) {
				break
			}
		}
	}
	d.hb = node.NewHeartbeatDriver(d.gaps, d.spec.Slots, d.spec.BatchSize, 0, log, observe)
	hctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); d.hb.Run(hctx) }()
	return func() { cancel(); <-done }
}

// churnLoop replaces churn of the sessions a minute, in steps every 3 s: a
// clean close, then a new session of the same user in the same room.
func (d *regionDriver) churnLoop(ctx context.Context, hb *node.HeartbeatDriver) {
	const step = 3 * time.Second
	rng := rand.New(rand.NewPCG(uint64(d.spec.Index)+200, 17))
	t := time.NewTicker(step)
	defer t.Stop()
	var owed float64
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		owed += float64(len(d.refs)) * d.spec.Churn * step.Seconds() / 60
		for ; owed >= 1 && ctx.Err() == nil; owed-- {
			i := rng.IntN(len(d.refs))
			old := d.refs[i]
			d.gaps.untrack(old)
			if err := hb.Release(ctx, old); err != nil {
				d.errs.Add(1)
			}
			r := old
			r.Session = sessionID(rng)
			d.refs[i] = r
			d.gaps.track(r, time.Now())
			if err := hb.Hold(ctx, r); err != nil {
				d.errs.Add(1)
			}
			d.churned.Add(1)
		}
	}
}

// stat is the driver's figures: cumulative counts, and the longest
// refresh gap, the stale sessions and the slowest batch since the last
// stat.
func (d *regionDriver) stat() driverReport {
	tm := d.store.Timing()
	gap, n := d.gaps.take(tm.Heartbeat + tm.Heartbeat/time.Duration(d.spec.Slots))
	return driverReport{N: d.refreshed.Load(), Held: d.hb.Held(), Batches: d.batches.Load(), Errors: d.errs.Load(),
		MaxBatch: float64(d.maxBatch.Swap(0)) / 1e6, MaxGap: gap.Seconds(), Stale: n, Churned: d.churned.Load(),
		Transitions: d.transitions.Load(), Sweeps: d.store.Stats().Sweeps.Load(), Claimed: d.store.Stats().ClaimedSweeps.Load()}
}

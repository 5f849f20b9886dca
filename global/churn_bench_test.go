package global_test

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/global"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testnats"
	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/region"
)

// BenchmarkPublisherChurn measures the active publisher of a region of
// 10k, 100k and 1M sessions (rooms of 100: 50 users with two sessions
// each; 8-byte user ids, 12-byte session ids) under 1 % churn per minute
// (a session closed cleanly and another opened for its user, a seventh
// of them with a state), at the default 3 s cadence, in real time, with
// a real redis-server, nats-server (in process) and aggregator.
//
// Phase 1 runs 12 cadences by hand (global.Manual): before each, the
// cadence's share of churn (sessions/2000) and a reaper sweep, then the
// cadence alone between two reads of Redis's own CPU (INFO cpu): that is
// the publisher's Redis CPU, whatever else the machine runs. The first
// cadence of the term is the full. Phase 2 starts a publisher on its
// timer (a new term: a full, timed) with churn and the reaper running,
// and times 10 joins, at random phases of the cadence, from the join to
// the aggregator's union listing them: the global view's lag.
//
//	go test ./global -run '^$' -bench PublisherChurn -benchtime 1x -timeout 30m
func BenchmarkPublisherChurn(b *testing.B) {
	for _, size := range []int{10_000, 100_000, 1_000_000} {
		b.Run(fmt.Sprintf("sessions=%d", size), func(b *testing.B) { benchPublisherChurn(b, size) })
	}
}

func benchPublisherChurn(b *testing.B, size int) {
	const (
		perRoom  = 100
		cadence  = global.DefaultCadence
		cadences = 12
		probes   = 10
	)
	timing := presence.Timing{SessionTTL: time.Hour, Heartbeat: 20 * time.Minute, OfflineGrace: 6 * time.Second, ReapInterval: time.Second, LastSeenInterval: 20 * time.Minute}
	srv := testredis.Start(b)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64})
	b.Cleanup(func() { _ = rdb.Close() })
	st, err := region.New(rdb, region.Options{Region: "eu", Timing: timing, Logger: quiet,
		Sink: region.SinkFunc(func(context.Context, []presence.Transition) (uint64, error) { return 0, nil })})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := st.Preload(ctx); err != nil {
		b.Fatal(err)
	}

	// Seed: claims of whole rooms, 10,000 sessions per call, 4 at once.
	rng := mrand.New(mrand.NewPCG(1, 2))
	const alpha = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	sid := func() string {
		var s [12]byte
		for i := range s {
			s[i] = alpha[rng.IntN(len(alpha))]
		}
		return string(s[:])
	}
	refs := make([]presence.SessionRef, 0, size)
	for i := range size / 2 {
		room, user := fmt.Sprintf("room%05d", i/(perRoom/2)), fmt.Sprintf("u%07d", i)
		refs = append(refs, ref(room, user, sid()), ref(room, user, sid()))
	}
	seedStart := time.Now()
	var (
		wg   sync.WaitGroup
		next int
		mu   sync.Mutex
	)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				i := next
				next += 10000
				mu.Unlock()
				if i >= len(refs) {
					return
				}
				if _, err := st.Claim(ctx, refs[i:min(i+10000, len(refs))]); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if b.Failed() {
		return
	}
	b.Logf("seeded %d sessions in %d rooms in %v", size, size/perRoom, time.Since(seedStart).Round(time.Millisecond))

	// churn replaces n sessions: a clean close, and a new session of the
	// same user (with a state, one in seven).
	var churnMu sync.Mutex
	churn := func(n int) {
		churnMu.Lock()
		defer churnMu.Unlock()
		for range n {
			i := rng.IntN(len(refs))
			if err := st.Release(ctx, refs[i]); err != nil {
				b.Error(err)
				return
			}
			refs[i].Session = sid()
			if _, err := st.Claim(ctx, []presence.SessionRef{refs[i]}); err != nil {
				b.Error(err)
				return
			}
			if rng.IntN(7) == 0 {
				if _, err := st.SetState(ctx, refs[i], []byte(`{"status":"away"}`)); err != nil {
					b.Error(err)
					return
				}
			}
		}
	}
	perCadence := size / 2000 // 1 % a minute, at 20 cadences a minute

	ns := testnats.Start(b)
	nc := testnats.Connect(b, ns)
	js, _ := jetstream.New(nc)
	anc := testnats.Connect(b, ns)
	ajs, _ := jetstream.New(anc)
	agg, err := global.NewAggregator(global.AggregatorConfig{NATS: anc, JetStream: ajs,
		Cadence: cadence, Storage: jetstream.MemoryStorage, Logger: quiet, Regions: []string{"eu"}})
	if err != nil {
		b.Fatal(err)
	}
	if err := agg.Start(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(agg.Close)
	newPub := func(manual bool) *global.RegionPublisher {
		cfg := global.PublisherConfig{Region: "eu", Source: st, NATS: nc, JetStream: js, Cadence: cadence, Storage: jetstream.MemoryStorage, Logger: quiet}
		if manual {
			global.Manual(&cfg)
		}
		p, err := global.NewRegionPublisher(cfg)
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Start(ctx); err != nil {
			b.Fatal(err)
		}
		return p
	}
	cpu := func() time.Duration {
		info, err := rdb.InfoMap(ctx, "cpu").Result()
		if err != nil {
			b.Fatal(err)
		}
		var sum float64
		for _, k := range []string{"used_cpu_sys", "used_cpu_user"} {
			v, _ := strconv.ParseFloat(info["CPU"][k], 64)
			sum += v
		}
		return time.Duration(sum * float64(time.Second))
	}
	unionSize := func() int {
		n := 0
		for r := range size / perRoom {
			for _, ss := range agg.Union(fmt.Sprintf("room%05d", r)) {
				n += len(ss)
			}
		}
		return n
	}

	// Phase 1: cadences by hand.
	b.ResetTimer()
	pub := newPub(true)
	testkit.CheckFor(b, 30*time.Second, 10*time.Millisecond, func() error {
		if !pub.Active() {
			return errors.New("still waiting for the publisher's lease")
		}
		return nil
	})
	var cpus, walls []time.Duration
	var bytes []int64
	tick := time.NewTicker(cadence)
	for c := range cadences {
		if c > 0 {
			<-tick.C
			churn(perCadence)
			if _, err := st.Sweep(ctx); err != nil {
				b.Fatal(err)
			}
		}
		sent := pub.Stats().Bytes.Load()
		cpu0, t0 := cpu(), time.Now()
		global.RunCadence(ctx, pub)
		wall, used := time.Since(t0), cpu()-cpu0
		cpus, walls, bytes = append(cpus, used), append(walls, wall), append(bytes, pub.Stats().Bytes.Load()-sent)
		if c == 0 {
			testkit.CheckFor(b, time.Minute, 10*time.Millisecond, func() error { return testkit.AtLeast("the union at the aggregator, the full in", unionSize(), size) })
			tick.Reset(cadence)
		}
	}
	tick.Stop()
	if pub.Stats().WholeReads.Load() != 1 || pub.Stats().ReadErrors.Load() != 0 {
		b.Fatalf("whole reads %d, read errors %d: want 1 and 0", pub.Stats().WholeReads.Load(), pub.Stats().ReadErrors.Load())
	}
	genOf := func() (uint64, global.RegionState) {
		for _, rs := range agg.RegionStatuses() {
			if rs.Region == "eu" {
				return rs.Gen, rs.State
			}
		}
		return 0, ""
	}
	oldGen, _ := genOf()
	pub.Close()

	// Where a delta cadence's Redis CPU goes, besides reading the members
	// named: one cadence's churn, then the other reads one by one.
	_, cur, _, err := st.Changes(ctx, "", 1)
	if err != nil {
		b.Fatal(err)
	}
	churn(perCadence)
	if _, err := st.Sweep(ctx); err != nil {
		b.Fatal(err)
	}
	part := func(name string, f func() error) {
		c0 := cpu()
		if err := f(); err != nil {
			b.Fatal(err)
		}
		b.Logf("  %-44s Redis CPU %v", name, (cpu() - c0).Round(time.Microsecond))
	}
	part("Changes (the log since the last cadence)", func() error {
		_, _, _, err := st.Changes(ctx, cur, 1<<20)
		return err
	})
	// A slice is rooms/CheckEvery rooms (at 10k sessions, one room every
	// other cadence): read at least one.
	slice := make([]string, 0, max(1, size/perRoom/global.DefaultCheckEvery))
	for r := range cap(slice) {
		slice = append(slice, fmt.Sprintf("room%05d", r))
	}
	part(fmt.Sprintf("Entries (a check slice: %d rooms)", len(slice)), func() error {
		_, _, err := st.Entries(ctx, slice)
		return err
	})
	part("Rooms (once per check pass)", func() error {
		_, err := st.Rooms(ctx)
		return err
	})
	var sumCPU, maxCPU, sumWall time.Duration
	var sumBytes int64
	for i := 1; i < cadences; i++ {
		sumCPU, sumWall, sumBytes = sumCPU+cpus[i], sumWall+walls[i], sumBytes+bytes[i]
		maxCPU = max(maxCPU, cpus[i])
	}
	n := time.Duration(cadences - 1)
	perCad := sumCPU / n
	core := float64(perCad) / float64(cadence) * 100
	b.Logf("full (first cadence): Redis CPU %v, %d B, %v", cpus[0].Round(time.Microsecond), bytes[0], walls[0].Round(time.Millisecond))
	b.Logf("deltas (%d cadences, %d sessions replaced each): Redis CPU %v per cadence (max %v) = %.3f %% of a core; %d B per cadence; %v per cadence; repairs %d",
		cadences-1, perCadence, perCad.Round(time.Microsecond), maxCPU.Round(time.Microsecond), core, sumBytes/int64(n), (sumWall / n).Round(time.Microsecond), pub.Stats().Repairs.Load())
	b.ReportMetric(float64(perCad.Microseconds())/1000, "redis-ms/cadence")
	b.ReportMetric(core, "redis-%core")
	b.ReportMetric(float64(sumBytes)/float64(n), "B/cadence")
	b.ReportMetric(float64(cpus[0].Microseconds())/1000, "full-redis-ms")

	// Phase 2: a publisher on its timer; the lag of the global view.
	cctx, stop := context.WithCancel(ctx)
	var bg sync.WaitGroup
	bg.Add(2)
	go func() { defer bg.Done(); st.RunReaper(cctx) }()
	go func() {
		defer bg.Done()
		t := time.NewTicker(cadence)
		defer t.Stop()
		for {
			select {
			case <-cctx.Done():
				return
			case <-t.C:
				churn(perCadence)
			}
		}
	}()
	defer func() { stop(); bg.Wait() }()
	started := time.Now()
	live := newPub(false)
	defer live.Close()
	testkit.CheckFor(b, time.Minute, 10*time.Millisecond, func() error { return testkit.AtLeast("fulls of the new term", live.Stats().Fulls.Load(), 1) })
	b.Logf("a new term: active and its full sent %v after start", time.Since(started).Round(time.Millisecond))
	// The aggregator takes the new publisher once the old one has been
	// silent two cadences (docs/GLOBAL.md); the lag is measured after.
	testkit.CheckFor(b, time.Minute, 10*time.Millisecond, func() error {
		if g, s := genOf(); g == oldGen || s != global.RegionLive {
			return fmt.Errorf("the aggregator at generation %v (the old term's %v), region %v", g, oldGen, s)
		}
		return nil
	})
	b.Logf("the aggregator follows the new term %v after start", time.Since(started).Round(time.Millisecond))
	var lags []time.Duration
	for i := range probes {
		time.Sleep(time.Duration(rng.Int64N(int64(cadence))))
		x := ref(fmt.Sprintf("room%05d", rng.IntN(size/perRoom)), fmt.Sprintf("probe%02d", i), "p")
		if _, err := st.Claim(ctx, []presence.SessionRef{x}); err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		testkit.CheckFor(b, 4*cadence, 10*time.Millisecond, func() error {
			return testkit.Want("the probe's sessions in the global view", len(agg.Union(x.Room)[x.User]), 1)
		})
		lags = append(lags, time.Since(t0))
	}
	b.StopTimer()
	slices.Sort(lags)
	mx := lags[len(lags)-1]
	b.Logf("lag over %d joins: p50 %v max %v (%.2f cadences; target <= 2)", len(lags), lags[len(lags)/2].Round(time.Millisecond), mx.Round(time.Millisecond), float64(mx)/float64(cadence))
	b.ReportMetric(float64(mx.Milliseconds()), "lag-max-ms")
	b.ReportMetric(float64(mx)/float64(cadence), "lag-max/cadence")
	if live.Stats().ReadErrors.Load() != 0 {
		b.Errorf("%d read errors", live.Stats().ReadErrors.Load())
	}
}

package region

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
)

// On a Redis Cluster every room's keys and its reap index share a slot;
// rooms spread over all masters are reaped, each departure once.
func TestClusterRoomsOnManySlots(t *testing.T) {
	slow(t)
	cc, _ := testredis.Cluster(t, 3)
	c := &collector{}
	s := newStore(t, cc, c)
	if !s.cluster {
		t.Fatal("store did not detect the cluster")
	}
	ctx := context.Background()
	if err := s.Preload(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping of every master: %v", err)
	}

	// 30 rooms; check they land on all three masters.
	masters := map[string]bool{}
	var refs []presence.SessionRef
	for i := range 30 {
		room := fmt.Sprintf("room%d", i)
		addr, err := cc.MasterForKey(ctx, s.roomKeys(room).z)
		if err != nil {
			t.Fatal(err)
		}
		masters[addr.Options().Addr] = true
		refs = append(refs, ref(room, "u"+fmt.Sprint(i), "a"), ref(room, "w"+fmt.Sprint(i), "b"))
	}
	if len(masters) != 3 {
		t.Fatalf("rooms landed on %d masters, want 3", len(masters))
	}
	if ts := touch(t, s, refs...); len(ts) != 60 {
		t.Fatalf("joins: %d, want 60", len(ts))
	}
	if n, err := s.Count(ctx, "room7"); err != nil || n != 2 {
		t.Fatalf("count: %d %v", n, err)
	}
	if m := members(t, s, "room7"); len(m) != 2 || m["u7"] != 1 {
		t.Fatalf("members: %v", m)
	}
	// u* leave cleanly; w* are kept alive for a while, then abandoned.
	for i := range 30 {
		release(t, s, ref(fmt.Sprintf("room%d", i), "u"+fmt.Sprint(i), "a"))
	}
	r1 := startReaper(t, newStore(t, cc, c))
	r2 := startReaper(t, newStore(t, cc, c))
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		n := 0
		for _, tr := range c.All() {
			if tr.Kind == presence.Offline && tr.Reason == presence.Left {
				n++
			}
		}
		return testkit.Want("departures (left)", n, 30)
	})
	testkit.CheckFor(t, testTiming.SessionTTL+5*time.Second, 10*time.Millisecond, func() error {
		n := 0
		for _, tr := range c.All() {
			if tr.Kind == presence.Offline && tr.Reason == presence.Expired {
				n++
			}
		}
		return testkit.Want("departures (expired)", n, 30)
	})
	waitSweeps(t, 3, r1, r2) // the other reaper's sweeps too
	for i := range 30 {
		room := fmt.Sprintf("room%d", i)
		if n := len(c.Of(presence.Offline, room, "u"+fmt.Sprint(i))) + len(c.Of(presence.Offline, room, "w"+fmt.Sprint(i))); n != 2 {
			t.Fatalf("%s: %d offlines, want 2", room, n)
		}
	}
}

// A cluster sweep with nothing due reads every slot's index once.
func BenchmarkClusterIdleSweep(b *testing.B) {
	cc, _ := testredis.Cluster(b, 3)
	s := newStore(b, cc, &collector{})
	ctx := context.Background()
	if err := s.Preload(ctx); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		if _, err := s.reap(ctx, 0); err != nil {
			b.Fatal(err)
		}
	}
}

// The periodic reapers of several nodes share a cluster sweep: each
// master's slot indexes are read once per claim, by whichever reaper
// claims it first, not once per node; once the claim lapses the next
// sweep reads it again. Counted, not timed: the claim outlasts any
// sweep however loaded the machine, and lapses when the test expires it.
func TestClusterReapersShareTheSweep(t *testing.T) {
	slow(t)
	cc, _ := testredis.Cluster(t, 3)
	c := &collector{}
	stores := make([]*Store, 4)
	for i := range stores {
		stores[i] = newStore(t, cc, c)
	}
	ctx := context.Background()
	const claim = time.Minute
	counts := func() (claimed, shared int64) {
		for _, s := range stores {
			claimed += s.Stats().ClaimedSweeps.Load()
			shared += s.Stats().SharedSweeps.Load()
		}
		return claimed, shared
	}
	// markers returns the PTTL of every master's sweep marker.
	markers := func() []time.Duration {
		var mu sync.Mutex // ForEachMaster runs on goroutines of its own
		var out []time.Duration
		err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			keys, err := m.Keys(ctx, "*"+sweptSuffix).Result()
			if err != nil {
				return err
			}
			for _, k := range keys {
				d, err := m.PTTL(ctx, k).Result()
				if err != nil {
					return err
				}
				mu.Lock()
				out = append(out, d)
				mu.Unlock()
			}
			return nil
		})
		if err != nil {
			t.Fatalf("reading the sweep markers: %v", err)
		}
		return out
	}
	for round := 1; round <= 2; round++ {
		testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
			if m := markers(); len(m) != 0 {
				return fmt.Errorf("the last round's sweep claims still held, for %v", m)
			}
			return nil
		})
		for _, s := range stores {
			if _, err := s.reap(ctx, claim); err != nil {
				t.Fatal(err)
			}
		}
		claimed, shared := counts()
		if claimed != int64(3*round) || shared != int64(9*round) {
			t.Fatalf("round %d: %d master reads and %d left to another reaper, want %d and %d (4 reapers, 3 masters)",
				round, claimed, shared, 3*round, 9*round)
		}
		// One marker per master, lapsing by itself after the claim.
		ttls := markers()
		if len(ttls) != 3 {
			t.Fatalf("round %d: %d sweep markers, want one per master", round, len(ttls))
		}
		for _, d := range ttls {
			if d <= 0 || d > claim {
				t.Fatalf("round %d: a sweep marker lapses in %v, want within the claim (%v)", round, d, claim)
			}
		}
		// Lapse the claims for the next round.
		_ = cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			keys, _ := m.Keys(ctx, "*"+sweptSuffix).Result()
			for _, k := range keys {
				_ = m.PExpire(ctx, k, time.Millisecond).Err()
			}
			return nil
		})
	}
}

// BenchmarkClusterReapers measures the Redis CPU that idle reapers cost
// a 3-master cluster: 10 nodes' reapers at a 100 ms reap interval (ten
// times the default rate) for b.N seconds. shared is RunReaper (the sweep
// claimed per master); unshared has every reaper read every master.
//
//	go test ./region -run '^$' -bench ClusterReapers -benchtime 3x
func BenchmarkClusterReapers(b *testing.B) {
	cc, servers := testredis.Cluster(b, 3)
	ctx := context.Background()
	stores := make([]*Store, 10)
	for i := range stores {
		stores[i] = newStore(b, cc, &collector{})
		if err := stores[i].Preload(ctx); err != nil {
			b.Fatal(err)
		}
	}
	cpu := func() float64 {
		var sum float64
		for _, srv := range servers {
			c := redis.NewClient(&redis.Options{Addr: srv.Addr})
			info, err := c.InfoMap(ctx, "cpu").Result()
			c.Close()
			if err != nil {
				b.Fatal(err)
			}
			for _, k := range []string{"used_cpu_sys", "used_cpu_user"} {
				v, _ := strconv.ParseFloat(info["CPU"][k], 64)
				sum += v
			}
		}
		return sum
	}
	run := func(b *testing.B, sweep func(context.Context, *Store)) {
		start, cpu0 := time.Now(), cpu()
		rctx, cancel := context.WithTimeout(ctx, time.Duration(b.N)*time.Second)
		var wg sync.WaitGroup
		for _, s := range stores {
			wg.Add(1)
			go func() { defer wg.Done(); sweep(rctx, s) }()
		}
		wg.Wait()
		cancel()
		b.ReportMetric((cpu()-cpu0)*1000/time.Since(start).Seconds(), "redis-ms/s")
	}
	b.Run("shared", func(b *testing.B) { run(b, func(ctx context.Context, s *Store) { s.RunReaper(ctx) }) })
	b.Run("unshared", func(b *testing.B) {
		run(b, func(ctx context.Context, s *Store) {
			t := time.NewTicker(testTiming.ReapInterval)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					_, _ = s.reap(ctx, 0)
				}
			}
		})
	})
}

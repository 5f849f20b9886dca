package region

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
)

// On a Redis Cluster every room's keys and its reap index share a slot;
// rooms spread over all masters are reaped, each departure once.
func TestClusterRoomsOnManySlots(t *testing.T) {
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
		addr, err := cc.MasterForKey(ctx, s.roomBase(room))
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
	startReaper(t, newStore(t, cc, c))
	startReaper(t, newStore(t, cc, c))
	waitFor(t, 5*time.Second, "30 departures (left)", func() bool {
		n := 0
		for _, tr := range c.All() {
			if tr.Kind == presence.Offline && tr.Reason == presence.Left {
				n++
			}
		}
		return n == 30
	})
	waitFor(t, testTiming.SessionTTL+5*time.Second, "30 departures (expired)", func() bool {
		n := 0
		for _, tr := range c.All() {
			if tr.Kind == presence.Offline && tr.Reason == presence.Expired {
				n++
			}
		}
		return n == 30
	})
	time.Sleep(3 * testTiming.ReapInterval) // other reaper sweeps
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
		if _, err := s.Reap(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// The periodic reapers of several nodes share a cluster sweep: each
// master's slot indexes are read about once per reap interval in all,
// not once per node.
func TestClusterReapersShareTheSweep(t *testing.T) {
	cc, _ := testredis.Cluster(t, 3)
	c := &collector{}
	stores := make([]*Store, 4)
	for i := range stores {
		stores[i] = newStore(t, cc, c)
	}
	start := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, s := range stores {
		wg.Add(1)
		go func() { defer wg.Done(); s.RunReaper(ctx) }()
	}
	waitFor(t, 5*time.Second, "a second of sweeps", func() bool { return time.Since(start) > time.Second })
	cancel()
	wg.Wait()
	elapsed := time.Since(start)
	var claimed, shared int64
	for _, s := range stores {
		claimed += s.Stats().ClaimedSweeps.Load()
		shared += s.Stats().SharedSweeps.Load()
	}
	periods := float64(elapsed) / float64(sweepClaim(testTiming.ReapInterval))
	if most := int64(3 * (periods + 1)); claimed > most {
		t.Fatalf("%d master reads in %v, want at most %d (3 masters, one per claim)", claimed, elapsed, most)
	}
	if least := int64(3 * (float64(elapsed)/float64(testTiming.ReapInterval) - 2) / 2); claimed < least {
		t.Fatalf("%d master reads in %v, want at least %d: sweeps went missing", claimed, elapsed, least)
	}
	if shared == 0 {
		t.Fatal("no reaper found a master already claimed")
	}
	t.Logf("%v: %d master reads, %d left to another reaper (4 reapers, 3 masters)", elapsed.Round(time.Millisecond), claimed, shared)
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
					_, _ = s.Reap(ctx)
				}
			}
		})
	})
}

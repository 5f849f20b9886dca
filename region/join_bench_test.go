package region

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
)

// BenchmarkJoin is a join's work in Redis as a node does it: the claim
// of a new user's session in a room of up to 50 (its delivery acked by
// the sink), then the snapshot of the room for the join's reply. It
// reports Redis's CPU per join and each script's share, from INFO
// commandstats.
//
//	go test ./region -run '^$' -bench BenchmarkJoin
func BenchmarkJoin(b *testing.B) {
	srv := testredis.Start(b)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	b.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	s := newStore(b, rdb, &collector{})
	const rooms, per = 200, 50
	ref := func(i int) presence.SessionRef {
		return presence.SessionRef{Room: "room" + strconv.Itoa(i%rooms), User: fmt.Sprintf("u%07d", i), Session: "s0"}
	}
	for i := range rooms * (per - 1) {
		if _, err := s.Claim(ctx, []presence.SessionRef{ref(i)}); err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range [][]any{{"config", "set", "slowlog-log-slower-than", "0"}, {"config", "set", "slowlog-max-len", "1000000"}, {"slowlog", "reset"}} {
		if err := rdb.Do(ctx, c...).Err(); err != nil {
			b.Fatal(err)
		}
	}
	cpu0 := redisCPU(b, rdb)
	b.ResetTimer()
	for i := range b.N {
		r := ref(rooms*(per-1) + i)
		if _, err := s.Claim(ctx, []presence.SessionRef{r}); err != nil {
			b.Fatal(err)
		}
		if _, err := s.Snapshot(ctx, r.Room, 0, 1000); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	cpu := redisCPU(b, rdb) - cpu0
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "redis-µs/join")
	logs, err := rdb.SlowLogGet(ctx, -1).Result()
	if err != nil {
		b.Fatal(err)
	}
	names := map[string]string{scriptTouch.Hash(): "claim", scriptAck.Hash(): "ack", scriptSeen.Hash(): "seen",
		scriptSnapshot.Hash(): "snapshot"}
	by := map[string][]time.Duration{}
	for _, l := range logs {
		if len(l.Args) > 1 && strings.EqualFold(l.Args[0], "evalsha") {
			by[names[l.Args[1]]] = append(by[names[l.Args[1]]], l.Duration)
		}
	}
	for name, ds := range by {
		if name == "" {
			name = "other"
		}
		slices.Sort(ds)
		var sum time.Duration
		for _, d := range ds {
			sum += d
		}
		b.ReportMetric(float64(sum.Microseconds())/float64(b.N), name+"-µs/join")
		b.ReportMetric(float64(ds[len(ds)/2].Microseconds()), name+"-p50-µs")
	}
}

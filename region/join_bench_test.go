package region

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
)

// BenchmarkJoin is a join's work in Redis as a node does it: the claim
// of a new user's session in a room of up to 50 (its delivery acked by
// the sink), then the snapshot of the room for the join's reply, read by
// snapshot.lua (script) or as Snapshot reads it (snapshot: by a
// transaction once the room is marked small). It reports Redis's CPU per
// join (INFO cpu) and each script's time from SLOWLOG, per join and the
// median call (a transaction's commands are logged one by one, so its
// time is only in redis-µs/join).
//
//	go test ./region -run '^$' -bench BenchmarkJoin -benchtime 3000x
func BenchmarkJoin(b *testing.B) {
	for _, read := range []string{"script", "snapshot"} {
		b.Run(read, func(b *testing.B) { benchJoin(b, read == "script") })
	}
}

func benchJoin(b *testing.B, script bool) {
	rdb, _ := testredis.Client(b)
	ctx := context.Background()
	s := newStore(b, rdb, &collector{}, longTiming) // no session ends while measured
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
	snapshot := func(room string) error {
		_, err := s.Snapshot(ctx, room, 0, 1000)
		return err
	}
	if script {
		snapshot = func(room string) error {
			_, err := s.snapshotScript(ctx, presence.Snapshot{Region: "eu", Room: room}, 1000)
			return err
		}
	}
	cpu0 := redisCPU(b, rdb)
	b.ResetTimer()
	for i := range b.N {
		r := ref(rooms*(per-1) + i)
		if _, err := s.Claim(ctx, []presence.SessionRef{r}); err != nil {
			b.Fatal(err)
		}
		if err := snapshot(r.Room); err != nil {
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

// BenchmarkSnapshotReads is one snapshot of a room of 50 read both ways:
// by snapshot.lua and by the transaction of a room marked small. It
// reports Redis's CPU per read, its I/O included (INFO cpu).
//
//	go test ./region -run '^$' -bench BenchmarkSnapshotReads -benchtime 3000x
func BenchmarkSnapshotReads(b *testing.B) {
	rdb, _ := testredis.Client(b)
	ctx := context.Background()
	s := newStore(b, rdb, &collector{}, longTiming) // no session ends while measured
	for i := range 50 {
		if _, err := s.Claim(ctx, []presence.SessionRef{{Room: "r", User: fmt.Sprintf("u%07d", i), Session: "s0"}}); err != nil {
			b.Fatal(err)
		}
	}
	reads := map[string]func() error{
		"script": func() error {
			_, err := s.snapshotScript(ctx, presence.Snapshot{Region: "eu", Room: "r"}, 1000)
			return err
		},
		"transaction": func() error {
			s.small.note("r", true, time.Now())
			_, ok, err := s.snapshotTx(ctx, "r", 0, 1000)
			if err == nil && !ok {
				err = fmt.Errorf("the room of 50 was not read by a transaction")
			}
			return err
		},
	}
	for _, name := range []string{"script", "transaction"} {
		b.Run(name, func(b *testing.B) {
			cpu0 := redisCPU(b, rdb)
			for range b.N {
				if err := reads[name](); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64((redisCPU(b, rdb)-cpu0).Microseconds())/float64(b.N), "redis-µs/read")
		})
	}
}

package region

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
)

// benchRefs returns rooms*perRoom sessions, two per user, with ids shaped
// like real ones: 8-byte user ids and 12-byte random session ids.
func benchRefs(rooms, perRoom int) []presence.SessionRef {
	rng := rand.New(rand.NewPCG(1, 2))
	const alpha = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	sid := func() string {
		var b [12]byte
		for i := range b {
			b[i] = alpha[rng.IntN(len(alpha))]
		}
		return string(b[:])
	}
	refs := make([]presence.SessionRef, 0, rooms*perRoom)
	for r := range rooms {
		for u := range perRoom / 2 {
			user := fmt.Sprintf("u%07d", r*perRoom/2+u)
			for range 2 {
				refs = append(refs, presence.SessionRef{Room: "room" + strconv.Itoa(r), User: user, Session: sid()})
			}
		}
	}
	return refs
}

func usedMemory(b *testing.B, rdb *redis.Client) int64 {
	b.Helper()
	info, err := rdb.Info(context.Background(), "memory").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	b.Fatal("no used_memory in INFO")
	return 0
}

// parallel runs fn over refs with the given number of workers, each
// taking the next chunk.
func parallel(workers, chunk int, refs []presence.SessionRef, fn func([]presence.SessionRef) error) error {
	var (
		mu   sync.Mutex
		next int
		ferr error
		wg   sync.WaitGroup
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				i := next
				next += chunk
				mu.Unlock()
				if i >= len(refs) {
					return
				}
				if err := fn(refs[i:min(i+chunk, len(refs))]); err != nil {
					mu.Lock()
					ferr = err
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return ferr
}

// seedTouch is the three-round-trip touch this project replaces: ZADD on a
// per-user key, EXPIRE, ZADD on the room key.
func seedTouch(ctx context.Context, rdb *redis.Client, r presence.SessionRef) error {
	const ttl = 45 * time.Second
	exp := float64(time.Now().Add(ttl).UnixMilli())
	uk := "seed:{" + r.Room + "}:" + r.User
	if err := rdb.ZAdd(ctx, uk, redis.Z{Score: exp, Member: r.Session}).Err(); err != nil {
		return err
	}
	if err := rdb.Expire(ctx, uk, 2*ttl).Err(); err != nil {
		return err
	}
	return rdb.ZAdd(ctx, "seed:{"+r.Room+"}", redis.Z{Score: exp, Member: r.User}).Err()
}

// BenchmarkRefresh: 100k sessions in 1000 rooms, two per user, created
// once and then refreshed once per iteration, against a real redis-server.
//
//	go test ./region -run '^$' -bench BenchmarkRefresh
func BenchmarkRefresh(b *testing.B) {
	refs := benchRefs(1000, 100)
	ctx := context.Background()
	newClient := func(b *testing.B) *redis.Client {
		srv := testredis.Start(b)
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 128})
		b.Cleanup(func() { _ = rdb.Close() })
		return rdb
	}
	// measure creates the sessions with one pass, then times b.N refresh
	// passes and reports sessions/s and the Redis memory grown since
	// before (taken after any fixed setup).
	measure := func(b *testing.B, rdb *redis.Client, before int64, pass func() error) {
		if err := pass(); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for range b.N {
			if err := pass(); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(len(refs)*b.N)/b.Elapsed().Seconds(), "sessions/s")
		b.ReportMetric(0, "ns/op")
		b.ReportMetric(float64(usedMemory(b, rdb)-before)/float64(len(refs)), "B/session")
	}

	b.Run("seed", func(b *testing.B) {
		rdb := newClient(b)
		measure(b, rdb, usedMemory(b, rdb), func() error {
			return parallel(64, 1, refs, func(rs []presence.SessionRef) error { return seedTouch(ctx, rdb, rs[0]) })
		})
	})

	// Touch batches of 1000 (a heartbeat slot of a node), 4 in flight.
	store := func(b *testing.B, refs []presence.SessionRef) {
		rdb := newClient(b)
		noop := SinkFunc(func(context.Context, []presence.Transition) (uint64, error) { return 0, nil })
		s := newStore(b, rdb, noop, func(o *Options) { o.Timing = presence.Timing{} })
		if err := s.Preload(ctx); err != nil {
			b.Fatal(err)
		}
		// Scripts cached first: a fixed cost, not per session.
		measure(b, rdb, usedMemory(b, rdb), func() error {
			return parallel(4, 1000, refs, func(rs []presence.SessionRef) error { _, err := s.Claim(ctx, rs); return err })
		})
	}
	b.Run("store", func(b *testing.B) { store(b, refs) })
	// The same sessions in random order: every batch spans many rooms.
	scattered := append([]presence.SessionRef(nil), refs...)
	rand.New(rand.NewPCG(3, 4)).Shuffle(len(scattered), func(i, j int) { scattered[i], scattered[j] = scattered[j], scattered[i] })
	b.Run("store-scattered", func(b *testing.B) { store(b, scattered) })
}

// BenchmarkReleaseInLargeRoom measures a clean close and a state change in
// rooms of 100, 10,000 and 100,000 sessions (one per user): both look up
// the user's entries in the room (a scan of a small room, the user index
// of a large one), which the heartbeat never does. One op is a release
// plus the touch that brings the session back, or one state set.
// B/session is the Redis memory of the room (after the release run's
// setup).
//
//	go test ./region -run '^$' -bench ReleaseInLargeRoom
func BenchmarkReleaseInLargeRoom(b *testing.B) {
	for _, size := range []int{100, 10000, 100000} {
		rdb, _ := testredis.Client(b)
		s := newStore(b, rdb, SinkFunc(func(context.Context, []presence.Transition) (uint64, error) { return 0, nil }),
			func(o *Options) {
				o.Timing = presence.Timing{SessionTTL: 2 * time.Hour, Heartbeat: 20 * time.Minute, OfflineGrace: time.Hour, ReapInterval: time.Second, LastSeenInterval: time.Hour}
			})
		ctx := context.Background()
		refs := make([]presence.SessionRef, size)
		for i := range refs {
			refs[i] = ref("big", fmt.Sprintf("u%07d", i), "tab")
		}
		before := usedMemory(b, rdb)
		for i := 0; i < size; i += 1000 {
			if _, err := s.Claim(ctx, refs[i:min(i+1000, size)]); err != nil {
				b.Fatal(err)
			}
		}
		perSession := float64(usedMemory(b, rdb)-before) / float64(size)
		b.Run(fmt.Sprintf("release/%d", size), func(b *testing.B) {
			if size >= 10000 { // below that, fixed costs (scripts, meta) dominate
				b.ReportMetric(perSession, "B/session")
			}
			for i := range b.N {
				r := refs[i%size]
				if err := s.Release(ctx, r); err != nil {
					b.Fatal(err)
				}
				if _, err := s.Claim(ctx, []presence.SessionRef{r}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("snapshot/%d", size), func(b *testing.B) {
			for range b.N {
				if _, err := s.Snapshot(ctx, "big", 0, 1000); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("state/%d", size), func(b *testing.B) {
			for i := range b.N {
				if _, err := s.SetState(ctx, refs[i%size], []byte(fmt.Sprintf(`{"n":%d}`, i))); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

package region

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
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

// redisCPU is the CPU time the redis-server has used (user + system).
func redisCPU(b *testing.B, rdb *redis.Client) time.Duration {
	b.Helper()
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\r\n") {
		for _, k := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(line, k); ok {
				f, _ := strconv.ParseFloat(v, 64)
				total += f
			}
		}
	}
	return time.Duration(total * float64(time.Second))
}

// nodeSlots orders refs the way a node's heartbeat sends them (place and
// touchSlot in node/heartbeat.go): sessions join in random order, each
// goes to the slot of its room's last session unless that slot holds a
// batch more than the least loaded (then to the least loaded), and a
// slot is refreshed sorted by room, in batches of TouchBatch. The result
// is the batches of one heartbeat period.
func nodeSlots(refs []presence.SessionRef, slots, batch int) [][]presence.SessionRef {
	joined := append([]presence.SessionRef(nil), refs...)
	rand.New(rand.NewPCG(3, 4)).Shuffle(len(joined), func(i, j int) { joined[i], joined[j] = joined[j], joined[i] })
	per := make([][]presence.SessionRef, slots)
	roomSlot := map[string]int{}
	for _, r := range joined {
		best := 0
		for i := range per {
			if len(per[i]) < len(per[best]) {
				best = i
			}
		}
		if k, ok := roomSlot[r.Room]; ok && len(per[k]) < len(per[best])+batch {
			best = k
		}
		roomSlot[r.Room] = best
		per[best] = append(per[best], r)
	}
	var out [][]presence.SessionRef
	for _, sl := range per {
		slices.SortStableFunc(sl, func(a, b presence.SessionRef) int { return strings.Compare(a.Room, b.Room) })
		for len(sl) > 0 {
			n := min(batch, len(sl))
			out = append(out, sl[:n])
			sl = sl[n:]
		}
	}
	return out
}

// nodesBatches deals refs out to nodes at random (a client joins any
// node) and returns the heartbeat batches of each (nodeSlots), one node's
// after another.
func nodesBatches(refs []presence.SessionRef, nodes, slots, batch int) [][]presence.SessionRef {
	per := make([][]presence.SessionRef, nodes)
	rng := rand.New(rand.NewPCG(5, 6))
	for _, r := range refs {
		k := rng.IntN(nodes)
		per[k] = append(per[k], r)
	}
	var out [][]presence.SessionRef
	for _, p := range per {
		out = append(out, nodeSlots(p, slots, batch)...)
	}
	return out
}

// BenchmarkRefresh: 100k sessions in 1000 rooms, two per user, created
// once and then refreshed once per iteration, against a real redis-server.
// Besides sessions/s and B/session it reports the Redis CPU time per
// refreshed session (µs/session), the figure that decides how many
// sessions one Redis can keep alive.
//
//   - seed: the three-command touch of the design this project replaces;
//
//   - node: Refresh batches as the heartbeats of 4 nodes form them, each
//     session on a node at random (10 slots, a room's sessions in one
//     slot, batches of 1000 sorted by room: a batch spans about 40 rooms,
//     25 sessions of each); 4 in flight, as the 4 nodes send them;
//
//   - rooms: batches of 1000 sessions of 10 whole rooms, which no node
//     sends: the best case, for comparison;
//
//   - ceiling: the node batches refreshed by scriptCeiling, the cheapest
//     Lua refresh of the same entries;
//
//   - node/ceiling: both on one Redis, a pass of each in turn, and the
//     ratio of their Redis CPU (the issue-12 target: at most 1.2).
//
//     go test ./region -run '^$' -bench BenchmarkRefresh
func BenchmarkRefresh(b *testing.B) {
	refs := benchRefs(1000, 100)
	ctx := context.Background()
	newClient := func(b *testing.B) *redis.Client {
		srv := testredis.Start(b)
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 128})
		b.Cleanup(func() { _ = rdb.Close() })
		return rdb
	}
	// measure runs create once, then times b.N refresh passes and reports
	// sessions/s, Redis CPU per session and the Redis memory grown since
	// before (taken after any fixed setup).
	measure := func(b *testing.B, rdb *redis.Client, before int64, create, pass func() error) {
		if err := create(); err != nil {
			b.Fatal(err)
		}
		cpu0 := redisCPU(b, rdb)
		b.ResetTimer()
		for range b.N {
			if err := pass(); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		cpu := redisCPU(b, rdb) - cpu0
		n := float64(len(refs) * b.N)
		b.ReportMetric(n/b.Elapsed().Seconds(), "sessions/s")
		b.ReportMetric(float64(cpu.Microseconds())/n, "redis-µs/session")
		b.ReportMetric(0, "ns/op")
		b.ReportMetric(float64(usedMemory(b, rdb)-before)/float64(len(refs)), "B/session")
	}

	b.Run("seed", func(b *testing.B) {
		rdb := newClient(b)
		pass := func() error {
			return parallel(64, 1, refs, func(rs []presence.SessionRef) error { return seedTouch(ctx, rdb, rs[0]) })
		}
		measure(b, rdb, usedMemory(b, rdb), pass, pass)
	})

	store := func(b *testing.B, batches [][]presence.SessionRef, ceiling bool) {
		rdb := newClient(b)
		noop := SinkFunc(func(context.Context, []presence.Transition) (uint64, error) { return 0, nil })
		s := newStore(b, rdb, noop, func(o *Options) { o.Timing = presence.Timing{} })
		if err := s.Preload(ctx); err != nil {
			b.Fatal(err)
		}
		if err := scriptCeiling.Load(ctx, rdb).Err(); err != nil {
			b.Fatal(err)
		}
		run := func(op func(context.Context, []presence.SessionRef) (presence.TouchResult, error)) func() error {
			return func() error {
				return parallelBatches(4, batches, func(rs []presence.SessionRef) error { _, err := op(ctx, rs); return err })
			}
		}
		pass := run(s.Refresh)
		if ceiling {
			pass = func() error {
				return parallelBatches(4, batches, func(rs []presence.SessionRef) error { return ceilingRefresh(ctx, s, rdb, rs) })
			}
		}
		// Scripts cached first: a fixed cost, not per session.
		measure(b, rdb, usedMemory(b, rdb), run(s.Claim), pass)
	}
	node := nodesBatches(refs, 4, 10, 1000)
	b.Run("node", func(b *testing.B) { store(b, node, false) })
	// The ceiling: the cheapest Lua refresh of the same entries (see
	// scriptCeiling), fed the same node-shaped batches.
	b.Run("ceiling", func(b *testing.B) { store(b, node, true) })
	// Both at once, each on its own redis-server holding the same
	// sessions, batch after batch (a batch refreshed by Refresh on one,
	// then by the ceiling on the other, each between two reads of that
	// Redis's CPU), so a busy machine weighs on both alike: Refresh's
	// Redis CPU per session over the ceiling's. A pass starts on a new
	// second, so every refresh moves its entries' expiry, as a heartbeat
	// does.
	b.Run("node/ceiling", func(b *testing.B) {
		noop := SinkFunc(func(context.Context, []presence.Transition) (uint64, error) { return 0, nil })
		create := func() (*redis.Client, *Store) {
			rdb := newClient(b)
			s := newStore(b, rdb, noop, func(o *Options) { o.Timing = presence.Timing{} })
			if err := s.Preload(ctx); err != nil {
				b.Fatal(err)
			}
			if err := scriptCeiling.Load(ctx, rdb).Err(); err != nil {
				b.Fatal(err)
			}
			if err := parallelBatches(4, node, func(rs []presence.SessionRef) error { _, err := s.Claim(ctx, rs); return err }); err != nil {
				b.Fatal(err)
			}
			return rdb, s
		}
		rdbA, sA := create()
		rdbB, sB := create()
		timed := func(rdb *redis.Client, fn func() error) time.Duration {
			cpu0 := redisCPU(b, rdb)
			if err := fn(); err != nil {
				b.Fatal(err)
			}
			return redisCPU(b, rdb) - cpu0
		}
		var ours, ceil time.Duration
		b.ResetTimer()
		for range b.N {
			b.StopTimer()
			time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
			b.StartTimer()
			for _, rs := range node {
				ours += timed(rdbA, func() error { _, err := sA.Refresh(ctx, rs); return err })
				ceil += timed(rdbB, func() error { return ceilingRefresh(ctx, sB, rdbB, rs) })
			}
		}
		n := float64(len(refs) * b.N)
		b.ReportMetric(float64(ours.Microseconds())/n, "redis-µs/session")
		b.ReportMetric(float64(ceil.Microseconds())/n, "ceiling-µs/session")
		b.ReportMetric(float64(ours)/float64(ceil), "ratio")
		b.ReportMetric(0, "ns/op")
	})
	var rooms [][]presence.SessionRef
	for i := 0; i < len(refs); i += 1000 {
		rooms = append(rooms, refs[i:min(i+1000, len(refs))])
	}
	b.Run("rooms", func(b *testing.B) { store(b, rooms, false) })
}

// scriptCeiling is the cheapest Lua refresh of a store's sessions we can
// write, the ceiling the store's Refresh is measured against: per session
// one ZADD XX of its entry's expiry, per user one ZADD GT of their until,
// with the keys of each room (its members and sessions only) and the
// expiry given by the caller. It checks nothing: no holder, no lost or
// taken session, no grace, no incarnation, no reap index.
// KEYS: z, s per room; ARGV[1] expiry seconds, ARGV[2] until ms,
// ARGV[3] holder code, then per room: k, then k pairs (user, session).
var scriptCeiling = redis.NewScript(`
local exps, exp, holder = ARGV[1], ARGV[2], ARGV[3]
local a = 4
for b = 1, #KEYS, 2 do
  local z, s = KEYS[b], KEYS[b + 1]
  local prev
  for _ = 1, tonumber(ARGV[a]) do
    local u = ARGV[a + 1]
    redis.call('ZADD', s, 'XX', exps, u .. ':' .. ARGV[a + 2] .. holder)
    if u ~= prev then
      redis.call('ZADD', z, 'GT', exp, u)
      prev = u
    end
    a = a + 2
  end
  a = a + 1
end
return 0
`)

// ceilingRefresh refreshes refs with scriptCeiling, batched as Refresh
// batches them: sorted by room, ChunkSize sessions per call, one round
// trip.
func ceilingRefresh(ctx context.Context, s *Store, rdb *redis.Client, refs []presence.SessionRef) error {
	now := time.Now().Add(s.t.SessionTTL)
	head := []any{now.Unix() + 1, now.UnixMilli(), s.code()}
	var calls []call
	cur := call{script: scriptCeiling, args: slices.Clone(head)}
	n := 0
	for _, rb := range byRoom(sortRefs(refs)) {
		k := s.roomKeys(rb.room)
		cur.keys = append(cur.keys, k.z, k.s)
		cur.args = append(cur.args, len(rb.pairs)/2)
		cur.args = append(cur.args, rb.pairs...)
		if n += len(rb.pairs) / 2; n >= s.opt.ChunkSize {
			calls = append(calls, cur)
			cur, n = call{script: scriptCeiling, args: slices.Clone(head)}, 0
		}
	}
	if n > 0 {
		calls = append(calls, cur)
	}
	_, err := runAll(ctx, rdb, calls)
	return err
}

// parallelBatches runs fn over batches with the given number of workers.
func parallelBatches(workers int, batches [][]presence.SessionRef, fn func([]presence.SessionRef) error) error {
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
				next++
				mu.Unlock()
				if i >= len(batches) {
					return
				}
				if err := fn(batches[i]); err != nil {
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

package region

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
)

var testTiming = testkit.Timing

// collector is a Sink that records what it is given.
type collector struct {
	testkit.Log
	down atomic.Bool
}

func (c *collector) Publish(_ context.Context, ts []presence.Transition) (uint64, error) {
	if c.down.Load() {
		return 0, errors.New("sink down")
	}
	return uint64(c.Add(ts...)), nil // the count stands for the stream sequence
}

func newStore(tb testing.TB, rdb redis.UniversalClient, sink Sink, edit ...func(*Options)) *Store {
	tb.Helper()
	o := Options{Region: "eu", Timing: testTiming, Sink: sink, PublishLease: 500 * time.Millisecond}
	for _, e := range edit {
		e(&o)
	}
	s, err := New(rdb, o)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	return s
}

// startReaper runs s's reaper until the test ends, and returns s.
func startReaper(tb testing.TB, s *Store) *Store {
	tb.Helper()
	s.Start()
	tb.Cleanup(s.Close)
	return s
}

// waitSweeps waits until the reaper of each store has started n more
// sweeps (so n-1 have run whole): whatever those reapers would do wrong
// has had its chance to show.
func waitSweeps(tb testing.TB, n int64, stores ...*Store) {
	tb.Helper()
	want := make([]int64, len(stores))
	for i, s := range stores {
		want[i] = s.Stats().Sweeps.Load() + n
	}
	testkit.CheckFor(tb, 10*time.Second, 10*time.Millisecond, func() error {
		for i, s := range stores {
			if err := testkit.AtLeast(fmt.Sprintf("sweeps of reaper %d of %d", i+1, len(stores)), s.Stats().Sweeps.Load(), want[i]); err != nil {
				return err
			}
		}
		return nil
	})
}

// slow skips a test under -short: it waits out real TTLs and graces,
// stalls Redis, or starts a cluster. go test -short ./region is the fast
// loop; the full run covers everything.
func slow(tb testing.TB) {
	tb.Helper()
	if testing.Short() {
		tb.Skip("slow: waits out real timing or starts a cluster; run without -short")
	}
}

// redisNow and waitRedisPast read and wait on Redis's clock, which
// scores every entry.
var (
	redisNow      = testredis.Now
	waitRedisPast = testredis.WaitPast
)

var ref = testkit.Ref

func touch(tb testing.TB, s *Store, refs ...presence.SessionRef) []presence.Transition {
	tb.Helper()
	res, err := s.Claim(context.Background(), refs)
	if err != nil {
		tb.Fatalf("Claim: %v", err)
	}
	return res.Transitions
}

func release(tb testing.TB, s *Store, r presence.SessionRef) {
	tb.Helper()
	if err := s.Release(context.Background(), r); err != nil {
		tb.Fatalf("Release: %v", err)
	}
}

func members(tb testing.TB, s *Store, room string) map[string]int {
	tb.Helper()
	snap, err := s.Snapshot(context.Background(), room, 0, 10000)
	if err != nil {
		tb.Fatalf("Snapshot: %v", err)
	}
	out := map[string]int{}
	for _, m := range snap.Members {
		out[m.User] = len(m.Sessions)
	}
	if snap.Total != len(out) {
		tb.Fatalf("snapshot total %d, listed %d", snap.Total, len(out))
	}
	return out
}

// untilOf is how long the user stays a member unless refreshed.
func untilOf(tb testing.TB, s *Store, room, user string) time.Time {
	tb.Helper()
	m, ok, err := s.Sessions(context.Background(), room, user)
	if err != nil || !ok {
		tb.Fatalf("Sessions(%s, %s): %v %v", room, user, ok, err)
	}
	return m.Until
}

func reap(tb testing.TB, s *Store) int {
	tb.Helper()
	n, err := s.reap(context.Background(), 0)
	if err != nil {
		tb.Fatalf("Reap: %v", err)
	}
	return n
}

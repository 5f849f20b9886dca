package region

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
)

// Overdue is zero while nothing is due, and how long the earliest due
// room has waited once the clock passes it: read with the store's clock
// moved an hour ahead, so nothing waits in real time.
func TestOverdue(t *testing.T) {
	rdb, _ := testredis.Client(t)
	checkOverdue(t, rdb)
}

// The same on a cluster, where the rooms' reap indexes are spread over
// every slot of three masters.
func TestOverdueCluster(t *testing.T) {
	slow(t)
	cc, _ := testredis.Cluster(t, 3)
	checkOverdue(t, cc)
}

func checkOverdue(t *testing.T, rdb redis.UniversalClient) {
	t.Helper()
	s := newStore(t, rdb, &collector{})
	ctx := context.Background()
	if d, err := s.Overdue(ctx); err != nil || d != 0 {
		t.Fatalf("empty region: overdue %v, %v; want 0", d, err)
	}
	var refs []presence.SessionRef
	for i := range 20 {
		refs = append(refs, ref(fmt.Sprintf("room%d", i), "u", "a"))
	}
	claimed := time.Now()
	touch(t, s, refs...)
	if d, err := s.Overdue(ctx); err != nil || d != 0 {
		t.Fatalf("live sessions: overdue %v, %v; want 0", d, err)
	}
	ahead := time.Hour
	s.now = func() time.Time { return time.Now().Add(ahead) }
	d, err := s.Overdue(ctx)
	// The rooms are due a TTL after the claim, rounded up to the second;
	// what time the test itself took (a loaded machine) adds to the wait.
	took := time.Since(claimed)
	lo, hi := ahead-testTiming.SessionTTL-2*time.Second, ahead-testTiming.SessionTTL+time.Second+took
	if err != nil || d < lo || d > hi {
		t.Fatalf("an hour on: overdue %v, %v; want between %v and %v", d, err, lo, hi)
	}
}

package testredis

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Now reads Redis's clock (TIME), the one its scripts score entries with.
func Now(tb testing.TB, rdb redis.UniversalClient) time.Time {
	tb.Helper()
	t, err := rdb.Time(context.Background()).Result()
	if err != nil {
		tb.Fatalf("TIME: %v", err)
	}
	return t
}

// WaitPast waits until Redis's clock is past at in whole milliseconds,
// the resolution scripts compare in, polling with a deadline of five
// seconds after at.
func WaitPast(tb testing.TB, rdb redis.UniversalClient, at time.Time) {
	tb.Helper()
	limit := at.Truncate(time.Millisecond).Add(time.Millisecond)
	deadline := time.Now().Add(time.Until(at) + 5*time.Second)
	for Now(tb, rdb).Before(limit) {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for the redis clock to pass %s", at.Format(time.StampMilli))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

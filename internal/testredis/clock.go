package testredis

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/internal/testkit"
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
	testkit.CheckFor(tb, time.Until(at)+5*time.Second, 5*time.Millisecond, func() error {
		if now := Now(tb, rdb); now.Before(limit) {
			return fmt.Errorf("the redis clock at %s, not past %s", now.Format(time.StampMilli), at.Format(time.StampMilli))
		}
		return nil
	})
}

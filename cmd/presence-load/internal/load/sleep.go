package load

import (
	"context"
	"time"
)

// SleepCtx sleeps for d; false if ctx ended first.
func SleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

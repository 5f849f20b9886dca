package churn

import (
	"context"
	"sync"
	"time"
)

// Pacer puts n actions on an absolute schedule, Rate a second: action i
// is due at start + i/Rate, whatever the earlier ones took, so a slow
// action delays none after it (the lag of each is its own to measure).
// Lead is how long before its time an action is started: a churner dials
// and connects in it, then waits for its time to send.
type Pacer struct {
	Rate float64
	Lead time.Duration
}

// Interval is the time between two actions.
func (p Pacer) Interval() time.Duration { return time.Duration(float64(time.Second) / p.Rate) }

// Run calls f(i, at) in this goroutine, Lead before each action's time
// at, for i from 0 to n-1; it stops early when ctx ends. It returns the
// schedule's start (the time of action 0).
func (p Pacer) Run(ctx context.Context, n int, f func(i int, at time.Time)) time.Time {
	interval := p.Interval()
	start := time.Now().Add(p.Lead)
	for i := range n {
		at := start.Add(time.Duration(i) * interval)
		if d := time.Until(at.Add(-p.Lead)); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		}
		if ctx.Err() != nil {
			break
		}
		f(i, at)
	}
	return start
}

// Go is Run with each action in its own goroutine; it returns once all
// have returned.
func (p Pacer) Go(ctx context.Context, n int, f func(i int, at time.Time)) time.Time {
	var wg sync.WaitGroup
	start := p.Run(ctx, n, func(i int, at time.Time) {
		wg.Add(1)
		go func() { defer wg.Done(); f(i, at) }()
	})
	wg.Wait()
	return start
}

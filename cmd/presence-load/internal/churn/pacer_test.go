package churn

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

func TestPacerRunsOnAnAbsoluteSchedule(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := Pacer{Rate: 10, Lead: time.Second}
		t0 := time.Now()
		var called []time.Duration
		var ats []time.Duration
		start := p.Run(context.Background(), 4, func(i int, at time.Time) {
			called = append(called, time.Since(t0))
			ats = append(ats, at.Sub(t0))
			if i == 1 {
				time.Sleep(250 * time.Millisecond) // a slow action delays only itself
			}
		})
		if start.Sub(t0) != time.Second {
			t.Fatalf("start %v after the call, want the lead (1s)", start.Sub(t0))
		}
		wantAt := []time.Duration{1000 * time.Millisecond, 1100 * time.Millisecond, 1200 * time.Millisecond, 1300 * time.Millisecond}
		wantCalled := []time.Duration{0, 100 * time.Millisecond, 350 * time.Millisecond, 350 * time.Millisecond}
		for i := range wantAt {
			if ats[i] != wantAt[i] || called[i] != wantCalled[i] {
				t.Errorf("action %d: called at %v for %v, want %v for %v", i, called[i], ats[i], wantCalled[i], wantAt[i])
			}
		}
	})
}

func TestPacerGoWaitsForEveryAction(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := Pacer{Rate: 100}
		t0 := time.Now()
		var mu sync.Mutex
		done := map[int]time.Duration{}
		p.Go(context.Background(), 3, func(i int, at time.Time) {
			time.Sleep(time.Until(at.Add(time.Second))) // each holds a second past its time
			mu.Lock()
			done[i] = time.Since(t0)
			mu.Unlock()
		})
		if len(done) != 3 || time.Since(t0) != time.Second+20*time.Millisecond {
			t.Fatalf("Go returned at %v with %d actions done (%v), want all 3 by 1.02s", time.Since(t0), len(done), done)
		}
	})
}

func TestPacerStopsWithTheContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		p := Pacer{Rate: 1}
		n := 0
		time.AfterFunc(2500*time.Millisecond, cancel)
		p.Run(ctx, 10, func(int, time.Time) { n++ })
		if n != 3 {
			t.Fatalf("%d actions ran before the context ended at 2.5s, want 3 (at 0, 1 and 2s)", n)
		}
	})
}

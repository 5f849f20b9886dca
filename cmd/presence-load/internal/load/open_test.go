package load

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
)

func TestOpenEachTalliesAndBounds(t *testing.T) {
	var now, peak atomic.Int64
	got := OpenEach(context.Background(), 100, 4, func(k int) error {
		n := now.Add(1)
		defer now.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		switch {
		case k%10 == 3:
			return &Refusal{Code: "unavailable", Msg: "busy"}
		case k == 50:
			return errors.New("dial: refused")
		}
		return nil
	})
	if got.Opened != 89 || got.Failed != 11 || got.Codes["unavailable"] != 10 || len(got.Codes) != 1 {
		t.Fatalf("tally %+v, want 89 opened, 11 failed, 10 unavailable", got)
	}
	if got.FirstErr == "" {
		t.Fatal("no first error")
	}
	if p := peak.Load(); p > 4 {
		t.Fatalf("%d opens at once, want at most 4", p)
	}
}

func TestOpenEachStopsWithTheContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var started atomic.Int64
	got := OpenEach(ctx, 1000, 1, func(k int) error {
		if started.Add(1) == 5 {
			cancel()
		}
		return nil
	})
	if n := started.Load(); n < 5 || n > 6 || got.Opened != int(n) {
		t.Fatalf("started %d, tally %+v: want it to stop right after the context ended", n, got)
	}
}

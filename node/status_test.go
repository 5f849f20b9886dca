package node

import (
	"testing"
	"time"
)

// The status figures cover the current and the previous window: a
// maximum forgets what is two windows old, and a sum is a rate over the
// time the windows cover.
func TestStatusWindows(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 15, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	slow := newWindows(10*time.Second, false, t0)
	slow.add(at(time.Second), 5)
	slow.add(at(2*time.Second), 3)
	if v := slow.value(at(12*time.Second), false); v != 5 {
		t.Fatalf("max one window on: %v, want 5", v)
	}
	slow.add(at(13*time.Second), 1)
	if v := slow.value(at(21*time.Second), false); v != 1 {
		t.Fatalf("max two windows on: %v, want 1", v)
	}
	if v := slow.value(at(45*time.Second), false); v != 0 {
		t.Fatalf("max long after: %v, want 0", v)
	}
	joins := newWindows(10*time.Second, true, t0)
	for i := range 20 {
		joins.add(at(time.Duration(i)*500*time.Millisecond), 1) // 2 per second for 10s
	}
	if v := joins.value(at(15*time.Second), true); v < 19.0/15 || v > 21.0/15 {
		t.Fatalf("rate: %v joins/s, want 20 over 15s", v)
	}
	if v := joins.value(at(35*time.Second), true); v != 0 {
		t.Fatalf("rate long after: %v, want 0", v)
	}
}

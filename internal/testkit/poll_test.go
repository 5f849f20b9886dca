package testkit

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// A timeout reports f's last error, after polling every interval for
// the whole of total (virtual time, so the count is exact).
func TestPollTimesOutWithTheLastError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		calls := 0
		start := time.Now()
		err := Poll(time.Second, 100*time.Millisecond, func() error {
			calls++
			return fmt.Errorf("attempt %d", calls)
		})
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("attempt %d", calls)) {
			t.Fatalf("err %v, want the last attempt (%d)", err, calls)
		}
		if errors.Unwrap(err).Error() != fmt.Sprintf("attempt %d", calls) {
			t.Fatalf("err %v does not wrap the last error", err)
		}
		if calls != 12 { // at 0, 100ms, ..., 1s and once past the deadline
			t.Fatalf("%d calls, want 12", calls)
		}
		if d := time.Since(start); d < time.Second {
			t.Fatalf("gave up after %v, before the deadline", d)
		}
	})
}

// Poll returns as soon as f succeeds, without a further sleep.
func TestPollReturnsOnSuccess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		calls := 0
		start := time.Now()
		err := Poll(time.Minute, time.Second, func() error {
			calls++
			if calls < 3 {
				return errors.New("not yet")
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if calls != 3 || time.Since(start) != 2*time.Second {
			t.Fatalf("%d calls over %v, want 3 over 2s", calls, time.Since(start))
		}
	})
}

// Want and AtLeast say what they got.
func TestWantAndAtLeast(t *testing.T) {
	if Want("offlines", 5, 5) != nil || AtLeast("events", 7, 5) != nil || AtLeast("events", 5, 5) != nil {
		t.Fatal("a met condition gave a reason")
	}
	if err := Want("offlines", 3, 5); err == nil || err.Error() != "offlines: 3, want 5" {
		t.Fatalf("Want: %v", err)
	}
	if WantSlice("members", []string{"a", "b"}, []string{"a", "b"}) != nil {
		t.Fatal("equal slices gave a reason")
	}
	if err := WantSlice("members", []string{"a"}, []string{"a", "b"}); err == nil || err.Error() != "members: [a], want [a b]" {
		t.Fatalf("WantSlice: %v", err)
	}
	if err := AtLeast("events", 2, 5); err == nil || err.Error() != "events: 2, want at least 5" {
		t.Fatalf("AtLeast: %v", err)
	}
}

package testkit

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/presence-dev/presence/presence"
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

// Holds passes a check that holds throughout, for the whole watch.
func TestHoldsWatchesTheWholeWhile(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		calls := 0
		start := time.Now()
		Holds(t, time.Second, 100*time.Millisecond, func() error { calls++; return nil })
		if calls != 11 || time.Since(start) != time.Second {
			t.Fatalf("%d calls over %v, want 11 over 1s", calls, time.Since(start))
		}
	})
}

// WantOf and AtLeastOf count a user's transitions and list them.
func TestLogWantOf(t *testing.T) {
	var l Log
	l.Add(presence.Transition{Kind: presence.Online, Room: "r", User: "u"}, presence.Transition{Kind: presence.Offline, Room: "r", User: "u"})
	if l.WantOf(presence.Offline, "r", "u", 1) != nil || l.AtLeastOf("", "r", "u", 2) != nil {
		t.Fatal("a met condition gave a reason")
	}
	if err := l.WantOf(presence.Offline, "r", "u", 2); err == nil || !strings.Contains(err.Error(), "1 offline transitions of u in r, want 2") {
		t.Fatalf("WantOf: %v", err)
	}
	if err := l.AtLeastOf(presence.Online, "r", "v", 1); err == nil || !strings.Contains(err.Error(), "want at least 1") {
		t.Fatalf("AtLeastOf: %v", err)
	}
}

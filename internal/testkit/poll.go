package testkit

import (
	"cmp"
	"fmt"
	"slices"
	"testing"
	"time"
)

// Poll calls f every interval until it returns nil or total has passed,
// and returns nil or, on a timeout, f's last error: the reason the wait
// was still waiting. It is the one polling loop of the tests; CheckFor
// fails the test with it, callers that judge the outcome
// themselves use it directly.
func Poll(total, every time.Duration, f func() error) error {
	deadline := time.Now().Add(total)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v: %w", total, err)
		}
		time.Sleep(every)
	}
}

// CheckFor polls f every interval until it returns nil, failing tb after
// total with f's last error.
func CheckFor(tb testing.TB, total, every time.Duration, f func() error) {
	tb.Helper()
	if err := Poll(total, every, f); err != nil {
		tb.Fatal(err)
	}
}

// Holds checks that check passes for the whole of d, calling it every
// interval, and fails tb at the first call where it does not, saying how
// far into the watch: CheckFor's counterpart, a watch that nothing more
// happens (d long enough for anything still due to have come out).
func Holds(tb testing.TB, d, every time.Duration, check func() error) {
	tb.Helper()
	start := time.Now()
	end := start.Add(d)
	for {
		if err := check(); err != nil {
			tb.Fatalf("%v (%v into a %v watch)", err, time.Since(start).Round(time.Millisecond), d)
		}
		if !time.Now().Before(end) {
			return
		}
		time.Sleep(every)
	}
}

// Want is a poll's condition on a value: nil when got is want, else the
// reason "what: got, want want".
func Want[T comparable](what string, got, want T) error {
	if got == want {
		return nil
	}
	return fmt.Errorf("%s: %v, want %v", what, got, want)
}

// WantSlice is Want for slices: nil when got equals want element by
// element.
func WantSlice[T comparable](what string, got, want []T) error {
	if slices.Equal(got, want) {
		return nil
	}
	return fmt.Errorf("%s: %v, want %v", what, got, want)
}

// AtLeast is a poll's condition on a count: nil when got is at least
// least, else the reason "what: got, want at least least".
func AtLeast[T cmp.Ordered](what string, got, least T) error {
	if got >= least {
		return nil
	}
	return fmt.Errorf("%s: %v, want at least %v", what, got, least)
}

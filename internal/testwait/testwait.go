// Package testwait polls a condition with a deadline: tests wait for what
// they expect to happen instead of sleeping and hoping it has.
package testwait

import (
	"testing"
	"time"
)

// For polls cond every 10ms until it holds, failing tb after timeout with
// what it was waiting for.
func For(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

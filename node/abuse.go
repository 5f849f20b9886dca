package node

import (
	"fmt"
	"time"
)

// The abuse rule behind close 1008: a connection whose frames the rate
// limit refused RateStrikes times within RateWindow is closed. A count
// over a window, not a run of refusals in a row: a client sending at ten
// times the rate has one frame in ten let through, which would reset any
// run, and is closed all the same.

// refusals holds the times (monotonic ns) of a connection's last
// RateStrikes refusals, oldest first once full. Reader goroutine only.
type refusals struct {
	at   []int64 // ring of the last len(at) refusals
	next int     // where the next one goes; at[next] is the oldest when full
	n    int     // refusals recorded, up to len(at)
}

// refuse records a refusal at now and reports whether it makes strikes
// refusals within window: the connection is to be closed.
func (r *refusals) refuse(now int64, strikes int, window time.Duration) bool {
	if len(r.at) != strikes {
		r.at, r.next, r.n = make([]int64, strikes), 0, 0
	}
	r.at[r.next] = now
	r.next = (r.next + 1) % strikes
	r.n = min(r.n+1, strikes)
	// With the ring full, at[next] is the strikes-th latest refusal.
	return r.n == strikes && now-r.at[r.next] < int64(window)
}

// policyReason is the close frame's reason for the abuse rule (at most
// the 123 bytes a close reason may hold).
func policyReason(l *Limits) string {
	return fmt.Sprintf("rate limit: %d frames refused within %v (limit %g/s, burst %d)", l.RateStrikes, l.RateWindow, l.FrameRate, l.FrameBurst)
}

package client

import "time"

// The reconnect schedule, the browser client's (clients/js, "Reconnecting";
// docs/PROTOCOL.md, the end of "Close codes"). While the session is inside
// its offline grace (hello's offline_grace_ms) a reconnect announces
// nothing, so tries land at most graceRetry apart until graceMargin
// before the grace ends: an outage up to the grace minus two seconds ends
// in a reconnect inside it. Past that the waits grow, up to backoffCap.
const (
	backoffBase  = 500 * time.Millisecond
	backoffCap   = 10 * time.Second
	graceDefault = 12 * time.Second // until a hello says otherwise
	graceRetry   = time.Second
	graceMargin  = time.Second
	policyWait   = 5 * time.Second        // close 1008: at least this long
	quickRetry   = 250 * time.Millisecond // close 1001, 1012: at once, with a little jitter
	stableFor    = 5 * time.Second        // a connection up this long resets the schedule
	maxAttempts  = 30                     // the exponents stop growing here
)

// schedule counts reconnect attempts and says how long to wait before
// the next. It is pure: the caller passes how long the connection has
// been down and a random number in [0, 1).
type schedule struct {
	grace   time.Duration // the last hello's offline grace
	attempt int           // attempts since the last stable connection
	late    int           // attempts since the grace of the last drop ran out
}

// reset starts the schedule over, after a connection that stayed up.
func (s *schedule) reset() { s.attempt, s.late = 0, 0 }

// next is the wait before the next attempt, and counts it. down is how
// long ago the last open connection dropped; neverOpen means none has
// opened yet. Inside the grace, up to graceMargin before its end, the
// first retry waits rnd * 500 ms and the others half to all of
// min(1 s, 500 ms * 2^attempt), the last one landing before the grace
// ends. Past that it is full jitter, rnd * min(10 s, base * 2^n): base 1 s
// and n counted from the grace's end after a drop, base 500 ms and n the
// attempts when never open.
func (s *schedule) next(down time.Duration, neverOpen bool, rnd float64) time.Duration {
	grace := s.grace
	if grace <= 0 {
		grace = graceDefault
	}
	n := s.attempt
	s.attempt = min(s.attempt+1, maxAttempts)
	if !neverOpen && down < grace-graceMargin {
		limit := min(graceRetry, backoffBase<<n)
		d := time.Duration(rnd * float64(limit))
		if n > 0 {
			d = time.Duration((0.5 + 0.5*rnd) * float64(limit))
		}
		return min(d, max(0, grace-graceMargin-down)+graceMargin/2)
	}
	if neverOpen {
		return time.Duration(rnd * float64(min(backoffCap, backoffBase<<n)))
	}
	k := s.late
	s.late = min(s.late+1, maxAttempts)
	return time.Duration(rnd * float64(min(backoffCap, graceRetry<<k)))
}

// retryDelay is the wait before a request refused with unavailable is
// sent again: its retry_after_ms (1 s without one) with ±25 % jitter, so
// that clients refused together do not return together.
func retryDelay(hint time.Duration, rnd float64) time.Duration {
	if hint <= 0 {
		hint = time.Second
	}
	return time.Duration(float64(hint) * (0.75 + 0.5*rnd))
}

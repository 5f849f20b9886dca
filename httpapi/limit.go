package httpapi

import (
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// limiters holds one token bucket per API key name: a key's requests
// share it, whichever node or path they use on this process.
type limiters struct {
	every float64 // requests per second; <= 0: no limit
	burst int
	mu    sync.Mutex
	m     map[string]*rate.Limiter
}

func newLimiters(perSecond float64, burst int) *limiters {
	return &limiters{every: perSecond, burst: max(burst, 1), m: map[string]*rate.Limiter{}}
}

// take spends one request of key's bucket at now; when it is empty, wait
// says how long until one is back (at least a second, as Retry-After
// counts whole seconds).
func (l *limiters) take(key string, now time.Time) (ok bool, wait time.Duration) {
	if l.every <= 0 {
		return true, 0
	}
	l.mu.Lock()
	lim := l.m[key]
	if lim == nil {
		lim = rate.NewLimiter(rate.Limit(l.every), l.burst)
		l.m[key] = lim
	}
	l.mu.Unlock()
	r := lim.ReserveN(now, 1)
	d := r.DelayFrom(now)
	if d == 0 {
		return true, 0
	}
	r.CancelAt(now)
	return false, time.Duration(math.Ceil(d.Seconds())) * time.Second
}

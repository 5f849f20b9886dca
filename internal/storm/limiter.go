package storm

import (
	"math/rand/v2"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// JoinLimiter admits the joins that claim a session (the store's costly
// write) at a bounded rate that follows what the store can take, and
// tells the ones it refuses when to come back: a reconnect storm then
// drains at the store's pace instead of melting it.
//
// The rate is a token bucket whose rate adapts (AIMD) to how long the
// admitted joins wait on their claim, the store's write (not on the
// snapshot read, which in a big room waits on the node's fan-out too):
// a join slower than Latency, or failing, cuts
// the rate by 30 % (once per Latency); each call in time raises it back
// towards Rate, from MinRate to Rate in about 10 s. The burst is a second
// of the rate: a storm of joins into one big room, all at once, is a few
// shared claims and snapshot reads, not a burst of store calls.
//
// Refused clients are queued in time, not in memory: the k-th client
// refused while k are owed a return is told to come back in about k/rate
// (owed decays at the rate), jittered by ±20 %, at least MinRetry and at
// most MaxRetry. So a storm's clients spread over the time it takes to
// drain instead of all coming back together after a fixed wait.
type JoinLimiter struct {
	cfg JoinLimit

	mu      sync.Mutex
	rate    float64 // joins/s now, MinRate..Rate
	tokens  float64
	owed    float64 // refused clients told to come back, not yet due
	last    time.Time
	lastCut time.Time
	lastUp  time.Time
	rnd     func() float64 // [0,1); tests fix it

	Metrics *JoinMetrics // optional
}

// JoinLimit configures a JoinLimiter (Limits.JoinRate and friends).
type JoinLimit struct {
	Rate     float64       // the most joins/s, > 0
	MinRate  float64       // the least the rate is cut to, 0 < MinRate <= Rate
	Latency  time.Duration // an admitted join slower than this on the store cuts the rate
	MinRetry time.Duration // the shortest retry hint
	MaxRetry time.Duration // the longest retry hint
}

// JoinMetrics are the limiter's collectors (any may be nil).
type JoinMetrics struct {
	Admitted, Refused prometheus.Counter
	RetryHint         prometheus.Observer // seconds
}

// NewJoinLimiter returns a limiter at its full rate with a full bucket.
func NewJoinLimiter(cfg JoinLimit) *JoinLimiter {
	return &JoinLimiter{cfg: cfg, rate: cfg.Rate, tokens: max(1, cfg.Rate), rnd: rand.Float64}
}

// Admit takes a token for one join at now; when there is none it returns
// false and the retry hint for the client.
func (l *JoinLimiter) Admit(now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.advance(now)
	if l.tokens >= 1 {
		l.tokens--
		if m := l.Metrics; m != nil && m.Admitted != nil {
			m.Admitted.Inc()
		}
		return true, 0
	}
	return false, l.deferLocked()
}

// Defer counts one more client told to come back (a join refused for
// another reason: the node at capacity, the store failing) and returns
// its retry hint.
func (l *JoinLimiter) Defer(now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.advance(now)
	return l.deferLocked()
}

// advance fills the bucket and drains the owed returns up to now; l.mu
// is held.
func (l *JoinLimiter) advance(now time.Time) {
	if !l.last.IsZero() && now.After(l.last) {
		dt := now.Sub(l.last).Seconds()
		l.tokens = min(l.burst(), l.tokens+dt*l.rate)
		l.owed = max(0, l.owed-dt*l.rate)
	}
	if now.After(l.last) {
		l.last = now
	}
}

// deferLocked queues a refused client in time; l.mu is held.
func (l *JoinLimiter) deferLocked() time.Duration {
	l.owed++
	d := time.Duration(l.owed / l.rate * float64(time.Second))
	d = time.Duration(float64(d) * (0.8 + 0.4*l.rnd()))
	d = min(max(d, l.cfg.MinRetry), l.cfg.MaxRetry)
	if m := l.Metrics; m != nil {
		if m.Refused != nil {
			m.Refused.Inc()
		}
		if m.RetryHint != nil {
			m.RetryHint.Observe(d.Seconds())
		}
	}
	return d
}

func (l *JoinLimiter) burst() float64 { return max(1, l.rate) }

// Observe adapts the rate to one admitted join that waited d on the store
// (its claim) and ended with err.
func (l *JoinLimiter) Observe(now time.Time, d time.Duration, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil || d > l.cfg.Latency {
		if now.Sub(l.lastCut) >= l.cfg.Latency {
			l.rate = max(l.cfg.MinRate, l.rate*0.7)
			l.tokens = min(l.tokens, l.burst())
			l.lastCut = now
		}
		l.lastUp = now
		return
	}
	if !l.lastUp.IsZero() {
		step := (l.cfg.Rate - l.cfg.MinRate) / 10 * now.Sub(l.lastUp).Seconds()
		l.rate = min(l.cfg.Rate, l.rate+max(0, step))
	}
	l.lastUp = now
}

// Rate is the rate now, joins/s.
func (l *JoinLimiter) Rate() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rate
}

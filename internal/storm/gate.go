package storm

import (
	"context"
	"errors"
	"time"

	"github.com/presence-dev/presence/presence"
)

// Gate is a node's part in a reconnect storm: the join limiter that
// admits claims at the store's pace (nil: no limit), the appointments
// that hold refused joins to their hints, and the extender that keeps
// the sessions of the clients it refused.
type Gate struct {
	Limiter  *JoinLimiter // nil: joins are not limited
	Extender *Extender
	Appts    *Appointments
	// Wait is the retry hint of a refusal without a limiter, counted as
	// a refusal.
	Wait func() time.Duration
}

// Observe tells the limiter how long a claim call took the store, and
// whether it failed; a call its callers left is no sign of the store's.
func (g *Gate) Observe(d time.Duration, err error) {
	if g.Limiter != nil && !errors.Is(err, context.Canceled) {
		g.Limiter.Observe(time.Now(), d, err)
	}
}

// Rate is the limiter's rate now, joins/s; 0 without a limiter.
func (g *Gate) Rate() float64 {
	if g.Limiter == nil {
		return 0
	}
	return g.Limiter.Rate()
}

// Admit takes the limiter's token for a join of ref that claims a
// session; on false, the hint to send. A join back before its
// appointment is refused with the time left (Appointments).
func (g *Gate) Admit(ref presence.SessionRef) (bool, time.Duration) {
	now := time.Now()
	if left, early := g.Appts.Early(ref, now); early {
		return false, left
	}
	if g.Limiter == nil {
		return true, 0
	}
	return g.Limiter.Admit(now)
}

// Refused returns the retry hint for a join of ref refused otherwise
// (the node at capacity, the store failing), counted as a refusal; one
// back before its appointment gets the time left.
func (g *Gate) Refused(ref presence.SessionRef) time.Duration {
	now := time.Now()
	if left, early := g.Appts.Early(ref, now); early {
		return left
	}
	if g.Limiter == nil {
		return g.Wait()
	}
	return g.Limiter.Defer(now)
}

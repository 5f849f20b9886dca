package node

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
)

// joinGate is a node's part in a reconnect storm: the join limiter that
// admits claims at the store's pace (nil with Limits.JoinRate < 0), and
// the extender that keeps the sessions of the clients it refused.
type joinGate struct {
	limiter  *JoinLimiter
	extender *Extender
	appts    *Appointments        // holds refused joins to their hints
	wait     func() time.Duration // the hint without a limiter
}

func newJoinGate(cfg Config) *joinGate {
	l := cfg.Limits
	g := &joinGate{extender: NewExtender(cfg.Store, ExtendConfig{Every: cfg.extendEvery(), Again: cfg.heartbeat,
		Batch: l.TouchBatch, Max: maxWaiting, Timeout: cfg.StoreTimeout}, cfg.Logger),
		appts: NewAppointments(maxWaiting, l.MaxRetryAfter)}
	if l.JoinRate > 0 {
		g.limiter = NewJoinLimiter(JoinLimit{Rate: l.JoinRate, MinRate: l.JoinRateMin, Latency: l.JoinLatency,
			MinRetry: minRetryAfter, MaxRetry: l.MaxRetryAfter})
	}
	return g
}

// wireStorm hands the join gate its metrics and the claims' latencies.
func (n *Node) wireStorm() {
	g := n.joins
	g.extender.Metrics = &n.metrics.extend
	g.wait = func() time.Duration {
		n.metrics.join.Refused.Inc()
		d := n.admission.retryAfter()
		n.metrics.join.RetryHint.Observe(d.Seconds())
		return d
	}
	if g.limiter == nil {
		return
	}
	g.limiter.Metrics = &n.metrics.join
}

// observe tells the limiter how long a claim call took the store, and
// whether it failed; a call its callers left is no sign of the store's.
func (g *joinGate) observe(d time.Duration, err error) {
	if g.limiter != nil && !isCanceled(err) {
		g.limiter.Observe(time.Now(), d, err)
	}
}

// isCanceled reports a call ended by its callers leaving, not by the
// store.
func isCanceled(err error) bool { return errors.Is(err, context.Canceled) }

func (g *joinGate) rate() float64 {
	if g.limiter == nil {
		return 0
	}
	return g.limiter.Rate()
}

// admit takes the limiter's token for a join of ref that claims a
// session; on false, the hint to send. A join back before its
// appointment is refused with the time left (Appointments).
func (g *joinGate) admit(ref presence.SessionRef) (bool, time.Duration) {
	now := time.Now()
	if left, early := g.appts.Early(ref, now); early {
		return false, left
	}
	if g.limiter == nil {
		return true, 0
	}
	return g.limiter.Admit(now)
}

// refused returns the retry hint for a join of ref refused otherwise
// (the node at capacity, the store failing), counted as a refusal; one
// back before its appointment gets the time left.
func (g *joinGate) refused(ref presence.SessionRef) time.Duration {
	now := time.Now()
	if left, early := g.appts.Early(ref, now); early {
		return left
	}
	if g.limiter == nil {
		return g.wait()
	}
	return g.limiter.Defer(now)
}

// waiting queues the session a refused join asked for, to be kept while
// its client retries: only a valid room the token grants, joined with
// presence.
func (c *conn) waiting(req protocol.Request) {
	if req.Present != nil && !*req.Present || presence.ValidateRoom(req.Room) != nil || !c.grant.allowed(req.Room) ||
		slices.Contains(c.rooms, req.Room) {
		return
	}
	c.d.joins.extender.Add(time.Now(), c.ref(req.Room))
}

// refuseJoin answers a join the node cannot take now: unavailable with a
// retry hint spread over the node's backlog; its session is kept while
// the client retries.
func (c *conn) refuseJoin(req protocol.Request, wait time.Duration, msg string) {
	c.waiting(req)
	c.d.joins.appts.Set(c.ref(req.Room), time.Now(), wait)
	c.d.metrics.rejectedFrames.WithLabelValues(string(protocol.CodeUnavailable)).Inc()
	c.send(mustJSON(protocol.Error{Type: protocol.TypeError, Code: protocol.CodeUnavailable, Ref: req.Ref,
		Message: msg + "; nothing changed, retry after retry_after_ms", RetryAfterMS: max(1, wait.Milliseconds())}))
}

// admitJoin admits a join that claims a session at the store's pace (a
// storm), or refuses it. The limiter learns that pace from the claims'
// store calls (claimBatcher.observe), not from the joins: a join's time
// also holds its wait for a shared call and, in a big room, for the
// node's fan-out.
func (c *conn) admitJoin(req protocol.Request) bool {
	ok, wait := c.d.joins.admit(c.ref(req.Room))
	if !ok {
		c.refuseJoin(req, wait, "joins are admitted at the store's pace")
	}
	return ok
}

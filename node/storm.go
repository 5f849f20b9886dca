package node

import (
	"slices"
	"time"

	"github.com/presence-dev/presence/internal/storm"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
)

// A node's part in a reconnect storm is package storm's Gate: the join
// limiter (nil with Limits.JoinRate < 0), the appointments and the
// extender. This file wires it to the node's config, metrics and
// connections.

func newJoinGate(cfg Config) *storm.Gate {
	l := cfg.Limits
	g := &storm.Gate{Extender: storm.NewExtender(cfg.Store, storm.ExtendConfig{Every: cfg.extendEvery(), Again: cfg.heartbeat,
		Batch: l.TouchBatch, Max: maxWaiting, Timeout: cfg.StoreTimeout}, cfg.Logger),
		Appts: storm.NewAppointments(maxWaiting, l.MaxRetryAfter)}
	if l.JoinRate > 0 {
		g.Limiter = storm.NewJoinLimiter(storm.JoinLimit{Rate: l.JoinRate, MinRate: l.JoinRateMin, Latency: l.JoinLatency,
			MinRetry: minRetryAfter, MaxRetry: l.MaxRetryAfter})
	}
	return g
}

// wireStorm hands the join gate its metrics and the hint without a
// limiter.
func (n *Node) wireStorm() {
	g := n.joins
	g.Extender.Metrics = &n.metrics.extend
	g.Wait = func() time.Duration {
		n.metrics.join.Refused.Inc()
		d := n.admission.retryAfter()
		n.metrics.join.RetryHint.Observe(d.Seconds())
		return d
	}
	if g.Limiter == nil {
		return
	}
	g.Limiter.Metrics = &n.metrics.join
}

// waiting queues the session a refused join asked for, to be kept while
// its client retries: only a valid room the token grants, joined with
// presence.
func (c *conn) waiting(req protocol.Request) {
	if req.Present != nil && !*req.Present || presence.ValidateRoom(req.Room) != nil || !c.grant.allowed(req.Room) ||
		slices.Contains(c.rooms, req.Room) {
		return
	}
	c.d.joins.Extender.Add(time.Now(), c.ref(req.Room))
}

// refuseJoin answers a join the node cannot take now: unavailable with a
// retry hint spread over the node's backlog; its session is kept while
// the client retries.
func (c *conn) refuseJoin(req protocol.Request, wait time.Duration, msg string) {
	c.waiting(req)
	c.d.joins.Appts.Set(c.ref(req.Room), time.Now(), wait)
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
	ok, wait := c.d.joins.Admit(c.ref(req.Room))
	if !ok {
		c.refuseJoin(req, wait, "joins are admitted at the store's pace")
	}
	return ok
}

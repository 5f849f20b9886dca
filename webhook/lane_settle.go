package webhook

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// answered acts on an attempt's result: settle a 2xx, or count the
// failure and do what the core decides (retry later, dead-letter,
// disable on 410).
func (ln *lane) answered(ctx context.Context, r result) {
	ep := ln.id.Endpoint
	ln.busy(time.Now())
	ln.d.m.attemptTime.WithLabelValues(ep).Observe(r.took.Seconds())
	if r.ok() {
		ln.finish(ctx, false)
		return
	}
	ln.d.m.failures.WithLabelValues(ep, r.class()).Inc()
	b := ln.core.batch
	switch ln.core.failed(r, time.Now()) {
	case retryLater:
		ln.d.m.retries.WithLabelValues(ep).Inc()
		if b.attempts == 1 || b.attempts%10 == 0 {
			ln.d.lg.Warn("webhook: delivery failed; retrying", "lane", ln.id.String(), "webhook_id", b.id,
				"attempts", b.attempts, "failure", r.class(), "err", r.err, "next", time.Until(b.next).Round(time.Millisecond))
		}
	case deadLetter:
		if ln.retry(ctx, func(ctx context.Context) error { return publishDeadLetter(ctx, ln.d.js, ln.id, b) }) != nil {
			return // stopping: the next holder meets the batch again
		}
		ln.d.m.deadLetters.WithLabelValues(ep).Inc()
		ln.d.lg.Error("webhook: batch dead-lettered: not delivered within its retry horizon", "lane", ln.id.String(),
			"webhook_id", b.id, "items", b.visible, "attempts", b.attempts, "failure", r.class(), "horizon", ln.horizon)
		ln.finish(ctx, true)
	case disable:
		ln.d.m.disabled.WithLabelValues(ep, ln.id.Source).Set(1)
		ln.d.lg.Error("webhook: endpoint answered 410 Gone: the lane stops until the configuration is reloaded (SIGHUP)",
			"lane", ln.id.String(), "webhook_id", b.id)
	}
	ln.setState(r.class())
}

// finish settles the current batch: positions and owed markers are
// persisted first, then its messages acknowledged. A settlement that
// cannot be persisted before the lane stops is dropped: the next holder
// delivers the batch again (a duplicate, never a loss).
func (ln *lane) finish(ctx context.Context, dead bool) {
	b := ln.core.batch
	s := ln.core.settle(dead)
	if len(s.positions)+len(s.owe)+len(s.paid) > 0 {
		if ln.retry(ctx, func(ctx context.Context) error { return ln.d.st.persist(ctx, ln.id, s) }) != nil {
			return
		}
	}
	for _, seq := range s.acks {
		if m := ln.msgs[seq]; m != nil {
			_ = m.Ack()
			delete(ln.msgs, seq)
		}
	}
	if !dead && b.visible > 0 {
		ep := ln.id.Endpoint
		ln.d.m.deliveries.WithLabelValues(ep).Inc()
		ln.d.m.events.WithLabelValues(ep).Add(float64(b.visible))
		for _, it := range b.items {
			if it.marker != "" {
				ln.d.m.resyncs.WithLabelValues(ep, it.marker).Inc()
			}
		}
	}
	ln.core.settled(s, time.Now())
	ln.setState("")
}

// shutdown ends the lane: after a graceful stop, an attempt in flight is
// waited for and settled (bounded by the endpoint's timeout).
func (ln *lane) shutdown() error {
	if ln.inflight && ln.graceful.Load() {
		r := <-ln.results
		ln.inflight = false
		if r.ok() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			ln.finish(ctx, false)
			cancel()
		}
	}
	return nil
}

// stats reads the consumer's pending counts for the lag gauges, and
// notices a consumer that is gone.
func (ln *lane) stats(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	held, oldest := ln.core.held()
	lag := uint64(held)
	info, err := ln.cons.Info(ctx)
	switch {
	case err == nil:
		lag = info.NumPending + uint64(info.NumAckPending)
	case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
		return ln.checkStream(ctx)
	}
	if lag == 0 || ln.core.disabled {
		ln.busy(time.Now()) // nothing to deliver, or stopped by a 410 on purpose
	}
	secs := 0.0
	if !oldest.IsZero() {
		secs = time.Since(oldest).Seconds()
	}
	l := ln.id
	ln.d.m.lagEvents.WithLabelValues(l.Endpoint, l.Source).Set(float64(lag))
	ln.d.m.lagSeconds.WithLabelValues(l.Endpoint, l.Source).Set(secs)
	st := *ln.status.Load()
	st.LagEvents, st.LagSeconds = lag, secs
	ln.status.Store(&st)
	return nil
}

// checkStream ends the lane when its stream was made again (its store
// lost) or its consumer is gone; a passing error changes nothing.
func (ln *lane) checkStream(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	s, err := ln.d.js.Stream(ctx, ln.stream.CachedInfo().Config.Name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return errStreamChanged
	case err != nil:
		return nil
	case !s.CachedInfo().Created.Equal(ln.created):
		return errStreamChanged
	}
	if _, err := s.Consumer(ctx, ConsumerName(ln.id.Endpoint)); errors.Is(err, jetstream.ErrConsumerNotFound) {
		return errStreamChanged
	}
	return nil
}

// setState records the lane's state for /healthz.
func (ln *lane) setState(failure string) {
	st := *ln.status.Load()
	switch {
	case ln.core.disabled:
		st.State = "disabled"
	case failure != "":
		st.State = "retrying"
	default:
		st.State = "delivering"
	}
	if failure != "" {
		st.LastFailure = failure
	}
	ln.status.Store(&st)
}

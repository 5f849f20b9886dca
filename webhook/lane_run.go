package webhook

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/presence-dev/presence/bus"
)

// errStreamChanged ends a lane whose stream was made again, or whose
// consumer is gone: the dispatcher starts it afresh.
var errStreamChanged = errors.New("the lane's stream or consumer changed")

// errStalled ends a lane the watchdog found stuck: messages JetStream
// counts as delivered to its consumer never reached it (lost in flight,
// or taken by another client of the durable) and would stay invisible
// until the consumer's AckWait. Started over, it resets the consumer to
// its ack floor and gets them again.
var errStalled = errors.New("the lane made no progress while it had lag")

// run sets the lane up, then feeds the core from the consumer and
// delivers what it says, until ctx ends (or the stream changes).
func (ln *lane) run(ctx, actx context.Context) error {
	if err := ln.retry(ctx, ln.setup); err != nil {
		return err
	}
	cc, err := ln.cons.Consume(func(m jetstream.Msg) {
		select {
		case ln.in <- m:
		case <-ctx.Done():
		}
	}, jetstream.PullMaxMessages(min(pullBatch, ln.ep.Load().e.MaxPending)),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) ||
				errors.Is(err, jetstream.ErrNoHeartbeat) {
				select {
				case ln.trouble <- struct{}{}:
				default:
				}
			}
		}))
	if err != nil {
		return fmt.Errorf("consume: %w", err)
	}
	defer cc.Stop()
	return ln.loop(ctx, actx)
}

// retry runs f until it succeeds or ctx ends, backing off to 2s.
func (ln *lane) retry(ctx context.Context, f func(context.Context) error) error {
	wait := 100 * time.Millisecond
	for try := 1; ; try++ {
		octx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := f(octx)
		cancel()
		if err == nil || ctx.Err() != nil {
			return ctx.Err()
		}
		if try == 1 || try%20 == 0 {
			ln.d.lg.Warn("webhook: lane waits for JetStream", "lane", ln.id.String(), "err", err, "tries", try)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, persistMaxTry)
	}
}

func (ln *lane) loop(ctx, actx context.Context) error {
	tick := time.NewTicker(laneTick)
	defer tick.Stop()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var lastStats, lastEvict time.Time
	for {
		if ctx.Err() != nil { // stopping: no new attempt
			return ln.shutdown()
		}
		wake := ln.next(ctx, actx)
		resetTimer(timer, wake)
		select {
		case m := <-ln.in:
			ln.intake(ctx, m)
		case r := <-ln.results:
			// Settled under actx, which only a lost lease cuts: a graceful
			// stop arriving meanwhile must not drop a 2xx's settlement (the
			// next holder would send the batch again).
			ln.inflight = false
			ln.answered(actx, r)
		case <-timer.C:
		case now := <-tick.C:
			if ln.core.tick(now) {
				ln.refetch(ctx)
			}
			if now.Sub(lastEvict) > evictEvery {
				lastEvict = now
				ln.core.evict(now.Add(-roomIdle))
			}
			if now.Sub(lastStats) > statsEvery {
				lastStats = now
				if err := ln.stats(ctx); err != nil {
					return err
				}
			}
		case <-ln.trouble:
			if err := ln.checkStream(ctx); err != nil {
				return err
			}
		case lift := <-ln.enable:
			ln.reconfigure(lift)
		case <-ln.stalled:
			return errStalled
		case <-ctx.Done():
			return ln.shutdown()
		}
	}
}

// refetch starts the lane's consumer again at its ack floor, in place, as
// a new holder does: a message JetStream counted as delivered but the
// lane never got comes now, not after the AckWait; what the lane holds
// comes again and is ignored, what it settled is skipped by position.
func (ln *lane) refetch(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	ln.d.m.refetches.WithLabelValues(ln.id.Endpoint, ln.id.Source).Inc()
	if _, err := ln.stream.ResetConsumer(ctx, ConsumerName(ln.id.Endpoint)); err != nil {
		ln.d.lg.Warn("webhook: cannot read a gap again from the consumer's ack floor", "lane", ln.id.String(), "err", err)
		return
	}
	ln.d.lg.Info("webhook: a gap outlasted the gap timeout; read again from the consumer's ack floor before it is given up",
		"lane", ln.id.String())
}

func resetTimer(t *time.Timer, at time.Time) {
	t.Stop()
	if at.IsZero() {
		t.Reset(time.Hour)
		return
	}
	t.Reset(max(time.Until(at), time.Millisecond))
}

// next starts what the core says is due, and returns when to look again.
func (ln *lane) next(ctx, actx context.Context) time.Time {
	for !ln.inflight && ctx.Err() == nil { // stopping: the loop shuts down
		now := time.Now()
		b, wake := ln.core.due(now)
		if b == nil {
			return wake
		}
		if b.visible == 0 { // only what the filter leaves out: nothing to send
			ln.finish(ctx, false)
			continue
		}
		rt := ln.ep.Load()
		// An attempt starts only while the lease outlasts it: no two
		// dispatchers deliver a lane at once.
		if until := time.Unix(0, ln.until.Load()); until.Before(now.Add(time.Duration(rt.e.Timeout))) {
			return now.Add(laneTick)
		}
		ln.inflight = true
		ln.busy(now)
		go func(id string, body []byte) {
			r := post(actx, rt.client, rt.e, id, body, time.Now())
			ln.results <- r
		}(b.id, b.body)
	}
	return time.Time{}
}

// intake offers one stream message to the core, reading its room's
// position first when the core does not know it.
func (ln *lane) intake(ctx context.Context, m jetstream.Msg) {
	meta, err := m.Metadata()
	if err != nil {
		_ = m.Ack()
		return
	}
	t, err := bus.DecodeEvent(m.Data())
	if err != nil || t.Region != ln.id.Source || t.Seq == 0 {
		ln.d.m.malformed.WithLabelValues(ln.id.Endpoint, ln.id.Source).Inc()
		ln.d.lg.Warn("webhook: a stream message is not an event of the source; skipped", "lane", ln.id.String(), "subject", m.Subject(), "err", err)
		_ = m.Ack()
		return
	}
	it := &item{id: t.ID, room: t.Room, pos: position{t.Epoch, t.Seq}, sseq: meta.Sequence.Stream, stored: meta.Timestamp, at: t.At}
	if ln.ep.Load().e.matches(t) {
		it.data = m.Data()
	}
	var pos *position
	if ln.core.needsPosition(t.Room) {
		_ = ln.retry(ctx, func(ctx context.Context) error {
			pos, err = ln.d.st.position(ctx, ln.id, t.Room)
			return err
		})
		if ctx.Err() != nil {
			return
		}
	}
	ln.msgs[it.sseq] = m // the latest copy: its ack is current
	for _, seq := range ln.core.offer(it, pos, time.Now()) {
		if mm := ln.msgs[seq]; mm != nil {
			_ = mm.Ack()
			delete(ln.msgs, seq)
		}
	}
}

// reconfigure takes the endpoint's new settings (for the batches formed
// from now on) and, with lift, ends a 410's stop.
func (ln *lane) reconfigure(lift bool) {
	e := ln.ep.Load().e
	horizon := ln.horizon
	if e.RetryHorizon != 0 {
		horizon = time.Duration(e.RetryHorizon)
	}
	ln.core.lim = limitsOf(e, horizon)
	if lift && ln.core.disabled {
		ln.core.enable(time.Now())
		ln.d.m.disabled.WithLabelValues(ln.id.Endpoint, ln.id.Source).Set(0)
		ln.d.lg.Info("webhook: lane delivers again after the configuration was reloaded", "lane", ln.id.String())
	}
}

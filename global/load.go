package global

import (
	"context"
	"fmt"
	"time"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/presence"
)

// readResult is what one read of the stream's new messages found.
type readResult struct {
	gen   uint64 // viewGen when it started
	msgs  []storedMsg
	more  bool // it stopped before the stream's end: a busy stream
	reset bool // the stream ends before where the read started: it was recreated
	err   error
}

// startRead reads the stream's messages after the announced view, unless
// a read or a re-read is under way. Every tick starts one, so a standby
// follows the leader's writes and the leader sees any other writer's;
// queries waiting on current are answered by the first read that starts
// after they asked.
func (a *Aggregator) startRead(ctx context.Context) {
	if a.reading || a.loading {
		return
	}
	a.reading = true
	a.readWaiters, a.nextWaiters = a.nextWaiters, nil
	from, gen := a.c.ann.through+1, a.viewGen
	a.reads++
	checkInfo := a.reads%infoEvery == 0
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		rctx, cancel := context.WithTimeout(ctx, a.cfg.AckTimeout)
		defer cancel()
		res := readResult{gen: gen}
		_, res.more, res.err = readStream(rctx, a.cfg.NATS, a.prefix, StreamName, bus.RegionFilter(bus.GlobalRegion), from, readBatches,
			func(m storedMsg) { res.msgs = append(res.msgs, m) })
		if res.err == nil && checkInfo && len(res.msgs) == 0 {
			info, err := a.stream.Info(rctx)
			res.err = err
			res.reset = err == nil && info.State.LastSeq+1 < from
		}
		select {
		case a.readCh <- res:
		case <-ctx.Done():
		}
	}()
}

// onRead folds what a read found into the announced view.
func (a *Aggregator) onRead(ctx context.Context, res readResult) touchSet {
	a.reading = false
	waiters := a.readWaiters
	a.readWaiters = nil
	if res.gen != a.viewGen {
		// A re-read was installed meanwhile: read again after it.
		a.nextWaiters = append(waiters, a.nextWaiters...)
		a.startRead(ctx)
		return nil
	}
	if res.err != nil {
		a.stats.ReadErrors.Add(1)
		a.log.Debug("global: cannot read the global stream", "err", res.err)
		a.answer(waiters, fmt.Errorf("global: the global stream does not answer: %w", res.err))
		return nil
	}
	if res.reset {
		a.log.Warn("global: the global stream was recreated; re-reading it")
		a.nextWaiters = append(waiters, a.nextWaiters...)
		a.chainOK = false
		a.startReload(ctx)
		return nil
	}
	touched := touchSet{}
	a.mu.Lock()
	for _, m := range res.msgs {
		if m.seq <= a.c.ann.through {
			continue // our own write, already folded
		}
		t, ok := decodeGlobal(m.subject, m.data)
		if !ok {
			a.stats.Malformed.Add(1)
			a.c.ann.skip(m.seq)
			a.chainOK = false // our next write would be rejected
			continue
		}
		a.c.ann.apply(t, m.seq, m.at)
		// Another writer moved the stream: our next write would be
		// rejected.
		a.chainOK = false
		touched.add(t.Room, t.User)
	}
	a.mu.Unlock()
	if res.more {
		// Not at the stream's end yet: the waiters wait for the rest.
		a.nextWaiters = append(waiters, a.nextWaiters...)
	} else {
		a.answer(waiters, nil)
	}
	if len(a.nextWaiters) > 0 || res.more {
		a.startRead(ctx)
	}
	return touched
}

// decodeGlobal decodes a message of the global stream.
func decodeGlobal(subject string, data []byte) (presence.Transition, bool) {
	t, err := bus.DecodeEvent(data)
	if err != nil || t.Region != bus.GlobalRegion || bus.EventSubject(t) != subject {
		return presence.Transition{}, false
	}
	return t, true
}

// loadResult is a re-read of the whole stream.
type loadResult struct {
	ann     *announced
	through uint64
	stale   []purgeReq
	err     error
}

// startReload re-reads the announced view from the stream, unless a
// re-read or a write round is under way (the round's end starts one if
// still needed).
func (a *Aggregator) startReload(ctx context.Context) {
	if a.loading || a.round != nil {
		return
	}
	a.loading, a.lastReload = true, time.Now()
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		var res loadResult
		res.ann, res.through, res.stale, res.err = a.load(ctx)
		select {
		case a.loadCh <- res:
		case <-ctx.Done():
		}
	}()
}

// onLoad installs a re-read view and restarts the write chain on it. It
// returns everyone, to evaluate against the new view.
func (a *Aggregator) onLoad(ctx context.Context, res loadResult) touchSet {
	a.loading = false
	if res.err != nil {
		a.stats.ReadErrors.Add(1)
		a.log.Warn("global: cannot read the global stream", "err", res.err)
		a.answer(a.nextWaiters, fmt.Errorf("global: the global stream does not answer: %w", res.err))
		a.nextWaiters = nil
		return nil
	}
	a.stats.Reloads.Add(1)
	a.viewGen++
	a.next, a.chainOK = res.through, a.leader.Load()
	a.mu.Lock()
	a.c.ann = res.ann
	for _, p := range res.stale {
		a.queuePurge(p)
	}
	touched := a.c.everyone()
	a.mu.Unlock()
	if len(a.nextWaiters) > 0 {
		a.startRead(ctx)
	}
	return touched
}

// load reads the stream's messages, in stream order, into a new announced
// view (the stream keeps one message per subject, so that is each
// subject's last). It returns the view, the stream sequence it is
// complete through, and the online messages that a later offline of the
// same user superseded (to purge). It uses no consumer: see direct.go.
func (a *Aggregator) load(ctx context.Context) (*announced, uint64, []purgeReq, error) {
	ctx, cancel := context.WithTimeout(ctx, loadTimeout)
	defer cancel()
	// The last sequence first: every message up to it that still exists
	// is then read, and messages stored meanwhile may be too.
	info, err := a.stream.Info(ctx)
	if err != nil {
		return nil, 0, nil, fmt.Errorf("global: load %s: %w", StreamName, err)
	}
	ann := newAnnounced()
	var stale []purgeReq
	now := time.Now()
	_, _, err = readStream(ctx, a.cfg.NATS, a.prefix, StreamName, bus.RegionFilter(bus.GlobalRegion), 1, 0, func(m storedMsg) {
		t, ok := decodeGlobal(m.subject, m.data)
		if !ok {
			a.stats.Malformed.Add(1)
			ann.skip(m.seq)
			return
		}
		if on := ann.apply(t, m.seq, m.at); on != 0 {
			stale = append(stale, purgeReq{onlineSubject(t.Room, t.User), m.seq})
		}
	})
	if err != nil {
		return nil, 0, nil, fmt.Errorf("global: load %s: %w", StreamName, err)
	}
	ann.skip(info.State.LastSeq)
	ann.settle(now, a.cfg.OfflineRetention)
	return ann, ann.through, stale, nil
}

func onlineSubject(room, user string) string {
	return bus.EventSubject(presence.Transition{Region: bus.GlobalRegion, Room: room, Kind: presence.Online, User: user})
}

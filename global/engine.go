package global

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/presence"
)

// engine owns the decisions: every input is applied, the touched users
// evaluated and, on the leader, the resulting transitions written. The
// network work it starts (reads, re-reads, write rounds) runs in its own
// goroutines and comes back as an input.
func (a *Aggregator) engine(ctx context.Context) {
	defer a.wg.Done()
	defer close(a.stopped)
	t := time.NewTicker(max(a.cfg.Cadence/4, 10*time.Millisecond))
	defer t.Stop()
	prune := time.NewTicker(time.Minute)
	defer prune.Stop()
	for {
		var touched touchSet
		select {
		case <-ctx.Done():
			a.answer(append(a.readWaiters, a.nextWaiters...), errClosed)
			return
		case m := <-a.syncCh:
			touched = a.onPublication(m)
		case res := <-a.readCh:
			touched = a.onRead(ctx, res)
		case res := <-a.loadCh:
			touched = a.onLoad(ctx, res)
		case err := <-a.roundCh:
			touched = a.onRound(ctx, err)
		case w := <-a.currentCh:
			a.nextWaiters = append(a.nextWaiters, w)
			a.startRead(ctx)
		case <-a.leaseCh:
			a.chainOK = false
			if a.leader.Load() {
				a.startReload(ctx)
			}
		case <-t.C:
			a.mu.Lock()
			touched = a.c.tick(time.Now())
			a.mu.Unlock()
			if a.leader.Load() && !a.chainOK && time.Since(a.lastReload) >= reloadPause {
				a.startReload(ctx) // an earlier one failed
			}
			a.startRead(ctx)
		case <-prune.C:
			a.mu.Lock()
			a.c.ann.prune(time.Now(), func(room string) bool { return a.c.dec[room] != nil })
			a.mu.Unlock()
		}
		a.settle(ctx, touched)
	}
}

func (a *Aggregator) onPublication(m *nats.Msg) touchSet {
	p, err := decodePublication(m.Subject, m.Data)
	if err != nil {
		a.stats.Malformed.Add(1)
		a.log.Debug("global: dropping a malformed publication", "subject", m.Subject, "err", err)
		return nil
	}
	oversize := a.stats.OversizeFulls.Load()
	a.mu.Lock()
	touched, ask := a.c.publication(p, time.Now())
	a.mu.Unlock()
	if a.stats.OversizeFulls.Load() != oversize {
		a.log.Error("global: dropped a full snapshot larger than MaxFullBytes; the region cannot sync until it is raised",
			"region", p.Region, "gen", p.Gen, "seq", p.Seq, "max_full_bytes", a.cfg.MaxFullBytes)
	}
	if ask {
		_ = a.cfg.NATS.Publish(bus.SyncResyncSubject(p.Region), a.resyncBody())
	}
	return touched
}

// resyncBody is the body of a resync request: who asks (informational).
func (a *Aggregator) resyncBody() []byte {
	b, _ := json.Marshal(struct {
		From string `json:"from"`
	}{a.cfg.Instance})
	return b
}

// errClosed answers the queries still waiting when the aggregator stops.
var errClosed = errors.New("global: aggregator closed")

// current returns once the announced view holds everything the global
// stream held when it was called, or why it cannot: the stream does not
// answer (this aggregator is cut off from it) or ctx is done. Queries
// call it first, so an answer is never older than a transition the
// asker may already have received; an aggregator that cannot vouch for
// its view refuses to answer, and the asker falls back.
func (a *Aggregator) current(ctx context.Context) error {
	if a.cancel == nil {
		return errors.New("global: aggregator not started")
	}
	done := make(chan error, 1)
	select {
	case a.currentCh <- done:
	case <-a.stopped:
		return errClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (a *Aggregator) answer(ws []chan error, err error) {
	for _, w := range ws {
		w <- err // buffered, read at most once
	}
}

// write is one transition of a round with the stream sequence it must
// get.
type write struct {
	t    presence.Transition
	msg  *nats.Msg
	seq  uint64
	prev uint64 // the online an offline supersedes, to purge once stored
}

// settle evaluates the touched users and, on the leader, starts a round
// writing the transitions they call for. While a round is under way the
// touched users wait for its end: their intents are decided on the view
// it leaves.
func (a *Aggregator) settle(ctx context.Context, touched touchSet) {
	if len(touched) == 0 {
		return
	}
	if a.round != nil {
		if a.pending == nil {
			a.pending = touchSet{}
		}
		for room, users := range touched {
			for u := range users {
				a.pending.add(room, u)
			}
		}
		return
	}
	a.mu.Lock()
	now := time.Now()
	// A standby evaluates too: its timers stay the leader's. Its intents,
	// and a leader's while its chain is broken, are dropped: the re-read
	// that any new leader or broken chain starts evaluates everyone.
	intents := a.c.evaluate(touched, now)
	if !a.leader.Load() || !a.chainOK || len(intents) == 0 {
		a.mu.Unlock()
		return
	}
	round := a.prepare(intents, now)
	a.mu.Unlock()
	if len(round) == 0 {
		return
	}
	a.round = round
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		err := a.send(ctx, round)
		select {
		case a.roundCh <- err:
		case <-ctx.Done():
		}
	}()
}

// onRound ends a write round: stored, its offlines are forgotten and the
// onlines they supersede purged; rejected, the stream is re-read. It
// returns the users touched while the round was under way.
func (a *Aggregator) onRound(ctx context.Context, err error) touchSet {
	round := a.round
	a.round = nil
	if err == nil {
		a.stats.Transitions.Add(int64(len(round)))
		a.mu.Lock()
		for _, w := range round {
			if w.t.Kind == presence.Offline {
				// Kept until stored: a failed round decides again.
				a.c.forget(w.t.Room, w.t.User)
			}
			if w.prev != 0 {
				a.queuePurge(purgeReq{onlineSubject(w.t.Room, w.t.User), w.seq})
			}
		}
		a.mu.Unlock()
	} else if ctx.Err() == nil {
		a.stats.Conflicts.Add(1)
		a.log.Info("global: the stream rejected a round; re-reading it", "err", err)
		a.chainOK = false
	}
	if !a.chainOK && a.leader.Load() {
		a.startReload(ctx)
	}
	touched := a.pending
	a.pending = nil
	return touched
}

// prepare numbers the intents, folds them into the announced view as if
// stored (a failed round reloads the view) and builds their messages.
// a.mu is held.
func (a *Aggregator) prepare(intents []intent, now time.Time) []write {
	round := make([]write, 0, len(intents))
	for _, it := range intents {
		epoch, seq := a.c.ann.next(it.room, now)
		t := presence.Transition{
			ID: transitionID(it.room, epoch, seq), Region: bus.GlobalRegion, Room: it.room, User: it.user,
			Kind: it.kind, Reason: it.reason, Sessions: it.sessions, Seq: seq, Epoch: epoch, At: now,
			Session: it.session,
		}
		if it.state != "" {
			t.State = json.RawMessage(it.state)
		}
		data, err := bus.EncodeEvent(t)
		if err != nil {
			a.log.Error("global: cannot encode a transition", "err", err)
			continue
		}
		a.next++
		w := write{t: t, seq: a.next, msg: &nats.Msg{Subject: bus.GlobalIngestSubject(t), Data: data, Header: nats.Header{}}}
		w.prev = a.c.ann.apply(t, w.seq, now)
		round = append(round, w)
	}
	return round
}

// send writes a round in order, each message expecting the one before it
// as the stream's last, and waits for every ack (AckTimeout per window of
// roundWindow writes).
func (a *Aggregator) send(ctx context.Context, round []write) error {
	js := a.cfg.JetStream
	for start := 0; start < len(round); start += roundWindow {
		if err := a.sendWindow(ctx, js, round[start:min(start+roundWindow, len(round))]); err != nil {
			return err
		}
	}
	return nil
}

func (a *Aggregator) sendWindow(ctx context.Context, js jetstream.JetStream, ws []write) error {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.AckTimeout)
	defer cancel()
	futs := make([]jetstream.PubAckFuture, 0, len(ws))
	for _, w := range ws {
		opts := []jetstream.PublishOpt{
			jetstream.WithExpectLastSequence(w.seq - 1),
			jetstream.WithMsgID(w.t.ID),
			jetstream.WithExpectStream(StreamName),
		}
		if w.t.Kind != presence.Online {
			// Offlines and updates age out; an online stays while its
			// user is a member.
			opts = append(opts, jetstream.WithMsgTTL(a.cfg.OfflineRetention))
		}
		f, err := js.PublishMsgAsync(w.msg, opts...)
		if err != nil {
			return fmt.Errorf("write %s: %w", w.t.ID, err)
		}
		futs = append(futs, f)
	}
	for i, f := range futs {
		w := ws[i]
		select {
		case ack := <-f.Ok():
			if ack.Sequence != w.seq || ack.Duplicate {
				return fmt.Errorf("write %s: stored at %d (duplicate %v), expected %d", w.t.ID, ack.Sequence, ack.Duplicate, w.seq)
			}
		case err := <-f.Err():
			return fmt.Errorf("write %s: %w", w.t.ID, err)
		case <-ctx.Done():
			return fmt.Errorf("write %s: waiting for ack: %w", w.t.ID, ctx.Err())
		}
	}
	return nil
}

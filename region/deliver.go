package region

import (
	"context"
	"sync"
	"time"

	"github.com/presence-dev/presence/presence"
)

// outQueue bounds the deliveries waiting for the deliverer (with
// AsyncDelivery); past it they are left to the reaper's redelivery.
const outQueue = 4096

// deliver hands each room's outbox entries to the sink, at once or, with
// AsyncDelivery, through the deliverer; it returns their transitions.
func (s *Store) deliver(ctx context.Context, pending map[string][]string) []presence.Transition {
	if len(pending) == 0 {
		return nil
	}
	if s.outq == nil {
		return s.deliverNow(ctx, pending)
	}
	var ts []presence.Transition
	for room, entries := range pending {
		for _, e := range entries {
			if t, err := decodeEntry(s.opt.Region, room, e); err == nil {
				ts = append(ts, t)
			}
		}
	}
	select {
	case s.outq <- pending:
	default:
		s.stats.PublishErrors.Add(1)
		s.log.Warn("presence: delivery queue full; a reaper will deliver", "rooms", len(pending))
	}
	return ts
}

// runDeliverer delivers what deliver queued, until ctx is done. Each
// room is a lane: one delivery of a room at a time, its entries in the
// order queued (what comes while one is under way waits for its publish
// and ack, then goes in one batch), so the sink stores a room's
// transitions in seq order; other rooms' deliveries run beside it, up to
// deliverParallel, so an event never waits for another room's round
// trip. While outQueue entries wait for their lanes it takes nothing
// more, so deliver's queue fills and what comes then is left to the
// reaper: a sink that hangs holds a bounded backlog here. What is still
// queued when ctx ends stays in the outbox for the reaper.
func (s *Store) runDeliverer(ctx context.Context) {
	l := lanes{busy: map[string]bool{}, waiting: map[string][]string{}, done: make(chan string, deliverParallel)}
	defer l.wg.Wait()
	for {
		in := s.outq
		if l.entries >= outQueue {
			in = nil
		}
		select {
		case <-ctx.Done():
			return
		case p := <-in:
			for room, es := range p {
				l.queue(room, es)
			}
		case room := <-l.done:
			delete(l.busy, room)
		}
		l.startDue(func(room string, es []string) {
			dctx, cancel := context.WithTimeout(ctx, s.opt.PublishLease)
			defer cancel()
			s.deliverNow(dctx, map[string][]string{room: es})
		})
	}
}

// lanes is the deliverer's state, owned by its goroutine: the rooms with
// a delivery under way and the entries waiting, per room, in the order
// their rooms first waited.
type lanes struct {
	busy    map[string]bool
	waiting map[string][]string
	entries int      // in waiting
	order   []string // rooms of waiting, first waited first
	done    chan string
	wg      sync.WaitGroup
}

func (l *lanes) queue(room string, es []string) {
	if _, ok := l.waiting[room]; !ok {
		l.order = append(l.order, room)
	}
	l.waiting[room] = append(l.waiting[room], es...)
	l.entries += len(es)
}

// startDue starts a delivery of every waiting room that has none under
// way, while fewer than deliverParallel run.
func (l *lanes) startDue(deliver func(room string, es []string)) {
	kept := l.order[:0]
	for i, room := range l.order {
		if len(l.busy) >= deliverParallel {
			kept = append(kept, l.order[i:]...)
			break
		}
		if l.busy[room] {
			kept = append(kept, room)
			continue
		}
		es := l.waiting[room]
		delete(l.waiting, room)
		l.entries -= len(es)
		l.busy[room] = true
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			deliver(room, es)
			l.done <- room // never blocks: at most deliverParallel run
		}()
	}
	clear(l.order[len(kept):])
	l.order = kept
}

// publishRoom hands one room's entries to the sink, renumbered first if
// the sink's stream is younger than the room's numbering (aboveFloor). A
// publish that fails because the stream had to be made again is tried
// once more, renumbered (the sink refuses transitions below its floor). It returns what it published and the ack's
// arguments.
func (s *Store) publishRoom(ctx context.Context, room string, entries []string) ([]presence.Transition, []any, uint64, error) {
	for try := 0; ; try++ {
		es, err := s.aboveFloor(ctx, room, entries)
		if err != nil {
			return nil, nil, 0, err
		}
		ts := make([]presence.Transition, 0, len(es))
		ack := []any{ms(s.opt.PublishLease), room, 0, 0}
		for _, e := range es {
			ack = append(ack, e)
			t, err := decodeEntry(s.opt.Region, room, e)
			if err != nil {
				s.log.Error("presence: dropping malformed outbox entry", "room", room, "entry", e, "err", err)
				continue
			}
			ts = append(ts, t)
		}
		if len(ts) == 0 {
			return nil, nil, 0, nil
		}
		sseq, err := s.opt.Sink.Publish(ctx, ts)
		if err == nil || try > 0 || !s.belowFloor(ctx, es) {
			return ts, ack, sseq, err
		}
	}
}

// ackTimeout bounds the acknowledgement of delivered entries.
const ackTimeout = 2 * time.Second

// deliverParallel bounds the rooms the deliverer publishes at once.
const deliverParallel = 64

// deliverNow hands each room's outbox entries to the sink and acknowledges
// the delivered ones. Entries it cannot deliver stay in the outbox, and a
// reaper delivers them after the publish lease.
func (s *Store) deliverNow(ctx context.Context, pending map[string][]string) []presence.Transition {
	var all []presence.Transition
	var acks []call
	var seen []presence.Transition
	for room, entries := range pending {
		ts, ack, sseq, err := s.publishRoom(ctx, room, entries)
		if len(ts) == 0 && err == nil {
			continue
		}
		if err != nil {
			s.stats.PublishErrors.Add(1)
			s.log.Warn("presence: publish failed; a reaper will retry", "room", room, "events", len(ts), "err", err)
			continue
		}
		s.stats.Transitions.Add(int64(len(ts)))
		ack[2], ack[3] = ts[len(ts)-1].Seq, sseq
		all = append(all, ts...)
		for _, t := range ts {
			if t.Kind == presence.Online || t.Kind == presence.Offline {
				seen = append(seen, t)
			}
		}
		acks = append(acks, call{
			script: scriptAck,
			keys:   s.roomKeys(room).writeKeys(s.indexKey(room)),
			args:   ack,
		})
	}
	// The acks and the last-seen writes of joins and departures go in one
	// round trip.
	calls := append(acks, s.seenCalls(s.departuresSeen(seen))...)
	if len(calls) > 0 {
		// Stored events are acked even when the publish used up ctx: an
		// unacked entry is delivered again after the lease.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ackTimeout)
		defer cancel()
		cmds, _ := runAll(actx, s.rdb, calls)
		for i, c := range cmds {
			if err := c.Err(); err != nil && i < len(acks) {
				s.log.Warn("presence: ack failed; events will be delivered again", "err", err)
			}
		}
		s.countSeen(cmds[len(acks):])
	}
	return all
}

package node

import (
	"context"
	"time"

	"github.com/presence-dev/presence/protocol"
)

// Resyncs: a room whose position is lost (a gap that stays open, a new
// epoch, a NATS reconnect) starts over from a new snapshot, sent to every
// member with reason resync; members that fell behind (fanout.go) take
// the same path once their queue has drained.

// resetLocked forgets the room's position and puts every member on a
// resync.
func (h *hub) resetLocked(r *room) {
	r.seq.Forget()
	r.early, r.lost, r.pending, r.buffered, r.dropped = nil, false, nil, nil, 0
	delete(h.gappy, r)
	for c, m := range r.members {
		m.floor = 0 // the numbering starts over
		switch {
		case m.in.count:
			// Counts are read, not folded: read again, as events may
			// have been lost.
		case m.behind:
			// Served once its queue has drained (checkBehind).
		default:
			m.live, m.resync = false, true
			r.noteLocked(c, m)
		}
	}
	if r.counters > 0 {
		r.countDirty = true
		h.out.dirty[r] = struct{}{}
	}
	h.metrics.resyncs.Inc()
	h.startResyncLocked(r)
}

// startResyncLocked runs a resync of r unless one is running.
func (h *hub) startResyncLocked(r *room) {
	if !r.resyncing {
		r.resyncing = true
		h.wg.Add(1)
		go h.runResync(r)
	}
}

// runResync takes snapshots until no member waits on a resync, retrying
// while the store fails.
func (h *hub) runResync(r *room) {
	defer h.wg.Done()
	for {
		if len(h.waiting(r)) == 0 {
			return
		}
		ctx, cancel := context.WithTimeout(h.ctx, h.timeout)
		snap, err := h.store.Snapshot(ctx, r.name, 0, h.limit)
		cancel()
		var moved bool
		if err == nil {
			moved, err = h.moveRoom(r.name, snap.Region)
		}
		if moved {
			continue // read it again, on the view's subscription
		}
		if err == nil {
			h.mu.Lock()
			// Readying may start the room over, putting members back on a
			// resync: the loop then looks again with a fresh count.
			if ms := h.waitingLocked(r); len(ms) > 0 {
				h.readyLocked(r, snap, "", protocol.ReasonResync, ms)
			}
			h.mu.Unlock()
			continue
		}
		h.log.Warn("node: resync snapshot failed; retrying", "room", r.name, "err", err)
		select {
		case <-h.ctx.Done():
			h.mu.Lock()
			r.resyncing = false
			h.mu.Unlock()
			return
		case <-time.After(resyncPause):
		}
	}
}

// waiting returns the members waiting on a resync of r; when there are
// none, the resync is over.
func (h *hub) waiting(r *room) map[*conn]*member {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.waitingLocked(r)
}

func (h *hub) waitingLocked(r *room) map[*conn]*member {
	ms := map[*conn]*member{}
	if !r.gone {
		for c, m := range r.members {
			if m.resync {
				ms[c] = m
			}
		}
	}
	if len(ms) == 0 {
		r.resyncing = false
	}
	return ms
}

// resyncAll starts every room over; after a NATS reconnect, transitions
// sent while disconnected are lost.
func (h *hub) resyncAll() {
	h.watches.resync()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.rooms {
		select {
		case <-r.ready:
			h.resetLocked(r)
		default:
		}
	}
}

// checkGaps resyncs rooms whose gap stayed open too long.
func (h *hub) checkGaps(now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for r := range h.gappy {
		if r.seq.Overdue(now) {
			_, base, _ := r.seq.Position()
			h.log.Info("node: transitions missing; resyncing the room", "room", r.name, "base", base)
			h.resetLocked(r)
		}
	}
}

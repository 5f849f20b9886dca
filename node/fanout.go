package node

import (
	"cmp"
	"context"
	"errors"
	"github.com/presence-dev/presence/protocol"
	"slices"
	"time"

	"github.com/gorilla/websocket"
)

// The tick's work (docs/PROTOCOL.md, "Big rooms"): each room's batch of
// events goes out as one events frame per member, encoded once per detail;
// count members get the room's count when it changed; members whose queue
// has drained after falling behind get a resync snapshot.

// Counter reads a room's member count without listing it: the regional
// store (*region.Store), the global view's client, and the node's views
// all have it. Count frames come from it.
type Counter interface {
	Count(ctx context.Context, room string) (int, error)
}

// errNoCounts refuses view count where the snapshots' source has no
// Counter.
var errNoCounts = errors.New("node: the store does not count rooms")

// turnSplit is how many turns of a busy room fit in a tick: its members
// take turns every quarter tick (25 ms at the default tick), so that each
// turn's burst of writes is a quarter of a tick's (minGrain bounds it).
const (
	turnSplit = 4
	minGrain  = 5 * time.Millisecond
)

// splitOf is how many grains, the dispatcher's fan-out period, a tick
// holds: turnSplit, fewer for ticks under turnSplit × minGrain.
func splitOf(tick time.Duration) int {
	return int(min(turnSplit, max(1, tick/minGrain)))
}

// fanOut runs once per tick on the dispatcher: every room's due frames.
func (h *hub) fanOut() { h.fan(true) }

// fan runs once per grain (a tick / h.split) on the dispatcher: at a tick
// (full) every room whose frames are due, between ticks only the turns of
// rooms whose members take turns. A room that does not take turns keeps
// to the tick, so its events of one tick still go out as one frame.
func (h *hub) fan(full bool) {
	h.mu.Lock()
	now := h.now()
	every := h.intervalLocked()
	var reads []*room
	for r := range h.dirty {
		if h.rooms[r.name] != r {
			delete(h.dirty, r)
			continue
		}
		if now.Before(r.next) {
			continue // its share of the budget is spent: a later tick
		}
		if r.turn == 0 {
			// A round's turns are fixed when it begins, so that each
			// member gets exactly one turn a round however the room's
			// size moves meanwhile.
			r.turns = h.turnsLocked(every)
		}
		taking := r.turns > 1 && len(r.pending) > 0
		if !taking && (!full || now.Sub(r.turned) < h.tick-h.grain()/2) {
			// Not taking turns, it goes at a tick, and a tick after its
			// last turn: the members of that turn have had one frame of
			// this tick.
			continue
		}
		counts := true
		if taking {
			// A room whose members take turns gets a turn every grain;
			// its count members a count once a round.
			r.next, r.turned = now.Add(h.grain()/2), now
			turn := r.turn
			h.flushLocked(r, r.turns, turn, now)
			r.turn = (turn + 1) % r.turns
			counts = turn == 0
		} else {
			r.turn = 0
			// Half a tick early, so that ticks arriving a little late do
			// not skip one more.
			r.next = now.Add(every - h.tick/2)
			h.flushLocked(r, 1, 0, now)
		}
		if counts && r.countDirty && !h.counting {
			r.countDirty = false
			reads = append(reads, r)
		}
		if !r.countDirty && len(r.pending) == 0 {
			delete(h.dirty, r)
		}
	}
	h.wakeLocked()
	h.checkBehindLocked()
	h.releaseWatchEventsLocked(time.Now())
	if len(reads) > 0 {
		h.counting = true
		h.wg.Add(1)
		go h.readCounts(reads)
	}
	h.mu.Unlock()
}

// intervalLocked is how often a busy room's frames go out: every tick,
// unless the busy rooms' members at one frame per tick would take more
// than the budget.
func (h *hub) intervalLocked() time.Duration {
	if h.budget <= 0 {
		return h.tick
	}
	n := 0
	for r := range h.dirty {
		switch {
		case len(r.pending) > 0:
			n += len(r.members)
		case r.countDirty:
			n += r.counters
		}
	}
	return max(h.tick, time.Duration(float64(n)/float64(h.budget)*float64(time.Second)))
}

// turnsLocked is how many turns a busy room's members take at the
// interval every, one turn a grain: a room of 15,000 at the budget's
// 50,000 frames/s is sent to every 300 ms, a twelfth of its members each
// 25 ms, rather than to all of them at once every third tick. The frames
// per second are the same; a turn's burst of writes, and so the wait of
// the members written last, is a twelfth. A room sent to every tick
// does not take turns.
func (h *hub) turnsLocked(every time.Duration) int {
	if h.tick <= 0 || (every+h.tick/2)/h.tick <= 1 {
		return 1
	}
	g := h.grain()
	return max(1, int((every+g/2)/g))
}

// now is the fan-out's clock.
func (h *hub) now() time.Time {
	if h.clock != nil {
		return h.clock()
	}
	return time.Now()
}

// grain is the dispatcher's fan-out period: a tick, or a share of it.
func (h *hub) grain() time.Duration {
	return h.tick / time.Duration(max(1, h.split))
}

// flushLocked sends r's pending events to the live members taking events
// frames whose turn it is (member.slot mod turns; every member when turns
// is 1): each gets those above its after, one frame encoded once for all
// members at the same after and detail (all of a turn but those that
// joined in between), compressed once for those that negotiated deflate.
// Pending keeps what members of other turns still need. A member with
// behindFrames frames queued gets nothing: it falls behind
// (checkBehindLocked). A member whose turn comes within a tick of its
// last one (the room's turns changed between rounds: slot 6 is the last
// of 7 turns and the first of 6) waits for its next turn, so that it
// never gets two frames within a tick.
func (h *hub) flushLocked(r *room, turns, turn int, now time.Time) {
	if len(r.pending) == 0 {
		return
	}
	last := r.pending[len(r.pending)-1].seq
	queued := time.Now()
	type frameKey struct {
		after uint64
		d     detail
	}
	type shared struct {
		b  []byte
		pm *websocket.PreparedMessage
	}
	frames := map[frameKey]*shared{}
	keep, sentFrom := last, last // lowest after of the others; of this turn
	for c, m := range r.members {
		if !m.live || !m.in.batch || m.in.count || m.after >= last {
			continue
		}
		if turns > 1 && (int(m.slot%uint32(turns)) != turn || now.Sub(m.framed) < h.tick-h.grain()/2) {
			keep = min(keep, m.after)
			continue
		}
		if c.queued() >= behindFrames {
			m.live, m.behind = false, true
			r.noteLocked(c, m)
			h.behind[r] = struct{}{}
			h.metrics.behind.Inc()
			continue
		}
		k := frameKey{m.after, m.in.detail}
		f := frames[k]
		if f == nil {
			f = &shared{b: encodeEvents(r.view, r.name, r.pending, m.after, m.in.detail)}
			frames[k] = f
		}
		if f.b != nil {
			var pm *websocket.PreparedMessage
			if c.deflate {
				if f.pm == nil {
					f.pm = mustPrepare(f.b) // once, for every member taking it
				}
				pm = f.pm
			}
			h.holdSharedLocked(c, outFrame{b: f.b, pm: pm, at: queued})
			h.metrics.batches.Inc()
			m.framed = now
		}
		sentFrom = min(sentFrom, m.after)
		m.after = last
	}
	// The oldest event sent, and how long it waited for this turn.
	if i := firstAbove(r.pending, sentFrom); i < len(r.pending) && !r.pending[i].at.IsZero() {
		h.metrics.fanWait.Observe(time.Since(r.pending[i].at).Seconds())
	}
	n := firstAbove(r.pending, keep)
	switch {
	case n == len(r.pending) && cap(r.pending) > 1024:
		r.pending = nil // a burst's array is not kept
	case n == len(r.pending):
		clear(r.pending)
		r.pending = r.pending[:0]
	case n > 0:
		r.pending = slices.Delete(r.pending, 0, n)
	}
}

// firstAbove is the index of the first of es with a seq above after.
func firstAbove(es []event, after uint64) int {
	i, _ := slices.BinarySearchFunc(es, after+1, func(e event, s uint64) int { return cmp.Compare(e.seq, s) })
	return i
}

// checkBehindLocked puts members that fell behind on a resync once their
// queue has drained.
func (h *hub) checkBehindLocked() {
	for r := range h.behind {
		waiting, ready := false, false
		if h.rooms[r.name] == r {
			for c, m := range r.members {
				if !m.behind {
					continue
				}
				if c.queued() > 0 {
					waiting = true
					continue
				}
				m.behind, m.resync, ready = false, true, true
				r.noteLocked(c, m)
			}
		}
		if ready {
			h.startResyncLocked(r)
		}
		if !waiting {
			delete(h.behind, r)
		}
	}
}

// readCounts reads the count of each room and sends it to its count
// members that have an older one. A failed read is retried at the next
// tick.
func (h *hub) readCounts(rooms []*room) {
	defer h.wg.Done()
	for _, r := range rooms {
		h.mu.Lock()
		h.gen++
		gen := h.gen
		h.mu.Unlock()
		ctx, cancel := context.WithTimeout(h.ctx, h.timeout)
		n, err := h.counter.Count(ctx, r.name)
		cancel()
		h.mu.Lock()
		if err != nil {
			r.countDirty = true
			h.dirty[r] = struct{}{}
		} else {
			r.readN, r.readGen = n, gen
			h.sendCountLocked(r, n, gen)
		}
		h.mu.Unlock()
		if err != nil {
			h.log.Warn("node: count read failed; retried at the next tick", "room", r.name, "err", err)
		}
	}
	h.mu.Lock()
	h.counting = false
	h.mu.Unlock()
}

// sendCountLocked sends count n, read by read gen, to r's live count
// members whose count is older and different. A member whose queue is
// full is skipped and the room read again at the next tick: counts are
// whole, so only the latest matters.
func (h *hub) sendCountLocked(r *room, n int, gen uint64) {
	var f []byte
	for c, m := range r.members {
		if !m.in.count || !m.live || m.gen >= gen {
			continue
		}
		if m.sent != n {
			if c.queued() >= behindFrames {
				r.countDirty = true
				h.dirty[r] = struct{}{}
				continue
			}
			if f == nil {
				f = encodeCount("", "", r.name, n)
			}
			c.send(f)
			m.sent = n
		}
		m.gen = gen
	}
}

// countReply answers a join with view count: the room's count, read now.
// The member is live from then on.
func (h *hub) countReply(ctx context.Context, name string, c *conn, ref string) error {
	if h.counter == nil {
		return errNoCounts
	}
	h.mu.Lock()
	h.gen++
	gen := h.gen
	h.mu.Unlock()
	n, err := h.counter.Count(ctx, name)
	if err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.rooms[name]
	m := r.memberOf(c)
	if m == nil || !m.in.count {
		return nil // left, or joined again with another view, meanwhile
	}
	if r.readGen > gen {
		n, gen = r.readN, r.readGen // a tick's read, newer, skipped this member
	}
	c.send(encodeCount(ref, protocol.ReasonJoin, name, n))
	m.live, m.sent, m.gen = true, n, gen
	r.noteLocked(c, m)
	return nil
}

// mustPrepare makes a shared frame. Preparing writes to memory only, so
// it does not fail.
func mustPrepare(f []byte) *websocket.PreparedMessage {
	pm, err := websocket.NewPreparedMessage(websocket.TextMessage, f)
	if err != nil {
		panic("node: preparing a frame: " + err.Error())
	}
	return pm
}

package node

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

// The tick's work (docs/PROTOCOL.md, "Big rooms"): each room's batch of
// events goes out as one events frame per member, encoded once per detail;
// count members get the room's count when it changed (count.go); members
// whose queue has drained after falling behind get a resync snapshot.

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

// fanout is the tick's fan-out: which rooms have frames due, which have
// members waiting for their queue to drain, the busy rooms' turns, and
// the writers to wake.
//
// It has no lock of its own: dirty, behind and every room's fan-out
// fields (roomFan) are guarded by hub.mu. The tick, a joiner's replay
// (hub.readyLocked) and an event passed on at once (hub.deliverLocked)
// all move a member's high-water mark (member.after) and queue frames to
// the same connection; one lock over the three is what makes a member's
// frames its snapshot, then the events above it, once each and in order.
// The waker runs on the dispatcher only, the one goroutine that runs the
// tick; counting is atomic.
type fanout struct {
	// Batching: rooms with at least batchFrom local members send members
	// taking events frames one per tick; counts go out at most once per
	// tick.
	tick      time.Duration
	split     int              // grains per tick: busy rooms' turns go out every tick/split
	clock     func() time.Time // the fan-out's clock; nil: time.Now (tests script it)
	batchFrom int
	budget    int // Config.FanoutBudget
	metrics   *metrics

	dirty  map[*room]struct{} // a batch or a count to send at a tick
	behind map[*room]struct{} // rooms with members waiting for their queue to drain
	// Count reads (count.go): counting while one goroutine reads; gen
	// numbers the reads, so a member is never sent a count read before
	// the one it has.
	counting atomic.Bool
	gen      atomic.Uint64
	waker    waker // wave.go: the dispatcher's only
}

// roomFan is a room's part of the fan-out, under hub.mu.
type roomFan struct {
	next    time.Time // the tick's frames go out no sooner (FanoutBudget)
	pending []event   // events not yet sent to every live member taking events frames
	turn    int       // the next turn of a room whose members take turns,
	turns   int       // of the turns of its round
	turned  time.Time // its last turn
	slots   uint32    // numbers its members' turns
}

func newFanout(tick time.Duration, batchFrom, budget int, m *metrics, ctx context.Context, wg *sync.WaitGroup) *fanout {
	return &fanout{tick: tick, split: splitOf(tick), batchFrom: batchFrom, budget: budget, metrics: m,
		dirty: map[*room]struct{}{}, behind: map[*room]struct{}{}, waker: waker{ctx: ctx, wg: wg}}
}

// fanOut runs once per tick on the dispatcher: every room's due frames.
func (h *hub) fanOut() { h.fan(true) }

// fan runs once per grain (a tick / split) on the dispatcher: at a tick
// (full) every room whose frames are due, between ticks only the turns of
// rooms whose members take turns. A room that does not take turns keeps
// to the tick, so its events of one tick still go out as one frame.
func (h *hub) fan(full bool) {
	h.mu.Lock()
	reads := h.out.turnLocked(full)
	h.out.waker.wake()
	for _, r := range h.out.drainedLocked() {
		h.startResyncLocked(r)
	}
	if len(reads) > 0 {
		h.out.counting.Store(true)
		h.wg.Add(1)
		go h.readCounts(reads)
	}
	h.mu.Unlock()
	h.watches.release(time.Now())
}

// turnLocked queues the frames due now, and returns the rooms whose
// count is to be read.
func (f *fanout) turnLocked(full bool) []*room {
	now := f.now()
	every := f.intervalLocked()
	var reads []*room
	for r := range f.dirty {
		if r.gone {
			delete(f.dirty, r)
			continue
		}
		if now.Before(r.next) {
			continue // its share of the budget is spent: a later tick
		}
		if r.turn == 0 {
			// A round's turns are fixed when it begins, so that each
			// member gets exactly one turn a round however the room's
			// size moves meanwhile.
			r.turns = f.turnsLocked(every)
		}
		taking := r.turns > 1 && len(r.pending) > 0
		if !taking && (!full || now.Sub(r.turned) < f.tick-f.grain()/2) {
			// Not taking turns, it goes at a tick, and a tick after its
			// last turn: the members of that turn have had one frame of
			// this tick.
			continue
		}
		counts := true
		if taking {
			// A room whose members take turns gets a turn every grain;
			// its count members a count once a round.
			r.next, r.turned = now.Add(f.grain()/2), now
			turn := r.turn
			f.flushLocked(r, r.turns, turn, now)
			r.turn = (turn + 1) % r.turns
			counts = turn == 0
		} else {
			r.turn = 0
			// Half a tick early, so that ticks arriving a little late do
			// not skip one more.
			r.next = now.Add(every - f.tick/2)
			f.flushLocked(r, 1, 0, now)
		}
		if counts && r.countDirty && !f.counting.Load() {
			r.countDirty = false
			reads = append(reads, r)
		}
		if !r.countDirty && len(r.pending) == 0 {
			delete(f.dirty, r)
		}
	}
	return reads
}

// intervalLocked is how often a busy room's frames go out: every tick,
// unless the busy rooms' members at one frame per tick would take more
// than the budget.
func (f *fanout) intervalLocked() time.Duration {
	if f.budget <= 0 {
		return f.tick
	}
	n := 0
	for r := range f.dirty {
		switch {
		case len(r.pending) > 0:
			n += len(r.members)
		case r.countDirty:
			n += r.counters
		}
	}
	return max(f.tick, time.Duration(float64(n)/float64(f.budget)*float64(time.Second)))
}

// turnsLocked is how many turns a busy room's members take at the
// interval every, one turn a grain: a room of 15,000 at the budget's
// 50,000 frames/s is sent to every 300 ms, a twelfth of its members each
// 25 ms, rather than to all of them at once every third tick. The frames
// per second are the same; a turn's burst of writes, and so the wait of
// the members written last, is a twelfth. A room sent to every tick
// does not take turns.
func (f *fanout) turnsLocked(every time.Duration) int {
	if f.tick <= 0 || (every+f.tick/2)/f.tick <= 1 {
		return 1
	}
	g := f.grain()
	return max(1, int((every+g/2)/g))
}

// now is the fan-out's clock.
func (f *fanout) now() time.Time {
	if f.clock != nil {
		return f.clock()
	}
	return time.Now()
}

// grain is the dispatcher's fan-out period: a tick, or a share of it.
func (f *fanout) grain() time.Duration {
	return f.tick / time.Duration(max(1, f.split))
}

// turnFrames are the events frames of one turn of a room: one per after
// and detail, encoded once for all members at the same after and detail
// (all of a turn but those that joined in between), compressed once for
// those that negotiated deflate.
type turnFrames struct {
	r      *room
	queued time.Time
	frames map[turnKey]*turnFrame
}

type turnKey struct {
	after uint64
	d     detail
}

type turnFrame struct {
	b  []byte
	pm *websocket.PreparedMessage
}

// frame is the events frame of the room's pending events above m's after,
// at its detail, and the form to queue to c (nil b: none to send).
func (t *turnFrames) frame(c *conn, m *member) outFrame {
	k := turnKey{m.after, m.in.detail}
	f := t.frames[k]
	if f == nil {
		f = &turnFrame{b: encodeEvents(t.r.view, t.r.name, t.r.pending, m.after, m.in.detail)}
		t.frames[k] = f
	}
	var pm *websocket.PreparedMessage
	if f.b != nil && c.deflate {
		if f.pm == nil {
			f.pm = mustPrepare(f.b) // once, for every member taking it
		}
		pm = f.pm
	}
	return outFrame{b: f.b, pm: pm, at: t.queued}
}

// flushLocked sends r's pending events to the live members taking events
// frames whose turn it is (member.slot mod turns; every member when turns
// is 1): each gets those above its after (turnFrames). Pending keeps what
// members of other turns still need. A member with behindFrames frames
// queued gets nothing: it falls behind (drainedLocked). A member whose
// turn comes within a tick of its last one (the room's turns changed
// between rounds: slot 6 is the last of 7 turns and the first of 6)
// waits for its next turn, so that it never gets two frames within a
// tick.
func (f *fanout) flushLocked(r *room, turns, turn int, now time.Time) {
	if len(r.pending) == 0 {
		return
	}
	last := r.pending[len(r.pending)-1].seq
	t := turnFrames{r: r, queued: time.Now(), frames: map[turnKey]*turnFrame{}}
	keep, sentFrom := last, last // lowest after of the others; of this turn
	for c, m := range r.members {
		if !m.live || !m.in.batch || m.in.count || m.after >= last {
			continue
		}
		if turns > 1 && (int(m.slot%uint32(turns)) != turn || now.Sub(m.framed) < f.tick-f.grain()/2) {
			keep = min(keep, m.after)
			continue
		}
		if c.queued() >= behindFrames {
			m.live, m.behind = false, true
			r.noteLocked(c, m)
			f.behind[r] = struct{}{}
			f.metrics.behind.Inc()
			continue
		}
		if of := t.frame(c, m); of.b != nil {
			f.waker.hold(c, of)
			f.metrics.batches.Inc()
			m.framed = now
		}
		sentFrom = min(sentFrom, m.after)
		m.after = last
	}
	// The oldest event sent, and how long it waited for this turn.
	if i := firstAbove(r.pending, sentFrom); i < len(r.pending) && !r.pending[i].at.IsZero() {
		f.metrics.fanWait.Observe(time.Since(r.pending[i].at).Seconds())
	}
	r.dropPendingLocked(keep)
}

// dropPendingLocked drops the pending events at or below keep, which
// every member taking events frames has.
func (r *room) dropPendingLocked(keep uint64) {
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

// drainedLocked puts members that fell behind on a resync once their
// queue has drained, and returns the rooms to resync.
func (f *fanout) drainedLocked() []*room {
	var resync []*room
	for r := range f.behind {
		waiting, ready := false, false
		if !r.gone {
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
			resync = append(resync, r)
		}
		if !waiting {
			delete(f.behind, r)
		}
	}
	return resync
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

package node

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
)

// Hub buffers. maxHeld bounds the events held back while an earlier one is
// missing; maxBuffered bounds the events a room keeps for its members
// waiting for their snapshots (or before its first). Past either, the
// node starts over from a new snapshot.
const (
	maxHeld     = 4096
	maxBuffered = 4096
	msgQueue    = 16384 // NATS messages waiting for the dispatcher
	// gapTimeout: a busy room's transitions reach NATS out of seq order by
	// up to a second under load, and a resync of a room of thousands costs
	// a snapshot per member: wait longer than that before deciding one
	// is lost.
	gapTimeout   = 3 * time.Second
	resyncPause  = time.Second // between failed resync snapshots
	maxSnapTries = 4
	// behindFrames is the most frames a member taking events frames may
	// have queued: past it the member gets nothing more of the room until
	// its queue has drained, then a resync snapshot.
	behindFrames = 8
)

// errNATSDown refuses a join while NATS is away.
var errNATSDown = errors.New("node: NATS is not connected")

// hub keeps one NATS subscription per room with local members and fans
// each transition out to them, in Seq order and once each.
//
// Transitions are ordered by (Epoch, Seq). Per room the hub tracks the
// epoch and base, the highest Seq up to which every transition has been
// passed on (or is reflected in a snapshot). A transition at or below
// base, or of an earlier epoch, is a redelivery and is dropped; one above
// base+1 is held until the missing ones arrive. A gap that stays open for
// gapTimeout (a transition lost on the way: NATS slow consumer, a failed
// publish), a NATS reconnect, or a later epoch (the store restarted the
// room's numbering) makes the hub resync the room: it takes a new
// snapshot and sends it to every member with reason "resync", and the
// live stream continues from it.
type hub struct {
	nc       *nats.Conn
	region   string      // region token of the watched subjects: the node's, or bus.GlobalRegion
	store    Snapshotter // where room snapshots come from
	views    *views      // with Config.Global: which view rooms follow (view.go)
	limit    int         // snapshot members
	log      *slog.Logger
	metrics  *metrics
	ctx      context.Context
	timeout  time.Duration
	msgs     chan *nats.Msg
	wg       *sync.WaitGroup
	gapAfter time.Duration

	// Batching (docs/PROTOCOL.md, "Big rooms"): rooms with at least
	// batchFrom local members send members taking events frames one per
	// tick; counts go out at most once per tick.
	tick      time.Duration
	split     int              // grains per tick: busy rooms' turns go out every tick/split (fanout.go)
	clock     func() time.Time // the fan-out's clock; nil: time.Now (tests script it)
	batchFrom int
	budget    int     // Config.FanoutBudget
	counter   Counter // where count frames come from; nil: view count refused

	mu     sync.Mutex
	rooms  map[string]*room
	gappy  map[*room]struct{}
	dirty  map[*room]struct{} // a batch or a count to send at the next tick
	behind map[*room]struct{} // rooms with members waiting for their queue to drain
	// Count reads: one goroutine at a time; gen numbers the reads, so a
	// member is never sent a count read before the one it has.
	counting bool
	gen      uint64
	// The tick's writers to start, in waves (wave.go): waking[i] is in
	// waves[i/wakeChunk].
	waking []*conn
	waves  []*wave

	watched map[string]*wroom // watch.go
	// reorder holds the watched users with events waiting for their
	// reorder window (watch.go).
	reorder map[*wuser]*wroom
}

type room struct {
	name    string
	view    string // region token of sub's subjects
	sub     *nats.Subscription
	ready   chan struct{} // closed once subscribed, or failed (err set)
	err     error
	members map[*conn]*member
	// special holds the members an event must visit one by one while the
	// room batches: the live ones that take no events frames. In a room of
	// 15,000 nearly all are batched: an event then costs the node one
	// append, not a pass over every member (noteLocked keeps it).
	special map[*conn]*member
	// waiting holds the members waiting for a snapshot (a join, a resync);
	// buffered the events passed on since the first of them began to wait,
	// once for all of them (not per member: a resync of 15,000 would hold
	// every event 15,000 times). A member's snapshot at S takes the
	// buffered events above S. dropped is the highest seq dropped from
	// buffered: a snapshot below it cannot serve.
	waiting  map[*conn]*member
	buffered []event
	dropped  uint64
	// counters is how many members have view count; countDirty that the
	// room's membership changed since its count was last read.
	counters   int
	countDirty bool
	next       time.Time // the tick's frames go out no sooner (FanoutBudget)
	readN      int       // the latest count read, and its read
	readGen    uint64
	pending    []event   // events not yet sent to every live member taking events frames
	turn       int       // the next turn of a room whose members take turns (fanout.go),
	turns      int       // of the turns of its round
	turned     time.Time // its last turn
	slots      uint32    // numbers its members' turns
	bodies     snapBodies
	joinFrames joinFrames

	seq       *bus.Sequencer[event] // (epoch, base): every Seq <= base is passed on or in a snapshot
	start     uint64                // the RoomSeq the room's position started from (the last Reset)
	early     []event               // received before the first snapshot
	lost      bool                  // early overflowed
	resyncing bool

	// Joiners' snapshot reads (see freshSnapshot).
	reading *flight // under way
	queued  *flight // the next one, for joiners who asked after it began
}

// flight is one snapshot read shared by the joiners waiting for it.
type flight struct {
	done    chan struct{}
	snap    presence.Snapshot
	err     error
	waiters int // joiners waiting for it, under hub.mu
}

// member is one connection in a room. Until its snapshot is sent it is
// not live and its transitions are buffered; after, it gets those with a
// Seq above its snapshot's.
//
// after is a high-water mark: every event at or below it was sent to the
// member or is in its snapshot, so nothing is ever sent twice, whether
// alone, batched or buffered.
type member struct {
	in     interest // what the member is kept up to date with
	after  uint64
	live   bool
	resync bool // waiting for the room's resync snapshot
	behind bool // its queue was full: nothing until it drains, then a resync
	// floor: the room's position when it began to wait. Its snapshot is
	// read later, so at or above it: buffered events at or below every
	// waiting member's floor serve no one.
	floor uint64
	slot  uint32 // its turn is slot mod the room's turns (turnsLocked)
	// framed: when its last turn's events frame was queued (the hub's
	// clock): no turn sends it a second frame within a tick.
	framed time.Time
	// View count: the count last sent and the read it came from.
	sent int
	gen  uint64
}

type event struct {
	epoch int64 // 0: not known
	seq   uint64
	frame []byte // the event frame
	entry []byte // the entry of an events frame
	delta int8   // +1 online, -1 offline
	user  string
	// sessionsOnly: a new session of a member (update, joined), sent only
	// to members kept at detailSessions.
	sessionsOnly bool
	at           time.Time // off NATS
}

// newHub makes the hub of a node configured by cfg. ctx bounds its store
// reads (the node's Close cancels it) and wg counts its goroutines; views,
// with Config.Global, is where snapshots come from.
func newHub(ctx context.Context, cfg Config, views *views, log *slog.Logger, m *metrics, wg *sync.WaitGroup) *hub {
	h := &hub{
		nc: cfg.NATS, region: cfg.viewRegion(), store: cfg.snapshots(), limit: cfg.Limits.SnapshotMembers,
		log: log, metrics: m, ctx: ctx, timeout: cfg.StoreTimeout, wg: wg,
		msgs:     make(chan *nats.Msg, msgQueue),
		gapAfter: cmp.Or(cfg.gapTimeout, gapTimeout),
		tick:     cfg.FanoutTick, split: splitOf(cfg.FanoutTick), batchFrom: cfg.BatchFrom, budget: cfg.FanoutBudget,
		rooms: map[string]*room{}, gappy: map[*room]struct{}{},
		dirty: map[*room]struct{}{}, behind: map[*room]struct{}{}, watched: map[string]*wroom{}, reorder: map[*wuser]*wroom{},
	}
	if views != nil {
		h.views = views
		h.store = views
	}
	h.counter, _ = h.store.(Counter)
	return h
}

// viewNow is the region token a new room's subscription follows.
func (h *hub) viewNow() string {
	if h.views != nil {
		return h.views.view()
	}
	return h.region
}

// count returns the number of rooms with local members.
func (h *hub) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.rooms)
}

// add makes c a (not yet live) member of the room. The first member
// subscribes and flushes, so that the server has the interest before any
// snapshot is taken; later members wait for that.
func (h *hub) add(ctx context.Context, name string, c *conn, in interest) error {
	// Without NATS no event of the room can reach the member: refuse the
	// join at once rather than after the store timeout.
	if !h.nc.IsConnected() {
		return errNATSDown
	}
	h.mu.Lock()
	r := h.rooms[name]
	create := r == nil
	view := h.viewNow()
	if create {
		r = &room{name: name, view: view, ready: make(chan struct{}), members: map[*conn]*member{},
			seq: bus.NewSequencer[event](bus.SeqLimits{GapTimeout: h.gapAfter, MaxAhead: maxHeld})}
		h.rooms[name] = r
	}
	r.members[c] = &member{in: in, slot: r.slots}
	r.slots++
	r.noteLocked(c, r.members[c])
	if in.count {
		r.counters++
	}
	h.mu.Unlock()

	if create {
		sub, err := h.nc.ChanSubscribe(bus.RoomFilter(view, name), h.msgs)
		if err == nil {
			err = h.nc.FlushWithContext(ctx)
		}
		h.mu.Lock()
		r.sub, r.err = sub, err
		if err != nil && h.rooms[name] == r {
			delete(h.rooms, name)
		}
		close(r.ready)
		h.mu.Unlock()
		if err != nil && sub != nil {
			_ = sub.Unsubscribe()
		}
		return err
	}
	select {
	case <-r.ready:
		return r.err
	case <-ctx.Done():
		h.removeFrom(r, c)
		return ctx.Err()
	}
}

// remove takes c out of the room; the last member out unsubscribes.
func (h *hub) remove(name string, c *conn) {
	h.mu.Lock()
	var sub *nats.Subscription
	if r := h.rooms[name]; r != nil {
		sub = h.removeLocked(r, c)
	}
	h.mu.Unlock()
	unsubscribe(sub)
}

func (h *hub) removeFrom(r *room, c *conn) {
	h.mu.Lock()
	sub := h.removeLocked(r, c)
	h.mu.Unlock()
	unsubscribe(sub)
}

// removeLocked returns the subscription to drop when c was the last
// member.
func (h *hub) removeLocked(r *room, c *conn) *nats.Subscription {
	if m := r.members[c]; m != nil && m.in.count {
		r.counters--
	}
	delete(r.members, c)
	delete(r.special, c)
	r.unwaitLocked(c)
	if len(r.members) > 0 || h.rooms[r.name] != r {
		return nil
	}
	select {
	case <-r.ready:
		delete(h.rooms, r.name)
		delete(h.gappy, r)
		return r.sub
	default: // the creator is still subscribing, and is a member
		return nil
	}
}

// unsubscribe drops a room subscription. Messages already queued for it
// find no room, or a new one of the same name, whose dedup drops them.
func unsubscribe(sub *nats.Subscription) {
	if sub != nil {
		_ = sub.Unsubscribe()
	}
}

// page reads one page of the room's members from where its snapshots
// come, without making anyone live.
func (h *hub) page(ctx context.Context, name string, c *conn, offset, limit int) (presence.Snapshot, error) {
	snap, err := h.store.Snapshot(ctx, name, offset, limit)
	if err != nil {
		return snap, err
	}
	h.mu.Lock()
	d := detailStates
	if m := h.rooms[name].memberOf(c); m != nil {
		d = m.in.detail
	}
	h.mu.Unlock()
	return forDetail(snap, d), nil
}

// snapshot takes the room's snapshot for member c and makes it live:
// the snapshot frame is queued first, then the buffered transitions above
// it, then live ones.
func (h *hub) snapshot(ctx context.Context, name string, c *conn, ref string, in interest) error {
	h.mu.Lock()
	if r := h.rooms[name]; r != nil && r.members[c] != nil {
		m := r.members[c]
		if m.in.count != in.count {
			r.counters += map[bool]int{true: 1, false: -1}[in.count]
		}
		m.live, m.behind, m.resync, m.in = false, false, false, in
		r.noteLocked(c, m)
	}
	h.mu.Unlock()
	if in.count {
		return h.countReply(ctx, name, c, ref)
	}
	for try := 1; ; try++ {
		snap, err := h.freshSnapshot(ctx, name)
		if err != nil {
			// A member that was live (a repeated join) must not stay
			// muted: the room's resync serves it once the store is back.
			h.mu.Lock()
			if r := h.rooms[name]; r.memberOf(c) != nil && !r.members[c].in.count {
				r.members[c].resync = true
				h.startResyncLocked(r)
			}
			h.mu.Unlock()
			return err
		}
		if moved, err := h.moveRoom(name, snap.Region); err != nil {
			return err
		} else if moved {
			if try == maxSnapTries {
				return errors.New("node: the room's view kept changing")
			}
			continue // read it again, on the view's subscription
		}
		h.mu.Lock()
		r := h.rooms[name]
		m := r.memberOf(c)
		if m == nil {
			h.mu.Unlock()
			return nil // left meanwhile
		}
		if h.readyLocked(r, snap, ref, protocol.ReasonJoin, map[*conn]*member{c: m}) {
			h.mu.Unlock()
			return nil
		}
		h.mu.Unlock()
		if try == maxSnapTries {
			return errors.New("node: the room's events kept outrunning its snapshot")
		}
	}
}

// freshSnapshot returns a snapshot of the room read after the call began,
// so it includes the caller's own join. Joiners who ask while a read is
// under way share the next one: a join storm costs the store one read at a
// time per room, not one per joiner.
func (h *hub) freshSnapshot(ctx context.Context, name string) (presence.Snapshot, error) {
	h.mu.Lock()
	r := h.rooms[name]
	if r == nil {
		h.mu.Unlock()
		return presence.Snapshot{}, errors.New("node: room left during its join")
	}
	f := r.queued
	if f == nil {
		f = &flight{done: make(chan struct{})}
		if r.reading == nil {
			r.reading = f
			h.wg.Add(1)
			go h.fly(r, f)
		} else {
			r.queued = f
		}
	}
	f.waiters++
	h.mu.Unlock()
	select {
	case <-f.done:
		return f.snap, f.err
	case <-ctx.Done():
		return presence.Snapshot{}, ctx.Err()
	}
}

// fly reads f's snapshot, then each queued one, until none is queued. A
// read is bounded by the store timeout, never by a joiner's context, so
// one joiner giving up fails no other.
func (h *hub) fly(r *room, f *flight) {
	defer h.wg.Done()
	for f != nil {
		ctx, cancel := context.WithTimeout(h.ctx, h.timeout)
		f.snap, f.err = h.store.Snapshot(ctx, r.name, 0, h.limit)
		cancel()
		h.metrics.snapshotReads.Inc()
		close(f.done)
		h.mu.Lock()
		f, r.queued = r.queued, nil
		r.reading = f
		h.mu.Unlock()
	}
}

// noteLocked files m in r.special and r.waiting, or out of them, after a
// change of its interest, liveness or lag.
func (r *room) noteLocked(c *conn, m *member) {
	if m.live && !m.in.batch && !m.in.count && !m.behind {
		if r.special == nil {
			r.special = map[*conn]*member{}
		}
		r.special[c] = m
	} else {
		delete(r.special, c)
	}
	if m.live || m.in.count || m.behind {
		r.unwaitLocked(c)
		return
	}
	if _, ok := r.waiting[c]; !ok {
		if r.waiting == nil {
			r.waiting = map[*conn]*member{}
		}
		_, base, synced := r.seq.Position()
		m.floor = 0
		if synced {
			m.floor = base
		}
		r.waiting[c] = m
	}
}

// unwaitLocked takes c off the members waiting for a snapshot; the last
// one off drops the buffer.
func (r *room) unwaitLocked(c *conn) {
	delete(r.waiting, c)
	if len(r.waiting) == 0 {
		r.buffered = nil
	}
}

func (r *room) memberOf(c *conn) *member {
	if r == nil {
		return nil
	}
	return r.members[c]
}

// readyLocked makes the given members live from snap, or reports false
// when snap cannot serve (of an earlier numbering than the room's, or
// buffers overflowed) and a newer one is needed.
//
// A snapshot of the room's numbering serves however far the room's events
// have run past it, as long as it is not older than the one the room's
// position started from: it was read after the members were added, so
// every event above its RoomSeq that the room passed on reached their
// buffers, and the room passes over only what its starting snapshot
// covers. (Asking for one newer than the room's position instead, under a
// steady stream of joins, can chase the stream forever; one at least as
// new as its start is a single read away, as the store is ahead of it.)
// A snapshot of a later numbering means the store restarted the room, and
// one with no numbering while the room has one means the store lost it:
// either way the room starts over from it.
func (h *hub) readyLocked(r *room, snap presence.Snapshot, ref, reason string, ms map[*conn]*member) bool {
	switch r.seq.CheckSnapshot(snap.Epoch) {
	case bus.Stale:
		return false // read before the numbering restarted
	case bus.NewEpoch:
		if snap.Epoch == 0 {
			epoch, base, _ := r.seq.Position()
			h.log.Warn("node: the store lost the room's numbering; starting the room over", "room", r.name,
				"epoch", epoch, "base", base)
		}
		h.resetLocked(r)
	}
	epoch, _, synced := r.seq.Position()
	if synced && snap.Epoch == epoch && snap.RoomSeq < r.start {
		// The room started from a later snapshot: events between this one
		// and that one were passed over, not buffered. A new read is at
		// least that far.
		return false
	}
	if !synced && r.lost {
		r.lost, r.early = false, nil
		return false
	}
	if synced && snap.Epoch == epoch && snap.RoomSeq < r.dropped {
		// Events above it were dropped from the buffer: a newer read has
		// them.
		return false
	}
	for c, m := range ms {
		d := m.in.detail
		c.send(r.joinFrames.snapshot(ref, reason, snap, d, r.bodies.get(snap, d)))
		m.after, m.live, m.resync = snap.RoomSeq, true, false
		if m.in.batch {
			// What arrived during the read, as one frame: a storm's
			// joiner would otherwise get an event frame per joiner.
			if f := r.joinFrames.events(r, m.after, d); f != nil {
				c.send(f)
				h.metrics.batches.Inc()
			}
			if n := len(r.buffered); n > 0 {
				m.after = max(m.after, r.buffered[n-1].seq)
			}
			continue
		}
		for _, e := range r.buffered {
			if e.seq > m.after && (!e.sessionsOnly || d == detailSessions) {
				c.send(e.frame)
				m.after = e.seq
			}
		}
	}
	for c, m := range ms { // after every replay: the last one out drops the buffer
		r.noteLocked(c, m)
	}
	if !synced {
		r.seq.Reset(snap.Epoch, snap.RoomSeq)
		r.start = snap.RoomSeq
		early := r.early
		r.early = nil
		for _, e := range early {
			h.eventLocked(r, e)
		}
	}
	return true
}

// joinFrames keeps the last snapshot frame and the last frame of events
// after a snapshot that joiners were sent: the joiners served by one read
// (a fill, a storm) mostly get the same bytes, a snapshot frame of up to
// SnapshotMembers members differing only by its ref, which clients
// mostly number alike. Frames are never changed once sent, so they are
// shared.
type joinFrames struct {
	snapKey  joinSnapKey
	snap     []byte
	evKey    joinEventsKey
	evFrame  []byte
	evEncode bool
}

type joinSnapKey struct {
	ref, reason, room string
	truncated         bool
	body              *byte // the body's array: one per read and detail
	n                 int
}

type joinEventsKey struct {
	view               string
	after, first, last uint64
	n                  int
	d                  detail
}

func (j *joinFrames) snapshot(ref, reason string, snap presence.Snapshot, d detail, body []byte) []byte {
	k := joinSnapKey{ref, reason, snap.Room, snap.Total > len(snap.Members), nil, len(body)}
	if len(body) > 0 {
		k.body = &body[0]
	}
	if j.snap == nil || k != j.snapKey {
		j.snapKey, j.snap = k, encodeSnapshotBody(ref, reason, snap.Room, k.truncated, body)
	}
	return j.snap
}

// events is the events frame of r.buffered above after (nil: none).
func (j *joinFrames) events(r *room, after uint64, d detail) []byte {
	n := len(r.buffered)
	if n == 0 {
		return nil
	}
	k := joinEventsKey{r.view, after, r.buffered[0].seq, r.buffered[n-1].seq, n, d}
	if !j.evEncode || k != j.evKey {
		j.evKey, j.evFrame, j.evEncode = k, encodeEvents(r.view, r.name, r.buffered, after, d), true
	}
	return j.evFrame
}

// snapBodies keeps the encoded body of a room's latest snapshot per
// detail: the joiners of a storm share a few reads, and each read's body
// (up to SnapshotMembers members) is encoded once, not once per joiner.
type snapBodies struct {
	key  snapKey
	body [detailSessions + 1][]byte
}

// snapKey tells snapshots apart: one read of the room at a room_seq and a
// millisecond has one content.
type snapKey struct {
	region        string
	epoch         int64
	seq           uint64
	at            time.Time
	offset, total int
	members       int
}

func (b *snapBodies) get(s presence.Snapshot, d detail) []byte {
	k := snapKey{s.Region, s.Epoch, s.RoomSeq, s.At, s.Offset, s.Total, len(s.Members)}
	if k != b.key {
		*b = snapBodies{key: k}
	}
	if b.body[d] == nil {
		fs := forDetail(s, d)
		b.body[d] = appendSnapshotBody(make([]byte, 0, 256+len(fs.Members)*160), fs)
	}
	return b.body[d]
}

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
		h.dirty[r] = struct{}{}
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
	if h.rooms[r.name] == r {
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
	h.mu.Lock()
	defer h.mu.Unlock()
	h.resyncWatchesLocked()
	for _, r := range h.rooms {
		select {
		case <-r.ready:
			h.resetLocked(r)
		default:
		}
	}
}

// eventLocked passes one transition on in Seq order, exactly once.
func (h *hub) eventLocked(r *room, e event) {
	switch r.seq.Offer(e.epoch, e.seq, e, time.Now()) {
	case bus.NoBaseline:
		if r.counters == len(r.members) {
			// No member needs events before a snapshot (count members
			// only): a later joiner's snapshot, read after it joined,
			// has them.
			return
		}
		if len(r.early) >= maxBuffered {
			r.lost = true
			return
		}
		r.early = append(r.early, e)
		return
	case bus.NewEpoch:
		h.log.Info("node: room numbering restarted; starting the room over", "room", r.name, "epoch", e.epoch)
		h.resetLocked(r)
		return
	case bus.TooFar:
		_, base, _ := r.seq.Position()
		h.log.Info("node: transitions missing for too long a run; resyncing the room", "room", r.name, "base", base, "seq", e.seq)
		h.resetLocked(r)
		return
	case bus.Deliver:
		h.deliverLocked(r, e)
		for e, ok := r.seq.Next(); ok; e, ok = r.seq.Next() {
			h.deliverLocked(r, e)
		}
	case bus.Held:
	default: // Stale, Duplicate: a redelivery, or in a snapshot
		return
	}
	if r.seq.Deadline().IsZero() {
		delete(h.gappy, r)
	} else {
		h.gappy[r] = struct{}{}
	}
}

// In a room with at least batchFrom members, or while the tick's batch
// has begun, live members taking events frames get the event at the next
// tick (flushLocked) instead, with the rest of the tick's events.
func (h *hub) deliverLocked(r *room, e event) {
	if !e.at.IsZero() {
		now := time.Now()
		h.metrics.reorder.Observe(now.Sub(e.at).Seconds())
		e.at = now // in order: from now on its wait is the tick's
	}
	r.bufferLocked(e)
	batching := len(r.pending) > 0 || h.batchFrom > 0 && len(r.members) >= h.batchFrom
	visit := r.members
	if batching {
		// The live members taking events frames, all of them in a big
		// room, get it from pending at the tick.
		visit = r.special
		r.pending = append(r.pending, e)
		h.dirty[r] = struct{}{}
	}
	for c, m := range visit {
		switch {
		case !m.live || m.in.count || m.behind || e.seq <= m.after || e.sessionsOnly && m.in.detail != detailSessions:
		case m.in.batch && batching:
		default:
			c.send(e.frame)
			m.after = e.seq
			h.metrics.forwarded.Inc()
		}
	}
}

// bufferLocked keeps e for the members waiting for a snapshot. Full, the
// buffer first drops what no waiting member can need (at or below every
// floor), then, if that is not enough, everything: their snapshots are
// then read again (readyLocked refuses one below dropped).
func (r *room) bufferLocked(e event) {
	if len(r.waiting) == 0 {
		return
	}
	if len(r.buffered) >= maxBuffered {
		floor := e.seq
		for _, m := range r.waiting {
			floor = min(floor, m.floor)
		}
		n := 0
		for n < len(r.buffered) && r.buffered[n].seq <= floor {
			n++
		}
		if n == 0 {
			n = len(r.buffered)
		}
		r.dropped = max(r.dropped, r.buffered[n-1].seq)
		r.buffered = slices.Delete(r.buffered, 0, n)
	}
	r.buffered = append(r.buffered, e)
}

// onMsg handles one message from a room subscription.
func (h *hub) onMsg(msg *nats.Msg) {
	t, err := bus.DecodeEvent(msg.Data)
	if err == nil && t.Region != h.region && (h.views == nil || !h.views.known(t.Region)) {
		err = errors.New("event of another region")
	}
	var frame []byte
	if err == nil {
		frame, err = encodeEvent(t)
	}
	var delta int8
	switch t.Kind {
	case presence.Online:
		delta = 1
	case presence.Offline:
		delta = -1
	}
	if err != nil {
		h.metrics.badEvents.Inc()
		h.log.Debug("node: ignoring a malformed event", "subject", msg.Subject, "err", err)
		return
	}
	e := event{epoch: t.Epoch, seq: t.Seq, frame: frame, entry: encodeEntry(t), delta: delta, user: t.User, sessionsOnly: sessionsOnly(t), at: time.Now()}
	h.mu.Lock()
	defer h.mu.Unlock()
	if w := h.watched[t.Room]; w != nil && w.subs[msg.Sub] {
		e.frame = watchFrame(e.frame)
		h.holdWatchEventLocked(w, e, time.Now())
		return
	}
	// A room takes the events of the view it follows; the other view's,
	// queued before it moved, are dropped.
	if r := h.rooms[t.Room]; r != nil && t.Region == r.view && (msg.Sub == nil || msg.Sub == r.sub) {
		if delta != 0 && r.counters > 0 {
			// Counts are read at the tick, whatever the room's position:
			// a room of count members only never takes a snapshot.
			r.countDirty = true
			h.dirty[r] = struct{}{}
		}
		h.eventLocked(r, e)
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

// dispatch runs the hub until ctx is done.
func (h *hub) dispatch(ctx context.Context) {
	t := time.NewTicker(h.gapAfter / 4)
	defer t.Stop()
	fan := time.NewTicker(h.grain())
	defer fan.Stop()
	for n := 0; ; {
		select {
		case <-ctx.Done():
			return
		case m := <-h.msgs:
			h.onMsg(m)
		case now := <-t.C:
			h.checkGaps(now)
		case <-fan.C:
			h.fan(n == 0)
			n = (n + 1) % max(1, h.split)
		}
	}
}

// watch resyncs every room after NATS reconnects.
func (h *hub) watch(ctx context.Context) {
	ch := h.nc.StatusChanged(nats.CONNECTED)
	defer h.nc.RemoveStatusListener(ch)
	var viewChanged chan struct{}
	if h.views != nil {
		viewChanged = h.views.changed
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			h.views.run(ctx)
		}()
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-viewChanged:
			h.followView()
		case _, ok := <-ch:
			if !ok {
				return
			}
			// Subscriptions were sent again on reconnect; make sure the
			// server has them before the snapshots are taken.
			fctx, cancel := context.WithTimeout(ctx, h.timeout)
			err := h.nc.FlushWithContext(fctx)
			cancel()
			if err != nil {
				h.log.Warn("node: flush after NATS reconnect failed", "err", err)
			}
			h.log.Info("node: NATS reconnected; resyncing every room")
			h.resyncAll()
		}
	}
}

// close unsubscribes every room and watched user.
func (h *hub) close() {
	h.mu.Lock()
	var subs []*nats.Subscription
	for name, r := range h.rooms {
		select {
		case <-r.ready:
			if r.sub != nil {
				subs = append(subs, r.sub)
			}
		default:
		}
		delete(h.rooms, name)
	}
	for name, w := range h.watched {
		for sub := range w.subs {
			subs = append(subs, sub)
		}
		delete(h.watched, name)
	}
	h.mu.Unlock()
	for _, s := range subs {
		_ = s.Unsubscribe()
	}
}

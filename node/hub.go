package node

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
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
	storedQueue = 1024  // store calls' transitions waiting for it (stored)
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
// live stream continues from it (resync.go).
//
// Its parts keep their own state: the joiners' snapshot reads (flights,
// its own lock), the watch lists (watches, its own lock) and the tick's
// fan-out (out, under hub.mu with the rooms: fanout.go says why). The
// dispatcher, the one goroutine that runs the tick, hands each NATS
// message to the watch lists or to the rooms, one lock at a time.
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
	stores   chan []presence.Transition // stored's, for the dispatcher
	wg       *sync.WaitGroup
	gapAfter time.Duration
	counter  Counter // where count frames come from; nil: view count refused

	flights *flights // joiners' shared snapshot reads (flight.go)
	watches *watches // watch lists (watch.go)
	out     *fanout  // the tick's fan-out (fanout.go), under mu

	// mu guards rooms, gappy, every room and member, and out's state
	// (fanout.go says why the tick shares it).
	mu    sync.Mutex
	rooms map[string]*room
	gappy map[*room]struct{}
}

// newHub makes the hub of a node configured by cfg. ctx bounds its store
// reads (the node's Close cancels it) and wg counts its goroutines; views,
// with Config.Global, is where snapshots come from.
func newHub(ctx context.Context, cfg Config, views *views, log *slog.Logger, m *metrics, wg *sync.WaitGroup) *hub {
	h := &hub{
		nc: cfg.NATS, region: cfg.viewRegion(), store: cfg.snapshots(), limit: cfg.Limits.SnapshotMembers,
		log: log, metrics: m, ctx: ctx, timeout: cfg.StoreTimeout, wg: wg,
		msgs:     make(chan *nats.Msg, msgQueue),
		stores:   make(chan []presence.Transition, storedQueue),
		gapAfter: cmp.Or(cfg.gapTimeout, gapTimeout),
		rooms:    map[string]*room{}, gappy: map[*room]struct{}{},
	}
	if views != nil {
		h.views = views
		h.store = views
	}
	h.counter, _ = h.store.(Counter)
	reader, _ := h.store.(UsersReader)
	if views != nil {
		reader = nil // watch lists follow the region's subjects only
	}
	h.flights = newFlights(h.store, h.limit, ctx, h.timeout, wg, m.snapshotReads)
	h.watches = newWatches(h, reader)
	h.out = newFanout(cfg.FanoutTick, cfg.BatchFrom, cfg.FanoutBudget, m, ctx, wg)
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
			r.gone = true
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
		r.gone = true
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
// so it includes the caller's own join; joiners share reads (flight.go).
func (h *hub) freshSnapshot(ctx context.Context, name string) (presence.Snapshot, error) {
	h.mu.Lock()
	r := h.rooms[name]
	h.mu.Unlock()
	if r == nil {
		return presence.Snapshot{}, errors.New("node: room left during its join")
	}
	return h.flights.read(ctx, name)
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
		h.replayLocked(r, snap, ref, reason, c, m)
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

// replayLocked queues c its snapshot, then the buffered events above it:
// m is live from then on.
func (h *hub) replayLocked(r *room, snap presence.Snapshot, ref, reason string, c *conn, m *member) {
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
		return
	}
	for _, e := range r.buffered {
		if e.seq > m.after && (!e.sessionsOnly || d == detailSessions) {
			c.send(e.frame)
			m.after = e.seq
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
	batching := len(r.pending) > 0 || h.out.batchFrom > 0 && len(r.members) >= h.out.batchFrom
	visit := r.members
	if batching {
		// The live members taking events frames, all of them in a big
		// room, get it from pending at the tick.
		visit = r.special
		r.pending = append(r.pending, e)
		h.out.dirty[r] = struct{}{}
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

// onMsg handles one message from a room subscription.
func (h *hub) onMsg(msg *nats.Msg) {
	t, err := bus.DecodeEvent(msg.Data)
	if err == nil && t.Region != h.region && (h.views == nil || !h.views.known(t.Region)) {
		err = errors.New("event of another region")
	}
	if err != nil {
		h.metrics.badEvents.Inc()
		h.log.Debug("node: ignoring a malformed event", "subject", msg.Subject, "err", err)
		return
	}
	if !t.At.IsZero() {
		h.metrics.eventAge.Observe(max(time.Since(t.At), 0).Seconds())
	}
	h.onEvent(t, msg.Sub)
}

// stored passes on the transitions that this node's own store calls
// caused, once the region has stored them (they are in its outbox), so
// the room's local members see them without waiting for the bus's round
// trip. Each goes through the room's sequencer as the bus's copy does:
// that copy, arriving later with the same epoch and seq, is dropped as a
// redelivery, and a later seq of this node still waits for an earlier
// one of another node. Both copies make the same frame: it is the bus's
// JSON of the transition (encodeEvent), whose at has milliseconds, as
// the store's. Watch lists take theirs from the bus only. A transition
// the publisher renumbers later (its stream was made again) reaches the
// room under its new epoch, which starts the room over.
//
// The dispatcher passes them on, as it does the bus's messages: a store
// call never waits for the hub's lock (a big room's tick holds it for
// milliseconds), and when the dispatcher is that far behind they are
// left to the bus.
func (h *hub) stored(ts []presence.Transition) {
	select {
	case h.stores <- ts:
	default:
	}
}

// passStored is the dispatcher's half of stored. A room takes them only
// while it follows the region's view (onEvent): on a node of the global
// view, while it is degraded to the regional one.
func (h *hub) passStored(ts []presence.Transition) {
	for _, t := range ts {
		h.onEvent(t, nil)
	}
}

// onEvent passes one transition on to its room's members (and, from the
// bus, to the watch lists): sub is the subscription it came on, nil for
// one of this node's own (stored).
func (h *hub) onEvent(t presence.Transition, sub *nats.Subscription) {
	if sub != nil && h.passedOn(t, sub) {
		h.metrics.busCopies.Inc() // nothing to encode
		return
	}
	frame, err := encodeEvent(t)
	if err != nil {
		h.metrics.badEvents.Inc()
		h.log.Debug("node: ignoring an event it cannot encode", "id", t.ID, "err", err)
		return
	}
	var delta int8
	switch t.Kind {
	case presence.Online:
		delta = 1
	case presence.Offline:
		delta = -1
	}
	now := time.Now()
	e := event{epoch: t.Epoch, seq: t.Seq, frame: frame, entry: encodeEntry(t), delta: delta, user: t.User, sessionsOnly: sessionsOnly(t), at: now}
	if sub != nil && h.watches.offer(t.Room, sub, e, now) {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	// A room takes the events of the view it follows; the other view's,
	// queued before it moved, are dropped.
	if r := h.rooms[t.Room]; r != nil && t.Region == r.view && (sub == nil || sub == r.sub) {
		if delta != 0 && r.counters > 0 {
			// Counts are read at the tick, whatever the room's position:
			// a room of count members only never takes a snapshot.
			r.countDirty = true
			h.out.dirty[r] = struct{}{}
		}
		h.eventLocked(r, e)
	}
}

// passedOn reports whether the room that sub is the subscription of has
// passed t on already (every seq up to its base is passed on or in a
// snapshot). sub is then no watch list's, and t changes nothing.
func (h *hub) passedOn(t presence.Transition, sub *nats.Subscription) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.rooms[t.Room]
	if r == nil || r.sub != sub || r.view != t.Region {
		return false
	}
	epoch, base, synced := r.seq.Position()
	return synced && epoch == t.Epoch && t.Seq <= base
}

// dispatch runs the hub until ctx is done.
func (h *hub) dispatch(ctx context.Context) {
	t := time.NewTicker(h.gapAfter / 4)
	defer t.Stop()
	fan := time.NewTicker(h.out.grain())
	defer fan.Stop()
	for n := 0; ; {
		select {
		case <-ctx.Done():
			return
		case m := <-h.msgs:
			h.onMsg(m)
		case ts := <-h.stores:
			h.passStored(ts)
		case now := <-t.C:
			h.checkGaps(now)
		case <-fan.C:
			h.fan(n == 0)
			n = (n + 1) % max(1, h.out.split)
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
		r.gone = true
	}
	h.mu.Unlock()
	unsubscribeAll(subs)
	unsubscribeAll(h.watches.close())
}

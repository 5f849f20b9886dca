package node

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
)

// Watch lists (docs/PROTOCOL.md, "Watch lists"): a connection follows some
// users of a room without joining it. The node subscribes to each watched
// user's subject, once however many connections watch them, so a room's
// churn reaches it only for the users its clients watch.
//
// Per watcher: the first read of its users (a snapshot of them, at a
// room_seq), then their events above it, each user's in seq order,
// exactly once. The stream stores a room's transitions in the order nodes
// publish them, not always in seq order, and a watched user's subject
// shows only that user's seqs, so a gap says nothing: each event waits
// watchReorder for any lower seq of its user, and goes out in seq order.
// One later than that, below a seq already sent for its user, reads the
// watcher again (cheap: its users only). Until its read is in, a watcher
// buffers. A new epoch, a NATS reconnect or an overflowing buffer also
// read it again (reason resync).

// UsersReader reads some users' presence in a room, with the sequences
// that join it to the room's events (*region.Store has it). Watch lists
// need it.
type UsersReader interface {
	Users(ctx context.Context, room string, users []string) (presence.Snapshot, error)
}

// errNoWatch refuses a watch where the store cannot read users.
var errNoWatch = errors.New("node: the store does not read users")

// wroom is one room watched on this node.
type wroom struct {
	name  string
	users map[string]*wuser
	subs  map[*nats.Subscription]bool
	// watchers by connection, each with its list.
	watchers map[*conn]*watcher
}

// watchReorder is how long a watched user's event waits for events of
// that user with a lower seq before it is sent.
const watchReorder = 200 * time.Millisecond

// wuser is one watched user: a subscription shared by its watchers.
type wuser struct {
	sub      *nats.Subscription
	ready    chan struct{} // closed once subscribed, or failed (err set)
	err      error
	watchers map[*conn]*watcher
	user     string
	held     []heldEvent // waiting out watchReorder, in arrival order
}

type heldEvent struct {
	e  event
	at time.Time
}

// watcher is one connection's watch of a room.
type watcher struct {
	users []string
	epoch int64
	after uint64            // the read's room_seq
	last  map[string]uint64 // per user, the last seq sent
	live  bool
	lost  bool // buf overflowed, or NATS reconnected, during its read: read again
	buf   []event
	gen   uint64 // bumped by every new list and resync: older reads are dropped
}

// watchUsers replaces c's watch of room by users (none: ends it) and, for a
// non-empty list, sends the watching reply. On error the room is no
// longer watched by c.
func (h *hub) watchUsers(ctx context.Context, room string, c *conn, ref string, users []string) error {
	if len(users) == 0 {
		h.unwatch(room, c)
		c.send(encodeWatching(ref, protocol.ReasonWatch, room, []string{}, nil))
		return nil
	}
	reader, ok := h.store.(UsersReader)
	if !ok || h.views != nil {
		return errNoWatch
	}
	h.mu.Lock()
	w := h.watched[room]
	if w == nil {
		w = &wroom{name: room, users: map[string]*wuser{}, subs: map[*nats.Subscription]bool{}, watchers: map[*conn]*watcher{}}
		h.watched[room] = w
	}
	old := w.watchers[c]
	wt := &watcher{users: users}
	if old != nil {
		wt.gen = old.gen + 1
	}
	w.watchers[c] = wt
	var subscribe []string
	var fresh, waits []*wuser
	for _, u := range users {
		wu := w.users[u]
		if wu == nil {
			wu = &wuser{ready: make(chan struct{}), watchers: map[*conn]*watcher{}, user: u}
			w.users[u] = wu
			subscribe, fresh = append(subscribe, u), append(fresh, wu)
		} else {
			waits = append(waits, wu)
		}
		wu.watchers[c] = wt
	}
	var drop []*nats.Subscription
	if old != nil {
		drop = h.dropUsersLocked(w, c, old.users, users)
	}
	h.mu.Unlock()
	unsubscribeAll(drop)

	err := h.subscribeUsers(ctx, w, subscribe, fresh)
	for _, wu := range waits {
		if err != nil {
			break
		}
		select {
		case <-wu.ready:
			err = wu.err
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	if err != nil {
		h.unwatch(room, c)
		return err
	}
	return h.readWatch(ctx, reader, w, c, wt, ref, protocol.ReasonWatch)
}

// subscribeUsers subscribes to the users' subjects (wus are their entries,
// made by the caller), then flushes, so the server has the interest before
// the first read. An entry dropped meanwhile gets no subscription.
func (h *hub) subscribeUsers(ctx context.Context, w *wroom, users []string, wus []*wuser) error {
	if len(users) == 0 {
		return nil
	}
	subs := make([]*nats.Subscription, len(users))
	var err error
	for i, u := range users {
		if subs[i], err = h.nc.ChanSubscribe(bus.UserFilter(h.region, w.name, u), h.msgs); err != nil {
			break
		}
		h.metrics.watchSubs.Inc()
	}
	if err == nil {
		err = h.nc.FlushWithContext(ctx)
	}
	var stale []*nats.Subscription
	h.mu.Lock()
	for i, u := range users {
		wu := wus[i]
		current := h.watched[w.name] == w && w.users[u] == wu
		switch {
		case subs[i] == nil:
		case !current || err != nil:
			stale = append(stale, subs[i]) // no longer watched meanwhile, or failed
		default:
			wu.sub = subs[i]
			w.subs[subs[i]] = true
		}
		wu.err = err
		close(wu.ready)
		if err != nil && current {
			delete(w.users, u)
		}
	}
	h.mu.Unlock()
	unsubscribeAll(stale)
	return err
}

// readWatch reads the watcher's users and sends them (reason watch or
// resync); the watcher is live from then on. A read for a list that was
// replaced meanwhile is dropped.
func (h *hub) readWatch(ctx context.Context, reader UsersReader, w *wroom, c *conn, wt *watcher, ref, reason string) error {
	for {
		h.mu.Lock()
		gen, users := wt.gen, wt.users
		h.mu.Unlock()
		snap, err := reader.Users(ctx, w.name, users)
		if err != nil {
			return err
		}
		h.mu.Lock()
		if w.watchers[c] != wt || wt.gen != gen {
			h.mu.Unlock()
			return nil // replaced or ended meanwhile
		}
		if wt.lost {
			// Events overflowed the buffer, or NATS reconnected, during
			// the read: read again, for the same reply.
			wt.lost, wt.buf = false, nil
			h.mu.Unlock()
			continue
		}
		snap = forDetail(snap, detailStates)
		c.send(encodeWatching(ref, reason, w.name, users, &snap))
		wt.epoch, wt.after, wt.live, wt.last = snap.Epoch, snap.RoomSeq, true, map[string]uint64{}
		buf := wt.buf
		wt.buf = nil
		for _, e := range buf {
			h.watchSendLocked(w, c, wt, e)
		}
		h.mu.Unlock()
		return nil
	}
}

// rewatch reads a watcher again until it succeeds, the watcher is
// replaced, or the node closes.
func (h *hub) rewatch(reader UsersReader, w *wroom, c *conn, wt *watcher, reason string) {
	defer h.wg.Done()
	for {
		ctx, cancel := context.WithTimeout(h.ctx, h.timeout)
		err := h.readWatch(ctx, reader, w, c, wt, "", reason)
		cancel()
		if err == nil {
			return
		}
		h.log.Warn("node: reading watched users failed; retrying", "room", w.name, "err", err)
		select {
		case <-h.ctx.Done():
			return
		case <-time.After(resyncPause):
		}
		h.mu.Lock()
		current := w.watchers[c] == wt
		h.mu.Unlock()
		if !current {
			return
		}
	}
}

// resyncWatcherLocked starts a watcher over from a new read.
func (h *hub) resyncWatcherLocked(w *wroom, c *conn, wt *watcher) {
	reader, ok := h.store.(UsersReader)
	if !ok {
		return
	}
	wt.live, wt.buf, wt.lost = false, nil, false
	wt.gen++
	h.metrics.resyncs.Inc()
	h.wg.Add(1)
	go h.rewatch(reader, w, c, wt, protocol.ReasonResync)
}

// holdWatchEventLocked holds an event of a watched user for its reorder
// window.
func (h *hub) holdWatchEventLocked(w *wroom, e event, now time.Time) {
	wu := w.users[e.user]
	if wu == nil {
		return
	}
	wu.held = append(wu.held, heldEvent{e, now})
	h.reorder[wu] = w
}

// releaseWatchEventsLocked passes on, in seq order per user, the held
// events that have waited out the reorder window. An event still inside
// it holds back every higher seq of its user.
func (h *hub) releaseWatchEventsLocked(now time.Time) {
	for wu, w := range h.reorder {
		if w.users[wu.user] != wu || h.watched[w.name] != w {
			delete(h.reorder, wu)
			continue
		}
		slices.SortStableFunc(wu.held, func(a, b heldEvent) int { return cmpSeq(a.e, b.e) })
		n := 0
		for n < len(wu.held) && now.Sub(wu.held[n].at) >= watchReorder {
			n++
		}
		for _, he := range wu.held[:n] {
			h.watchEventLocked(w, wu, he.e)
		}
		wu.held = slices.Delete(wu.held, 0, n)
		if len(wu.held) == 0 {
			wu.held = nil
			delete(h.reorder, wu)
		}
	}
}

// cmpSeq orders events by (epoch, seq).
func cmpSeq(a, b event) int {
	if a.epoch != b.epoch {
		return cmp.Compare(a.epoch, b.epoch)
	}
	return cmp.Compare(a.seq, b.seq)
}

// watchEventLocked passes an event of a watched user to its watchers.
func (h *hub) watchEventLocked(w *wroom, wu *wuser, e event) {
	for c, wt := range wu.watchers {
		switch {
		case !wt.live && len(wt.buf) >= maxBuffered:
			wt.lost, wt.buf = true, nil
		case !wt.live && !wt.lost:
			wt.buf = append(wt.buf, e)
		case wt.live:
			h.watchSendLocked(w, c, wt, e)
		}
	}
}

// watchSendLocked sends e to a live watcher unless it is reflected in its
// read or already sent. An event of a later numbering, or one below a seq
// already sent for its user (it came later than the reorder window),
// starts the watcher over.
func (h *hub) watchSendLocked(w *wroom, c *conn, wt *watcher, e event) {
	last := wt.last[e.user]
	switch {
	case e.epoch > wt.epoch || e.epoch == wt.epoch && e.seq > wt.after && e.seq < last:
		h.resyncWatcherLocked(w, c, wt)
	case e.epoch < wt.epoch || e.seq <= wt.after || e.seq == last:
	case e.sessionsOnly:
		wt.last[e.user] = e.seq
	default:
		c.send(e.frame)
		wt.last[e.user] = e.seq
	}
}

// unwatch ends c's watch of room.
func (h *hub) unwatch(room string, c *conn) {
	h.mu.Lock()
	var drop []*nats.Subscription
	if w := h.watched[room]; w != nil {
		if wt := w.watchers[c]; wt != nil {
			delete(w.watchers, c)
			drop = h.dropUsersLocked(w, c, wt.users, nil)
		}
		if len(w.watchers) == 0 {
			delete(h.watched, room)
		}
	}
	h.mu.Unlock()
	unsubscribeAll(drop)
}

// dropUsersLocked takes c off the users of old that are not in keep, and
// returns the subscriptions of users no one watches any more.
func (h *hub) dropUsersLocked(w *wroom, c *conn, old, keep []string) []*nats.Subscription {
	var drop []*nats.Subscription
	for _, u := range old {
		if slices.Contains(keep, u) {
			continue
		}
		wu := w.users[u]
		if wu == nil {
			continue
		}
		delete(wu.watchers, c)
		if len(wu.watchers) > 0 {
			continue
		}
		select {
		case <-wu.ready:
			delete(w.users, u)
			if wu.sub != nil {
				delete(w.subs, wu.sub)
				drop = append(drop, wu.sub)
			}
		default: // still subscribing: subscribeUsers finds it unwatched
			delete(w.users, u)
		}
	}
	return drop
}

// resyncWatchesLocked reads every watcher again, those still reading
// too: after a NATS reconnect, events sent meanwhile are lost.
func (h *hub) resyncWatchesLocked() {
	for _, w := range h.watched {
		for c, wt := range w.watchers {
			if wt.live {
				h.resyncWatcherLocked(w, c, wt)
			} else {
				// Its read under way may miss what NATS lost: read again.
				wt.lost, wt.buf = true, nil
			}
		}
	}
}

func unsubscribeAll(subs []*nats.Subscription) {
	for _, s := range subs {
		_ = s.Unsubscribe()
	}
}

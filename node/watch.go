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

// watches is the node's watch lists: the watched rooms, their users'
// subscriptions and their watchers. It shares nothing with the rooms of
// the hub but the NATS connection and the dispatcher's message queue.
// Its own lock, watches.mu, guards every wroom, wuser and watcher; NATS
// subscribes, unsubscribes, flushes and the users' reads run outside it.
type watches struct {
	nc      *nats.Conn
	region  string
	msgs    chan *nats.Msg // the dispatcher's queue
	reader  UsersReader    // nil: watches refused
	log     *slog.Logger
	metrics *metrics
	ctx     context.Context // bounds rereads (the node's Close cancels it)
	timeout time.Duration
	wg      *sync.WaitGroup // counts rereads

	mu      sync.Mutex
	watched map[string]*wroom
	// reorder holds the watched users with events waiting for their
	// reorder window.
	reorder map[*wuser]*wroom
}

// newWatches returns the watch lists of a hub; reader nil refuses every
// watch.
func newWatches(h *hub, reader UsersReader) *watches {
	return &watches{nc: h.nc, region: h.region, msgs: h.msgs, reader: reader, log: h.log, metrics: h.metrics,
		ctx: h.ctx, timeout: h.timeout, wg: h.wg, watched: map[string]*wroom{}, reorder: map[*wuser]*wroom{}}
}

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
func (ws *watches) watchUsers(ctx context.Context, room string, c *conn, ref string, users []string) error {
	if len(users) == 0 {
		ws.unwatch(room, c)
		c.send(encodeWatching(ref, protocol.ReasonWatch, room, []string{}, nil))
		return nil
	}
	if ws.reader == nil {
		return errNoWatch
	}
	ws.mu.Lock()
	w := ws.watched[room]
	if w == nil {
		w = &wroom{name: room, users: map[string]*wuser{}, subs: map[*nats.Subscription]bool{}, watchers: map[*conn]*watcher{}}
		ws.watched[room] = w
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
		drop = ws.dropUsersLocked(w, c, old.users, users)
	}
	ws.mu.Unlock()
	unsubscribeAll(drop)

	err := ws.subscribeUsers(ctx, w, subscribe, fresh)
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
		ws.unwatch(room, c)
		return err
	}
	return ws.readWatch(ctx, w, c, wt, ref, protocol.ReasonWatch)
}

// subscribeUsers subscribes to the users' subjects (wus are their entries,
// made by the caller), then flushes, so the server has the interest before
// the first read. An entry dropped meanwhile gets no subscription.
func (ws *watches) subscribeUsers(ctx context.Context, w *wroom, users []string, wus []*wuser) error {
	if len(users) == 0 {
		return nil
	}
	subs := make([]*nats.Subscription, len(users))
	var err error
	for i, u := range users {
		if subs[i], err = ws.nc.ChanSubscribe(bus.UserFilter(ws.region, w.name, u), ws.msgs); err != nil {
			break
		}
		ws.metrics.watchSubs.Inc()
	}
	if err == nil {
		err = ws.nc.FlushWithContext(ctx)
	}
	var stale []*nats.Subscription
	ws.mu.Lock()
	for i, u := range users {
		wu := wus[i]
		current := ws.watched[w.name] == w && w.users[u] == wu
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
	ws.mu.Unlock()
	unsubscribeAll(stale)
	return err
}

// readWatch reads the watcher's users and sends them (reason watch or
// resync); the watcher is live from then on. A read for a list that was
// replaced meanwhile is dropped.
func (ws *watches) readWatch(ctx context.Context, w *wroom, c *conn, wt *watcher, ref, reason string) error {
	for {
		ws.mu.Lock()
		gen, users := wt.gen, wt.users
		ws.mu.Unlock()
		snap, err := ws.reader.Users(ctx, w.name, users)
		if err != nil {
			return err
		}
		ws.mu.Lock()
		if w.watchers[c] != wt || wt.gen != gen {
			ws.mu.Unlock()
			return nil // replaced or ended meanwhile
		}
		if wt.lost {
			// Events overflowed the buffer, or NATS reconnected, during
			// the read: read again, for the same reply.
			wt.lost, wt.buf = false, nil
			ws.mu.Unlock()
			continue
		}
		snap = forDetail(snap, detailStates)
		c.send(encodeWatching(ref, reason, w.name, users, &snap))
		wt.epoch, wt.after, wt.live, wt.last = snap.Epoch, snap.RoomSeq, true, map[string]uint64{}
		buf := wt.buf
		wt.buf = nil
		for _, e := range buf {
			ws.watchSendLocked(w, c, wt, e)
		}
		ws.mu.Unlock()
		return nil
	}
}

// rewatch reads a watcher again until it succeeds, the watcher is
// replaced, or the node closes.
func (ws *watches) rewatch(w *wroom, c *conn, wt *watcher, reason string) {
	defer ws.wg.Done()
	for {
		ctx, cancel := context.WithTimeout(ws.ctx, ws.timeout)
		err := ws.readWatch(ctx, w, c, wt, "", reason)
		cancel()
		if err == nil {
			return
		}
		ws.log.Warn("node: reading watched users failed; retrying", "room", w.name, "err", err)
		select {
		case <-ws.ctx.Done():
			return
		case <-time.After(resyncPause):
		}
		ws.mu.Lock()
		current := w.watchers[c] == wt
		ws.mu.Unlock()
		if !current {
			return
		}
	}
}

// resyncWatcherLocked starts a watcher over from a new read.
func (ws *watches) resyncWatcherLocked(w *wroom, c *conn, wt *watcher) {
	if ws.reader == nil {
		return
	}
	wt.live, wt.buf, wt.lost = false, nil, false
	wt.gen++
	ws.metrics.resyncs.Inc()
	ws.wg.Add(1)
	go ws.rewatch(w, c, wt, protocol.ReasonResync)
}

// offer takes an event off a subscription of a watched user of room
// (false: sub is none of the watch lists'), held for its reorder window.
func (ws *watches) offer(room string, sub *nats.Subscription, e event, now time.Time) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	w := ws.watched[room]
	if w == nil || !w.subs[sub] {
		return false
	}
	e.frame = watchFrame(e.frame)
	ws.holdWatchEventLocked(w, e, now)
	return true
}

// release passes on the held events whose reorder window ended by now;
// the dispatcher calls it every grain.
func (ws *watches) release(now time.Time) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.releaseWatchEventsLocked(now)
}

// holdWatchEventLocked holds an event of a watched user for its reorder
// window.
func (ws *watches) holdWatchEventLocked(w *wroom, e event, now time.Time) {
	wu := w.users[e.user]
	if wu == nil {
		return
	}
	wu.held = append(wu.held, heldEvent{e, now})
	ws.reorder[wu] = w
}

// releaseWatchEventsLocked passes on, in seq order per user, the held
// events that have waited out the reorder window. An event still inside
// it holds back every higher seq of its user.
func (ws *watches) releaseWatchEventsLocked(now time.Time) {
	for wu, w := range ws.reorder {
		if w.users[wu.user] != wu || ws.watched[w.name] != w {
			delete(ws.reorder, wu)
			continue
		}
		slices.SortStableFunc(wu.held, func(a, b heldEvent) int { return cmpSeq(a.e, b.e) })
		n := 0
		for n < len(wu.held) && now.Sub(wu.held[n].at) >= watchReorder {
			n++
		}
		for _, he := range wu.held[:n] {
			ws.watchEventLocked(w, wu, he.e)
		}
		wu.held = slices.Delete(wu.held, 0, n)
		if len(wu.held) == 0 {
			wu.held = nil
			delete(ws.reorder, wu)
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
func (ws *watches) watchEventLocked(w *wroom, wu *wuser, e event) {
	for c, wt := range wu.watchers {
		switch {
		case !wt.live && len(wt.buf) >= maxBuffered:
			wt.lost, wt.buf = true, nil
		case !wt.live && !wt.lost:
			wt.buf = append(wt.buf, e)
		case wt.live:
			ws.watchSendLocked(w, c, wt, e)
		}
	}
}

// watchSendLocked sends e to a live watcher unless it is reflected in its
// read or already sent. An event of a later numbering, or one below a seq
// already sent for its user (it came later than the reorder window),
// starts the watcher over.
func (ws *watches) watchSendLocked(w *wroom, c *conn, wt *watcher, e event) {
	last := wt.last[e.user]
	switch {
	case e.epoch > wt.epoch || e.epoch == wt.epoch && e.seq > wt.after && e.seq < last:
		ws.resyncWatcherLocked(w, c, wt)
	case e.epoch < wt.epoch || e.seq <= wt.after || e.seq == last:
	case e.sessionsOnly:
		wt.last[e.user] = e.seq
	default:
		c.send(e.frame)
		wt.last[e.user] = e.seq
	}
}

// unwatch ends c's watch of room.
func (ws *watches) unwatch(room string, c *conn) {
	ws.mu.Lock()
	var drop []*nats.Subscription
	if w := ws.watched[room]; w != nil {
		if wt := w.watchers[c]; wt != nil {
			delete(w.watchers, c)
			drop = ws.dropUsersLocked(w, c, wt.users, nil)
		}
		if len(w.watchers) == 0 {
			delete(ws.watched, room)
		}
	}
	ws.mu.Unlock()
	unsubscribeAll(drop)
}

// dropUsersLocked takes c off the users of old that are not in keep, and
// returns the subscriptions of users no one watches any more.
func (ws *watches) dropUsersLocked(w *wroom, c *conn, old, keep []string) []*nats.Subscription {
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

// resync reads every watcher again, those still reading too: after a
// NATS reconnect, events sent meanwhile are lost.
func (ws *watches) resync() {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for _, w := range ws.watched {
		for c, wt := range w.watchers {
			if wt.live {
				ws.resyncWatcherLocked(w, c, wt)
			} else {
				// Its read under way may miss what NATS lost: read again.
				wt.lost, wt.buf = true, nil
			}
		}
	}
}

// close ends every watch and returns the subscriptions to drop.
func (ws *watches) close() []*nats.Subscription {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	var subs []*nats.Subscription
	for name, w := range ws.watched {
		for sub := range w.subs {
			subs = append(subs, sub)
		}
		delete(ws.watched, name)
	}
	return subs
}

func unsubscribeAll(subs []*nats.Subscription) {
	for _, s := range subs {
		_ = s.Unsubscribe()
	}
}

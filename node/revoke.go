package node

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"github.com/nats-io/nats.go"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
)

// The server API disconnects users (bus.RegionDisconnect): every node of
// the region is told on bus.DropSubject to close the user's connections,
// and, with a revocation, to refuse the user until it ends: their joins
// of the room, or with every room their connections (accepted, then
// closed with CloseRevoked, so a browser reads why). The revocations live
// in the region's store; a node reads them when it starts and again every
// heartbeat, so one that missed a message, or started later, keeps them
// all the same, and closes what a missed one would have.

// Revocations is where a node reads the region's revocations: the
// regional store (*region.Store).
type Revocations interface {
	Revocations(ctx context.Context) ([]presence.Revocation, error)
}

// revKey names a revocation: a user, and a room or "" for every room.
type revKey struct{ user, room string }

type revEntry struct {
	until time.Time
	gen   uint64 // when it was learned from a drop (see replace)
}

// revocations is a node's copy of the region's revocations.
type revocations struct {
	mu  sync.RWMutex
	m   map[revKey]revEntry
	gen uint64 // counts the drops learned
	now func() time.Time
}

func newRevocations() *revocations {
	return &revocations{m: map[revKey]revEntry{}, now: time.Now}
}

// set records a revocation told by a drop; it replaces the user's and
// room's earlier one, later or not (a later call may shorten it).
func (r *revocations) set(v presence.Revocation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gen++
	r.m[revKey{v.User, v.Room}] = revEntry{until: v.Until, gen: r.gen}
	r.pruneLocked()
}

// mark is the point a read of the store starts from: drops learned
// after it are newer than what the read returns.
func (r *revocations) mark() uint64 {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.gen
}

// replace takes the store's revocations, read from mark on, as the
// node's, keeping what drops told since, and returns the ones it did not
// hold before, or held ending sooner: what a missed drop would have
// closed.
func (r *revocations) replace(list []presence.Revocation, mark uint64) []presence.Revocation {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := make(map[revKey]revEntry, len(list))
	var fresh []presence.Revocation
	for _, v := range list {
		k := revKey{v.User, v.Room}
		if old, ok := r.m[k]; !ok || old.until.Before(v.Until) {
			fresh = append(fresh, v)
		}
		m[k] = revEntry{until: v.Until}
	}
	for k, e := range r.m {
		if e.gen > mark {
			m[k] = e
		}
	}
	r.m = m
	r.pruneLocked()
	return fresh
}

func (r *revocations) pruneLocked() {
	now := r.now()
	for k, e := range r.m {
		if !now.Before(e.until) {
			delete(r.m, k)
		}
	}
}

// connect reports until when user may not connect at all.
func (r *revocations) connect(user string) (time.Time, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e, ok := r.m[revKey{user, ""}]
	return e.until, ok && r.now().Before(e.until)
}

// join reports until when user may not join room: a revocation of the
// room, or of every room, whichever ends later.
func (r *revocations) join(user, room string) (time.Time, bool) {
	until, ok := r.connect(user)
	r.mu.RLock()
	defer r.mu.RUnlock()
	if e, in := r.m[revKey{user, room}]; in && r.now().Before(e.until) && e.until.After(until) {
		return e.until, true
	}
	return until, ok
}

// dropper closes the connections of disconnected users: it follows the
// region's drops and its store's revocations.
type dropper struct {
	region  string
	nc      *nats.Conn
	store   Revocations // nil: drops only
	revs    *revocations
	wheel   *wheel
	hub     *hub
	every   time.Duration
	timeout time.Duration
	log     *slog.Logger
	sub     *nats.Subscription
}

// start subscribes to the drops; run then reads the store's
// revocations, so that none written meanwhile is missed.
func (d *dropper) start() error {
	sub, err := bus.SubscribeDrops(d.nc, d.region, d.onDrop)
	if err != nil {
		return err
	}
	d.sub = sub
	return nil
}

// run reads the store's revocations at once, then every d.every until
// ctx is done. A revoked user who connects before the first read ends
// is closed by it.
func (d *dropper) run(ctx context.Context) {
	if d.store == nil {
		return
	}
	d.reload(ctx)
	t := time.NewTicker(d.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			d.reload(ctx)
		}
	}
}

func (d *dropper) close() {
	if d.sub != nil {
		_ = d.sub.Unsubscribe()
	}
}

// reload reads the store's revocations and closes the connections of
// users revoked since the last read whose drop this node missed.
func (d *dropper) reload(ctx context.Context) {
	if d.store == nil {
		return
	}
	mark := d.revs.mark()
	rctx, cancel := context.WithTimeout(ctx, d.timeout)
	list, err := d.store.Revocations(rctx)
	cancel()
	if err != nil {
		d.log.Warn("node: reading revocations failed", "err", err)
		return
	}
	for _, v := range d.revs.replace(list, mark) {
		d.drop(v.User, v.Room, &v.Until)
	}
}

func (d *dropper) onDrop(m bus.Drop) {
	if m.Until != nil {
		d.revs.set(presence.Revocation{User: m.User, Room: m.Room, Until: *m.Until})
	}
	d.drop(m.User, m.Room, m.Until)
}

// drop closes user's connections: those in room, or with room empty all
// of them. Closing a user out of every room while revoked says until
// when (CloseRevoked); otherwise the client may reconnect
// (CloseDisconnected), and a revoked room's join is then refused. Their
// sessions are released, as on a clean close.
func (d *dropper) drop(user, room string, until *time.Time) {
	var conns []*conn
	if room == "" {
		conns = d.wheel.connsOf(user)
	} else {
		conns = d.hub.connsIn(room, user)
	}
	code, text := protocol.CloseDisconnected, "disconnected"
	if room == "" && until != nil && d.revs.now().Before(*until) {
		code, text = protocol.CloseRevoked, revokedText(*until)
	}
	for _, c := range conns {
		c.shutdown(code, text, false)
	}
	if len(conns) > 0 {
		d.log.Info("node: user disconnected by the server API", "user", user, "room", room, "connections", len(conns), "code", code)
	}
}

// revokedText is the reason of a CloseRevoked close: "revoked until"
// and the end, RFC 3339 in UTC, which the client reads.
func revokedText(until time.Time) string {
	return protocol.RevokedUntilPrefix + until.UTC().Format(time.RFC3339)
}

// refuseRevoked closes a just upgraded connection of a revoked user with
// CloseRevoked: refused before the upgrade, a browser would only see
// 1006 and retry.
func refuseRevoked(ws *websocket.Conn, until time.Time) {
	_ = ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(protocol.CloseRevoked, revokedText(until)), time.Now().Add(time.Second))
	_ = ws.Close()
}

// connsOf returns user's open connections.
func (w *wheel) connsOf(user string) []*conn {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []*conn
	for _, sl := range w.slots {
		for _, c := range sl {
			if c.user == user {
				out = append(out, c)
			}
		}
	}
	return out
}

// connsIn returns user's connections that are members of room (joined,
// following or waiting for a snapshot).
func (h *hub) connsIn(room, user string) []*conn {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.rooms[room]
	if r == nil {
		return nil
	}
	var out []*conn
	for c := range r.members {
		if c.user == user {
			out = append(out, c)
		}
	}
	return out
}

package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
)

// JoinOptions are a join's view kind and its callback.
type JoinOptions struct {
	// Sessions keeps every member's session list (detail "sessions"),
	// not only the sessions that have a state.
	Sessions bool
	// Count follows the member count (view "count") instead of the
	// members; Room.Count is then the count.
	Count bool
	// Observe follows the room without a session in it (present false):
	// not listed, not counted, no state. The token needs the observe
	// claim.
	Observe bool
	// OnChange, if set, is told of every change of the view.
	OnChange func(Change)
}

// Room is a joined room, kept joined across reconnects until Leave.
type Room struct {
	c    *Client
	id   string
	opts JoinOptions

	// guarded by c.mu
	joinRef string
	synced  bool // a snapshot (or count) came on the current connection
	view    *view
	total   int
	count   int
	region  string
	desired json.RawMessage // the last state set; sent again after a rejoin
	acked   json.RawMessage

	ready    chan struct{} // closed by the first snapshot or count
	ended    chan struct{} // closed by terminate
	once     sync.Once
	doneOnce sync.Once
	err      error // why the room ended
}

// Join joins room and waits for its first snapshot (or count). A join
// refused with unavailable is sent again after its retry_after_ms; any
// other refusal is returned as a *protocol.Error. If the connection is
// down, Join waits for the next one, or for ctx.
func (c *Client) Join(ctx context.Context, room string, opts JoinOptions) (*Room, error) {
	if err := validRoom(room); err != nil {
		return nil, err
	}
	if opts.Count && opts.Sessions {
		return nil, &protocol.Error{Type: protocol.TypeError, Code: protocol.CodeInvalidView, Message: "detail sessions does not go with view count"}
	}
	r := &Room{c: c, id: room, opts: opts, view: newView(opts.Sessions), ready: make(chan struct{}), ended: make(chan struct{})}
	cn, err := enlist(c, &c.rooms, room, r, "joined already")
	if err != nil {
		return nil, err
	}
	err = ErrDisconnected
	if cn != nil {
		err = r.join(ctx, cn)
	}
	if errors.Is(err, ErrDisconnected) {
		select {
		case <-r.ready:
			err = nil
		case <-r.ended:
			err = r.err
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	if err != nil {
		c.forget(r)
		r.terminate(err)
		return nil, err
	}
	return r, nil
}

func (r *Room) request() protocol.Request {
	req := protocol.Request{Type: protocol.TypeJoin, Room: r.id}
	switch {
	case r.opts.Count:
		req.View = protocol.ViewCount
	case r.opts.Sessions:
		req.Detail, req.Batch = protocol.DetailSessions, true
	default:
		req.Batch = true // this client reads events frames
	}
	if r.opts.Observe {
		f := false
		req.Present = &f
	}
	return req
}

// join sends the join on cn until it is answered, then the state.
func (r *Room) join(ctx context.Context, cn *conn) error {
	c := r.c
	for {
		_, err := c.request(ctx, cn, r.request(), func(ref string) error {
			if c.rooms[r.id] != r {
				return errLeft // left meanwhile: no join after the leave
			}
			r.joinRef = ref
			return nil
		})
		var pe *protocol.Error
		if errors.As(err, &pe) && pe.Code == protocol.CodeUnavailable {
			if !sleep(ctx, retryDelay(pe.RetryAfter(), c.rnd())) {
				return ctx.Err()
			}
			continue
		}
		if pe != nil {
			c.forget(r)
			r.terminate(pe)
			return pe
		}
		if err != nil {
			return err
		}
		break
	}
	c.mu.Lock()
	st := r.desired
	c.mu.Unlock()
	if st == nil || r.opts.Observe {
		return nil
	}
	return r.sendState(ctx, cn, st)
}

// validRoom is ValidateRoom's verdict as the node gives it.
func validRoom(room string) error {
	if err := presence.ValidateRoom(room); err != nil {
		return &protocol.Error{Type: protocol.TypeError, Code: protocol.CodeInvalidRoom, Message: err.Error()}
	}
	return nil
}

// enlist adds v to *m (the client's rooms or watch lists) as room, unless
// the client has ended or room is there already (taken says how). It
// returns the open connection, nil while down.
func enlist[T any](c *Client, m *map[string]*T, room string, v *T, taken string) (*conn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return nil, c.err
	}
	if _, ok := (*m)[room]; ok {
		return nil, fmt.Errorf("presence client: room %q is %s", room, taken)
	}
	(*m)[room] = v
	return c.cur, nil
}

// forget removes r from the client's rooms, if it is still there.
func (c *Client) forget(r *Room) {
	c.mu.Lock()
	if c.rooms[r.id] == r {
		delete(c.rooms, r.id)
	}
	c.mu.Unlock()
}

// ID is the room's id.
func (r *Room) ID() string { return r.id }

// Members is the view: the members ordered by user id (empty for a
// count view). A snapshot lists the first 1000 members of a larger room
// (Total counts them all); this client does not page through the rest.
func (r *Room) Members() []Member {
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	return r.view.list()
}

// Total is the member count: the last snapshot's, kept by the events
// since, so it counts the members a truncated snapshot does not list.
func (r *Room) Total() int {
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	return r.total
}

// Count is a count view's last count.
func (r *Room) Count() int {
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	return r.count
}

// Region is the region of the view's last snapshot: the node's, or
// "global" on a node serving the global view.
func (r *Room) Region() string {
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	return r.region
}

// Err is why the room ended (left, refused on a rejoin, revoked, the
// client closed); nil while it is joined.
func (r *Room) Err() error {
	select {
	case <-r.ended:
		return r.err
	default:
		return nil
	}
}

// SetState sets this session's state in the room: any JSON value up to
// the node's max_state_bytes; nil clears it. It returns once the node has
// answered; ErrDisconnected if the connection is down, and the state is
// then sent after the rejoin.
func (r *Room) SetState(ctx context.Context, state any) error {
	b, err := json.Marshal(state)
	if err != nil {
		return &protocol.Error{Type: protocol.TypeError, Code: protocol.CodeInvalidState, Message: "state is not JSON: " + err.Error()}
	}
	c := r.c
	c.mu.Lock()
	limit := c.hello.Limits.MaxStateBytes
	if limit <= 0 {
		limit = presence.MaxStateBytes
	}
	switch {
	case r.Err() != nil:
		c.mu.Unlock()
		return r.Err()
	case r.opts.Observe:
		c.mu.Unlock()
		return &protocol.Error{Type: protocol.TypeError, Code: protocol.CodeNotJoined, Message: "room " + r.id + " is joined without presence"}
	case len(b) > limit:
		c.mu.Unlock()
		return &protocol.Error{Type: protocol.TypeError, Code: protocol.CodeInvalidState, Message: fmt.Sprintf("state is %d bytes, over %d", len(b), limit)}
	}
	r.desired = b
	cn, synced := c.cur, r.synced
	c.mu.Unlock()
	if cn == nil || !synced {
		return ErrDisconnected // the rejoin sends it
	}
	return r.sendState(ctx, cn, b)
}

func (r *Room) sendState(ctx context.Context, cn *conn, st json.RawMessage) error {
	c := r.c
	for {
		_, err := c.request(ctx, cn, protocol.Request{Type: protocol.TypeState, Room: r.id, State: st}, nil)
		var pe *protocol.Error
		if errors.As(err, &pe) && pe.Code == protocol.CodeUnavailable {
			if !sleep(ctx, retryDelay(pe.RetryAfter(), c.rnd())) {
				return ctx.Err()
			}
			continue
		}
		c.mu.Lock()
		switch {
		case err == nil:
			r.acked = st
		case pe != nil && string(r.desired) == string(st):
			r.desired = r.acked // refused: the node kept the one before
		}
		c.mu.Unlock()
		return err
	}
}

// Leave leaves the room: the node releases the session in it, and its
// members see the user leave once the offline grace has passed without a
// return. The view empties at once.
func (r *Room) Leave(ctx context.Context) error {
	c := r.c
	c.mu.Lock()
	joined := c.rooms[r.id] == r
	if joined {
		delete(c.rooms, r.id)
	}
	cn := c.cur
	c.mu.Unlock()
	if !joined {
		return nil
	}
	r.terminate(errLeft)
	for cn != nil {
		_, err := c.request(ctx, cn, protocol.Request{Type: protocol.TypeLeave, Room: r.id}, nil)
		var pe *protocol.Error
		if !errors.As(err, &pe) || pe.Code != protocol.CodeUnavailable {
			break // not_joined, disconnected: the session is released anyway
		}
		if !sleep(ctx, retryDelay(pe.RetryAfter(), c.rnd())) {
			return ctx.Err()
		}
	}
	return nil
}

var errLeft = errors.New("presence client: room left")

func (r *Room) terminate(err error) {
	r.doneOnce.Do(func() {
		r.c.mu.Lock()
		r.err = err
		r.view.reset(nil, nil)
		r.synced = false
		r.c.mu.Unlock()
		close(r.ended)
	})
}

// onSnapshot applies a snapshot frame: the reply to the latest join, or
// a resync on the current connection (c.mu held).
func (r *Room) onSnapshot(f *protocol.Frame) []func() {
	if f.Snapshot == nil || f.Ref != r.joinRef && (f.Ref != "" || !r.synced) {
		return nil // a reply to an older join: the latest one follows
	}
	r.view.reset(f.Snapshot, nil)
	r.total, r.region, r.synced = f.Snapshot.Total, f.Snapshot.Region, true
	r.once.Do(func() { close(r.ready) })
	return r.notify(Change{Room: r.id, Kind: Sync, Reason: f.Reason})
}

func (r *Room) onCount(f *protocol.Frame) []func() {
	if f.Count == nil || f.Ref != r.joinRef && (f.Ref != "" || !r.synced) {
		return nil
	}
	r.count, r.total, r.synced = *f.Count, *f.Count, true
	r.once.Do(func() { close(r.ready) })
	return r.notify(Change{Room: r.id, Kind: Counted, Count: *f.Count})
}

func (r *Room) onEvent(t presence.Transition) []func() {
	if !r.synced || !r.view.apply(t) {
		return nil
	}
	// Events count members a truncated snapshot does not list too: an
	// online is of a user who was not a member, an offline of one who was.
	switch t.Kind {
	case presence.Online:
		r.total++
	case presence.Offline:
		r.total = max(0, r.total-1)
	}
	return r.notify(Change{Room: r.id, Kind: Applied, Event: t})
}

func (r *Room) notify(ch Change) []func() {
	if r.opts.OnChange == nil {
		return nil
	}
	fn := r.opts.OnChange
	return []func(){func() { fn(ch) }}
}

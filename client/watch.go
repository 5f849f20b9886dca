package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
)

// Watch follows some users of a room without joining it (docs/PROTOCOL.md,
// "Watch lists"): the watched users who are members, kept as without
// detail (states only). The node holds one list per room and connection,
// so a client has one Watch per room; it is sent again on every
// reconnect until Close.
type Watch struct {
	c        *Client
	room     string
	onChange func(Change)

	// guarded by c.mu
	users   []string // the list asked for last
	ref     string   // the latest watch request's
	watched map[string]bool
	synced  bool
	view    *view

	ended    chan struct{}
	doneOnce sync.Once
	err      error
}

// Watch starts following users of room and waits for the node's first
// answer; while the connection is down it returns at once, and the next
// connection sends the list. onChange, if set, is told of every change
// of the view.
func (c *Client) Watch(ctx context.Context, room string, users []string, onChange func(Change)) (*Watch, error) {
	if err := validRoom(room); err != nil {
		return nil, err
	}
	list, err := c.checkUsers(users)
	if err != nil {
		return nil, err
	}
	w := &Watch{c: c, room: room, onChange: onChange, users: list, view: newView(false), ended: make(chan struct{})}
	cn, err := enlist(c, &c.watches, room, w, "watched already: Update its Watch")
	if err != nil {
		return nil, err
	}
	err = ErrDisconnected
	if cn != nil {
		err = w.send(ctx, cn)
	}
	if err != nil && !errors.Is(err, ErrDisconnected) {
		w.forget()
		w.terminate(err)
		return nil, err
	}
	return w, nil // when disconnected, the next connection sends it
}

// checkUsers returns users without repeats, each a valid id, within the
// node's max_watch_users.
func (c *Client) checkUsers(users []string) ([]string, error) {
	bad := func(msg string) error {
		return &protocol.Error{Type: protocol.TypeError, Code: protocol.CodeInvalidWatch, Message: msg}
	}
	list := make([]string, 0, len(users))
	for _, u := range users {
		if err := presence.ValidateUser(u); err != nil {
			return nil, bad(err.Error())
		}
		if !slices.Contains(list, u) {
			list = append(list, u)
		}
	}
	c.mu.Lock()
	limit := c.hello.Limits.MaxWatchUsers
	c.mu.Unlock()
	if limit > 0 && len(list) > limit {
		return nil, bad(fmt.Sprintf("at most %d users per watch, not %d", limit, len(list)))
	}
	return list, nil
}

// send sends the list on cn until the node has answered.
func (w *Watch) send(ctx context.Context, cn *conn) error {
	c := w.c
	for {
		c.mu.Lock()
		users := slices.Clone(w.users)
		c.mu.Unlock()
		_, err := c.request(ctx, cn, protocol.Request{Type: protocol.TypeWatch, Room: w.room, Users: &users}, func(ref string) error {
			if w.c.watches[w.room] != w {
				return errWatchClosed
			}
			w.ref = ref
			return nil
		})
		var pe *protocol.Error
		if errors.As(err, &pe) && pe.Code == protocol.CodeUnavailable {
			// The node dropped the room's watch: send it again.
			if !sleep(ctx, retryDelay(pe.RetryAfter(), c.rnd())) {
				return ctx.Err()
			}
			continue
		}
		return err
	}
}

// Update replaces the list and waits for the node's answer. A refused
// list leaves the one before in place.
func (w *Watch) Update(ctx context.Context, users []string) error {
	list, err := w.c.checkUsers(users)
	if err != nil {
		return err
	}
	c := w.c
	c.mu.Lock()
	old := w.users
	w.users = list
	cn := c.cur
	c.mu.Unlock()
	if cn == nil {
		return ErrDisconnected // the next connection sends it
	}
	err = w.send(ctx, cn)
	var pe *protocol.Error
	if errors.As(err, &pe) {
		c.mu.Lock()
		w.users = old
		c.mu.Unlock()
	}
	return err
}

// Users is the list asked for last.
func (w *Watch) Users() []string {
	w.c.mu.Lock()
	defer w.c.mu.Unlock()
	return slices.Clone(w.users)
}

// Members is the view: the watched users who are members, by user id.
func (w *Watch) Members() []Member {
	w.c.mu.Lock()
	defer w.c.mu.Unlock()
	return w.view.list()
}

// Err is why the watch ended; nil while it runs.
func (w *Watch) Err() error {
	select {
	case <-w.ended:
		return w.err
	default:
		return nil
	}
}

// Close ends the watch (users: []); the view empties at once.
func (w *Watch) Close(ctx context.Context) error {
	c := w.c
	if !w.forget() {
		return nil
	}
	w.terminate(errWatchClosed)
	c.mu.Lock()
	cn := c.cur
	c.mu.Unlock()
	if cn == nil {
		return nil // the node forgot the watch with the connection
	}
	empty := []string{}
	_, err := c.request(ctx, cn, protocol.Request{Type: protocol.TypeWatch, Room: w.room, Users: &empty}, nil)
	if errors.Is(err, ErrDisconnected) {
		return nil
	}
	return err
}

var errWatchClosed = errors.New("presence client: watch closed")

func (w *Watch) forget() bool {
	w.c.mu.Lock()
	defer w.c.mu.Unlock()
	if w.c.watches[w.room] != w {
		return false
	}
	delete(w.c.watches, w.room)
	return true
}

func (w *Watch) terminate(err error) {
	w.doneOnce.Do(func() {
		w.c.mu.Lock()
		w.err, w.synced = err, false
		w.view.reset(nil, nil)
		w.c.mu.Unlock()
		close(w.ended)
	})
}

// onWatching applies a watching frame: the reply to the latest watch, a
// resync, or the end of a revoked room (c.mu held).
func (w *Watch) onWatching(f *protocol.Frame) []func() {
	switch {
	case f.Ref == "" && f.Reason == protocol.ReasonRevoked:
		delete(w.c.watches, w.room)
		err := &protocol.Error{Type: protocol.TypeError, Code: protocol.CodeRevoked, Message: "a refreshed token no longer grants room " + w.room}
		return []func(){func() { w.terminate(err); w.c.report("", err) }}
	case f.Ref != "" && f.Ref != w.ref, f.Ref == "" && !w.synced:
		return nil // an older reply, or a resync before this connection's reply
	}
	w.watched = map[string]bool{}
	for _, u := range f.Users {
		w.watched[u] = true
	}
	w.view.reset(f.Snapshot, func(u string) bool { return w.watched[u] })
	w.synced = true
	return w.notify(Change{Room: w.room, Kind: Sync, Reason: f.Reason})
}

func (w *Watch) onEvent(t presence.Transition) []func() {
	if !w.synced || !w.watched[t.User] || !w.view.apply(t) {
		return nil
	}
	return w.notify(Change{Room: w.room, Kind: Applied, Event: t})
}

func (w *Watch) notify(ch Change) []func() {
	if w.onChange == nil {
		return nil
	}
	fn := w.onChange
	return []func(){func() { fn(ch) }}
}

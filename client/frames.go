package client

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/gorilla/websocket"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
)

// ChangeKind says what a Change is.
type ChangeKind int

// Kinds of change.
const (
	// Sync: a snapshot (or watching) replaced the view, as the reply to
	// a join (Reason protocol.ReasonJoin, also after every reconnect) or
	// because the node lost track (protocol.ReasonResync).
	Sync ChangeKind = iota + 1
	// Applied: an event changed the view (Event).
	Applied
	// Counted: a count view's count changed (Count).
	Counted
)

// Change is one change of a room's or a watch list's view, handed to its
// OnChange once the view holds it.
type Change struct {
	Room   string
	Kind   ChangeKind
	Reason string              // on Sync
	Event  presence.Transition // on Applied
	Count  int                 // on Counted
}

// request sends req on cn and waits for the node's answer: the reply, an
// *protocol.Error for an error frame, or ErrDisconnected. register runs,
// under c.mu, with the request's ref before it is sent; its error, if
// any, is returned instead of sending.
func (c *Client) request(ctx context.Context, cn *conn, req protocol.Request, register func(ref string) error) (protocol.Frame, error) {
	if err := cn.lim.Wait(ctx); err != nil {
		return protocol.Frame{}, err
	}
	ch := make(chan result, 1)
	c.mu.Lock()
	if c.cur != cn {
		c.mu.Unlock()
		return protocol.Frame{}, ErrDisconnected
	}
	c.refs++
	req.Ref = strconv.FormatUint(c.refs, 36)
	if register != nil {
		if err := register(req.Ref); err != nil {
			c.mu.Unlock()
			return protocol.Frame{}, err
		}
	}
	c.pending[req.Ref] = ch
	c.mu.Unlock()
	b, err := json.Marshal(req)
	if err != nil {
		return protocol.Frame{}, fmt.Errorf("presence client: encoding %s: %w", req.Type, err)
	}
	cn.wmu.Lock()
	_ = cn.ws.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if err := cn.ws.WriteMessage(websocket.TextMessage, b); err != nil {
		_ = cn.ws.Close() // the reader ends, and the pending requests fail
	}
	cn.wmu.Unlock()
	select {
	case r := <-ch:
		if r.err != nil {
			return r.f, r.err
		}
		if e := r.f.Err(); e != nil {
			return r.f, e
		}
		return r.f, nil
	case <-ctx.Done():
		c.mu.Lock()
		delete(c.pending, req.Ref)
		c.mu.Unlock()
		return protocol.Frame{}, ctx.Err()
	}
}

// handle applies one frame of the node: to a room's or a watch list's
// view first, then to the request it answers, then the callbacks.
func (c *Client) handle(data []byte) {
	var f protocol.Frame
	if err := json.Unmarshal(data, &f); err != nil {
		c.report("frame", fmt.Errorf("presence client: unreadable frame %.100s: %w", data, err))
		return
	}
	c.mu.Lock()
	calls, err := c.apply(&f)
	ch := c.pending[f.Ref]
	if f.Ref != "" {
		delete(c.pending, f.Ref)
	}
	c.mu.Unlock()
	if ch != nil {
		ch <- result{f: f}
	} else if f.Type == protocol.TypeError {
		c.report("", f.Err())
	}
	if err != nil {
		c.report("frame", err)
	}
	for _, fn := range calls {
		fn()
	}
}

// apply hands f to its room or watch list (c.mu held) and returns the
// callbacks to run once c.mu is released.
func (c *Client) apply(f *protocol.Frame) ([]func(), error) {
	r, w := c.rooms[f.Room], c.watches[f.Room]
	switch f.Type {
	case protocol.TypeSnapshot:
		if r != nil {
			return r.onSnapshot(f), nil
		}
	case protocol.TypeCount:
		if r != nil {
			return r.onCount(f), nil
		}
	case protocol.TypeWatching:
		if w != nil {
			return w.onWatching(f), nil
		}
	case protocol.TypeLeft:
		if r != nil && f.Ref == "" && f.Reason == protocol.ReasonRevoked {
			delete(c.rooms, r.id)
			err := &protocol.Error{Type: protocol.TypeError, Code: protocol.CodeRevoked, Message: "a refreshed token no longer grants room " + r.id}
			return []func(){func() { r.terminate(err); c.report("", err) }}, nil
		}
	case protocol.TypeEvent:
		t, err := bus.DecodeEvent(f.Event)
		if err != nil {
			return nil, fmt.Errorf("presence client: %w", err)
		}
		if f.Watch {
			w = c.watches[t.Room]
			if w != nil {
				return w.onEvent(t), nil
			}
		} else if r = c.rooms[t.Room]; r != nil {
			return r.onEvent(t), nil
		}
	case protocol.TypeEvents:
		return c.applyEvents(f, r)
	}
	return nil, nil
}

func (c *Client) applyEvents(f *protocol.Frame, r *Room) ([]func(), error) {
	if r == nil {
		return nil, nil
	}
	frame := &protocol.Events{Room: f.Room, Region: f.Region, Epoch: f.Epoch}
	var calls []func()
	for _, raw := range f.Events {
		t, err := protocol.DecodeEntry(frame, raw)
		if err != nil {
			return calls, err
		}
		calls = append(calls, r.onEvent(t)...)
	}
	return calls, nil
}

// sleep waits d, or less when ctx ends first; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

package client

import (
	"context"
	"errors"
	"time"

	"github.com/gorilla/websocket"

	"github.com/presence-dev/presence/protocol"
)

// supervise waits for each connection to end and connects again, on the
// schedule, until Close or a close that ends the client.
func (c *Client) supervise(cn *conn) {
	defer close(c.done)
	for {
		select {
		case <-cn.end:
		case <-c.quit:
			c.hangUp(cn)
			c.finish(ErrClosed)
			return
		}
		why := c.disconnected(cn)
		delay, fatal := c.afterClose(cn, why)
		if fatal != nil {
			c.finish(fatal)
			return
		}
		if cn = c.redial(time.Now(), delay); cn == nil {
			return
		}
		if c.cfg.OnReconnect != nil {
			c.cfg.OnReconnect(c.Hello())
		}
		go c.restore(cn)
	}
}

// redial connects after delay, and again on the schedule until a
// connection opens; nil when the client ended meanwhile. down is when the
// last open connection ended.
func (c *Client) redial(down time.Time, delay time.Duration) *conn {
	for {
		select {
		case <-time.After(delay):
		case <-c.quit:
			c.finish(ErrClosed)
			return nil
		}
		next, err := c.connectOnce()
		if c.ended() { // Close cut the attempt short, or came as it opened
			if next != nil {
				c.hangUp(next)
			}
			c.finish(ErrClosed)
			return nil
		}
		if err == nil {
			return next
		}
		var ce *CloseError
		if errors.As(err, &ce) && ce.Code == protocol.CloseRevoked {
			c.finish(ce)
			return nil
		}
		c.report(kindOf(err), err)
		c.mu.Lock()
		delay = c.sched.next(time.Since(down), false, c.rnd())
		c.mu.Unlock()
	}
}

// connectOnce is one connect attempt, given up when the client closes.
func (c *Client) connectOnce() (*conn, error) {
	ctx, cancel := context.WithTimeout(c.ctx, 30*time.Second)
	defer cancel()
	return c.connect(ctx)
}

func kindOf(err error) string {
	var he *HandshakeError
	var te *TokenError
	var ce *CloseError
	switch {
	case errors.As(err, &he):
		return "handshake"
	case errors.As(err, &te):
		return "token"
	case errors.As(err, &ce):
		return "close"
	}
	return "connect"
}

// hangUp closes cn with a normal close and waits a moment for the node's
// answer.
func (c *Client) hangUp(cn *conn) {
	cn.wmu.Lock()
	_ = cn.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "bye"), time.Now().Add(time.Second))
	cn.wmu.Unlock()
	select {
	case <-cn.end:
	case <-time.After(2 * time.Second):
	}
	// Closed by us: nothing to tell. cn.err is not read, as its reader
	// may not have stopped yet.
	c.forgetConn(cn)
}

// forgetConn forgets cn: its pending requests fail, rooms and watch
// lists wait for the next connection.
func (c *Client) forgetConn(cn *conn) {
	_ = cn.ws.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur != cn {
		return
	}
	c.cur = nil
	for ref, ch := range c.pending {
		ch <- result{err: ErrDisconnected}
		delete(c.pending, ref)
	}
	for _, r := range c.rooms {
		r.synced = false
	}
	for _, w := range c.watches {
		w.synced = false
	}
}

// disconnected forgets cn, whose reader has stopped (cn.end is closed),
// and returns why it ended, as told to OnDisconnect.
func (c *Client) disconnected(cn *conn) error {
	c.forgetConn(cn)
	why := cn.err
	if ce := closeErrorOf(cn.err); ce != nil {
		why = ce
	}
	if c.cfg.OnDisconnect != nil && !c.ended() {
		c.cfg.OnDisconnect(why)
	}
	return why
}

// afterClose is the wait before reconnecting after cn ended, by its close
// code (docs/PROTOCOL.md, "Close codes"), or the error that ends the
// client.
func (c *Client) afterClose(cn *conn, why error) (time.Duration, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(cn.opened) >= stableFor {
		c.sched.reset()
	}
	code := 0
	var ce *CloseError
	if errors.As(why, &ce) {
		code = ce.Code
	}
	switch code {
	case protocol.CloseSessionMoved, protocol.CloseRevoked:
		return 0, ce // a newer connection holds the session, or not before RevokedUntil
	case protocol.CloseTokenExpired:
		return 0, nil // with a fresh token, at once
	case protocol.CloseRestart, protocol.CloseGoingAway:
		return time.Duration(c.rnd() * float64(quickRetry)), nil
	case protocol.ClosePolicy:
		return policyWait + c.sched.next(0, false, c.rnd()), nil
	}
	return c.sched.next(0, false, c.rnd()), nil
}

// finish ends the client with err; rooms and watch lists end with it.
func (c *Client) finish(err error) {
	c.mu.Lock()
	c.err = err
	rooms, watches := c.rooms, c.watches
	c.rooms, c.watches = map[string]*Room{}, map[string]*Watch{}
	c.mu.Unlock()
	for _, r := range rooms {
		r.terminate(err)
	}
	for _, w := range watches {
		w.terminate(err)
	}
	if !errors.Is(err, ErrClosed) {
		c.report("", err)
	}
}

// restore joins the rooms again on a new connection, with their states,
// and sends the watch lists again.
func (c *Client) restore(cn *conn) {
	ctx, cancel := context.WithCancel(c.ctx)
	defer cancel()
	go func() {
		select {
		case <-cn.end:
		case <-ctx.Done():
		}
		cancel()
	}()
	c.mu.Lock()
	rooms := make([]*Room, 0, len(c.rooms))
	for _, r := range c.rooms {
		rooms = append(rooms, r)
	}
	watches := make([]*Watch, 0, len(c.watches))
	for _, w := range c.watches {
		watches = append(watches, w)
	}
	c.mu.Unlock()
	for _, r := range rooms {
		if err := r.join(ctx, cn); worthTelling(err) && ctx.Err() == nil {
			c.report("", err)
		}
	}
	for _, w := range watches {
		if err := w.send(ctx, cn); worthTelling(err) && ctx.Err() == nil {
			c.report("", err)
		}
	}
}

// worthTelling reports whether err from a rejoin is worth telling: not the
// connection ending again, nor a room left or a watch closed meanwhile.
func worthTelling(err error) bool {
	return err != nil && !errors.Is(err, ErrDisconnected) && !errors.Is(err, errLeft) && !errors.Is(err, errWatchClosed)
}

package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/presence-dev/presence/presence"
)

// conn is one client connection. The reader goroutine owns the fields
// marked so and makes every store call of the connection, one frame at a
// time. A writer goroutine runs only while there is something to write
// (an idle connection has none: at 15k connections a parked writer's
// stack is a quarter of the node's memory); at most one runs at a time,
// so it is the only data writer. Others only queue frames and request
// pings or a close, under mu.
//
// Kept small: at 15k connections per node every field costs.
type conn struct {
	n       *Node
	ws      *websocket.Conn
	user    string
	session string
	// expiry closes the connection when its token expires; nil in dev
	// mode. A refresh moves it.
	expiry *time.Timer

	// Reader goroutine only.
	grant   *identity // the latest token's; a refresh replaces it
	rooms   []string
	tokens  float64
	last    int64 // monotonic ns of the last refill
	strikes int32

	// keep: close without releasing sessions (drain, node close).
	keep atomic.Bool
	// wheel position, under Node.wheel.mu.
	wslot, widx int32

	mu        sync.Mutex
	queue     [][]byte
	ping      bool // a ping is requested
	awaiting  bool // a ping is out and its pong deadline set
	closeCode int  // close frame to send; set once
	closeText string
	done      bool // the reader has exited; the writer stops
	writing   bool // a writer goroutine is running
}

func (n *Node) newConn(ws *websocket.Conn, id *identity, session string) *conn {
	return &conn{
		n: n, ws: ws, user: id.user, session: session, grant: id,
		tokens: float64(n.cfg.Limits.FrameBurst), last: n.mono(),
		widx: -1,
	}
}

// armExpiry starts the token's timer. It runs once the connection is
// registered and before its reader starts, so a token that runs out at
// once cannot start a writer for a connection that is not counted.
func (c *conn) armExpiry() {
	if !c.grant.until.IsZero() {
		c.expiry = time.AfterFunc(time.Until(c.grant.until), c.expire)
	}
}

// sessionMoved closes a connection whose session another node has taken
// over: its client reconnected there. The sessions this connection still
// holds are released; the one that moved is the other node's, and the
// release leaves it alone.
func (c *conn) sessionMoved() {
	c.n.metrics.rejectedConns.WithLabelValues("moved").Inc()
	c.shutdown(CloseSessionMoved, "session moved to another connection", false)
}

// expire closes a connection whose token ran out. Its sessions are
// released, so a reconnect with a fresh token inside the grace announces
// nothing, and a user who is not let back in leaves after it.
func (c *conn) expire() {
	c.n.log.Info("node: token expired", "user", c.user, "session", c.session)
	c.shutdown(CloseTokenExpired, "token expired", false)
}

// signal starts a writer unless one is running or the reader has exited.
// The reader's WaitGroup slot is held while done is false, so the Add
// here never races a Wait that has seen zero.
func (c *conn) signal() {
	c.mu.Lock()
	start := !c.writing && !c.done
	if start {
		c.writing = true
		c.n.connWG.Add(1)
	}
	c.mu.Unlock()
	if start {
		go c.write()
	}
}

// send queues a frame. It never blocks: a client that lets SendQueue
// frames pile up is closed as a slow consumer.
func (c *conn) send(b []byte) {
	c.mu.Lock()
	if c.closeCode != 0 || c.done {
		c.mu.Unlock()
		return
	}
	if len(c.queue) >= c.n.cfg.Limits.SendQueue {
		c.queue = nil
		c.closeCode, c.closeText = CloseSlowConsumer, "slow consumer"
		c.mu.Unlock()
		c.n.log.Warn("node: closing a slow consumer", "user", c.user, "session", c.session)
		c.signal()
		return
	}
	c.queue = append(c.queue, b)
	c.mu.Unlock()
	c.signal()
}

// requestPing asks the writer for a ping; the wheel calls it.
func (c *conn) requestPing() {
	c.mu.Lock()
	c.ping = true
	c.mu.Unlock()
	c.signal()
}

// shutdown asks the writer to send a close frame and stop; frames still
// queued are dropped. The first call wins. keep leaves the sessions to
// their TTL instead of releasing them.
func (c *conn) shutdown(code int, text string, keep bool) {
	if keep {
		c.keep.Store(true)
	}
	c.mu.Lock()
	if c.closeCode == 0 {
		c.closeCode, c.closeText = code, text
		c.queue = nil
	}
	c.mu.Unlock()
	c.signal()
}

// kill drops the TCP connection; the reader then fails and cleans up.
func (c *conn) kill() { _ = c.ws.NetConn().Close() }

// write writes what is queued until nothing is, then exits. A close ends
// the connection's writing for good: writing stays set.
func (c *conn) write() {
	defer c.n.connWG.Done()
	lim := &c.n.cfg.Limits
	for {
		c.mu.Lock()
		q, ping, code, text, done := c.queue, c.ping, c.closeCode, c.closeText, c.done
		c.queue, c.ping = nil, false
		if done || (len(q) == 0 && !ping && code == 0) {
			c.writing = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		if code != 0 {
			now := time.Now()
			_ = c.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, text), now.Add(lim.WriteTimeout))
			// The reader waits for the client's answer, but not forever.
			c.mu.Lock()
			_ = c.ws.SetReadDeadline(now.Add(lim.CloseTimeout))
			c.mu.Unlock()
			c.n.metrics.closes.WithLabelValues(strconv.Itoa(code)).Inc()
			return
		}
		if ping {
			// The deadline is set by the first unanswered ping only, so
			// later pings do not push it back. The pong is read between
			// frames, and a frame may wait on the store for StoreTimeout.
			c.mu.Lock()
			if !c.awaiting && c.closeCode == 0 {
				c.awaiting = true
				_ = c.ws.SetReadDeadline(time.Now().Add(lim.PongTimeout + c.n.cfg.StoreTimeout))
			}
			c.mu.Unlock()
			if err := c.ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(lim.WriteTimeout)); err != nil {
				c.kill()
				return
			}
		}
		// On a batching connection all queued frames go out in one write.
		bc, _ := c.ws.NetConn().(*batchConn)
		if bc != nil && len(q) > 1 {
			bc.begin()
		} else {
			bc = nil
		}
		for _, f := range q {
			_ = c.ws.SetWriteDeadline(time.Now().Add(lim.WriteTimeout))
			if err := c.ws.WriteMessage(websocket.TextMessage, f); err != nil {
				if bc != nil {
					_ = bc.flush()
				}
				c.kill()
				return
			}
		}
		if bc != nil && bc.flush() != nil {
			c.kill()
			return
		}
	}
}

// onPong clears the pong deadline, unless a close is under way and the
// deadline is the close's.
func (c *conn) onPong(string) error {
	c.mu.Lock()
	if c.closeCode == 0 {
		c.awaiting = false
		_ = c.ws.SetReadDeadline(time.Time{})
	}
	c.mu.Unlock()
	return nil
}

// readLoop reads and handles frames until the connection ends, then
// cleans up.
func (c *conn) readLoop() {
	defer c.n.connWG.Done()
	c.ws.SetReadLimit(int64(c.n.cfg.Limits.MaxFrameBytes))
	c.ws.SetPongHandler(c.onPong)
	var err error
	for {
		var mt int
		var data []byte
		if mt, data, err = c.ws.ReadMessage(); err != nil {
			break
		}
		c.handle(mt, data)
	}
	c.cleanup(err)
}

// cleanup runs once, on the reader goroutine, when the connection ends.
func (c *conn) cleanup(err error) {
	n := c.n
	if c.expiry != nil {
		c.expiry.Stop()
	}
	n.wheel.remove(c)
	for _, room := range c.rooms {
		n.hub.remove(room, c)
	}
	c.mu.Lock()
	c.done, c.queue = true, nil
	c.mu.Unlock()
	c.signal()
	if errors.Is(err, websocket.ErrReadLimit) {
		// gorilla has sent 1009. Read off the rest of the oversized frame
		// before closing: closing with unread input sends a reset, which
		// may destroy the close frame before the client reads it.
		n.metrics.closes.WithLabelValues(strconv.Itoa(CloseTooBig)).Inc()
		n.metrics.rejectedFrames.WithLabelValues("too_big").Inc()
		nc := c.ws.NetConn()
		_ = nc.SetReadDeadline(time.Now().Add(n.cfg.Limits.CloseTimeout))
		var buf [512]byte
		for {
			if _, e := nc.Read(buf[:]); e != nil {
				break
			}
		}
	}
	c.kill()

	// Sessions: a drained connection keeps them for its TTL, anything else
	// (clean close, error, dead TCP, limit) releases them and the grace
	// applies.
	keep := c.keep.Load()
	for _, room := range c.rooms {
		ref := presence.SessionRef{Room: room, User: c.user, Session: c.session}
		ctx, cancel := context.WithTimeout(n.ctx, n.cfg.StoreTimeout)
		released, rerr := n.sched.unhold(ctx, ref, c, !keep)
		cancel()
		switch {
		case rerr != nil:
			n.log.Warn("node: release failed; retried until the store answers", "room", room, "user", c.user, "session", c.session, "err", rerr)
		case released:
			n.metrics.leaves.WithLabelValues("close").Inc()
		case keep:
			n.metrics.leaves.WithLabelValues("kept").Inc()
		}
	}
	c.rooms = nil
	n.open.Add(-1)
	n.active.Add(-1)
}

// handle processes one client frame. Malformed input gets an error frame
// and writes nothing; it never ends the connection.
func (c *conn) handle(mt int, data []byte) {
	if c.closing() {
		return
	}
	if !c.allow() {
		if c.strikes++; c.strikes >= int32(c.n.cfg.Limits.RateStrikes) {
			c.n.metrics.rejectedFrames.WithLabelValues(string(CodeRateLimited)).Inc()
			c.shutdown(ClosePolicy, "rate limit exceeded", false)
			return
		}
		c.reject(CodeRateLimited, fmt.Sprintf("more than %g frames per second (burst %d); frame dropped", c.n.cfg.Limits.FrameRate, c.n.cfg.Limits.FrameBurst), "")
		return
	}
	c.strikes = 0
	if mt != websocket.TextMessage {
		c.reject(CodeBadFrame, "binary frames are not part of the protocol: send JSON text frames", "")
		return
	}
	var req request
	if err := json.Unmarshal(data, &req); err != nil {
		c.reject(CodeBadFrame, "frame is not a JSON object of the protocol: "+err.Error(), "")
		return
	}
	if len(req.Ref) > maxRefLen {
		c.reject(CodeBadFrame, fmt.Sprintf("ref is longer than %d bytes", maxRefLen), "")
		return
	}
	switch req.Type {
	case typeJoin, typeLeave, typeState, typeMembers:
		if !c.n.admit() {
			c.n.metrics.rejectedFrames.WithLabelValues(string(CodeUnavailable)).Inc()
			c.send(mustJSON(errorFrame{Type: typeError, Code: CodeUnavailable, Ref: req.Ref,
				Message:      "the node is at capacity; nothing changed, retry after retry_after_ms",
				RetryAfterMS: c.n.retryAfter().Milliseconds()}))
			return
		}
		defer c.n.releaseSlot()
	}
	ctx, cancel := context.WithTimeout(c.n.ctx, c.n.cfg.StoreTimeout)
	defer cancel()
	switch req.Type {
	case typeJoin:
		c.join(ctx, req)
	case typeLeave:
		c.leave(ctx, req)
	case typeState:
		c.setState(ctx, req)
	case typePing:
		c.send(mustJSON(replyFrame{Type: typePong, Ref: req.Ref}))
	case typeRefresh:
		c.refresh(ctx, req)
	case typeMembers:
		c.members(ctx, req)
	case "":
		c.reject(CodeBadFrame, "frame has no type", req.Ref)
	default:
		c.reject(CodeUnknownType, fmt.Sprintf("unknown frame type %.40q (protocol v%d knows join, leave, state, ping, refresh, members)", req.Type, ProtocolVersion), req.Ref)
	}
}

func (c *conn) closing() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closeCode != 0
}

// allow takes a token from the connection's bucket.
func (c *conn) allow() bool {
	lim := &c.n.cfg.Limits
	now := c.n.mono()
	c.tokens = min(float64(lim.FrameBurst), c.tokens+float64(now-c.last)/1e9*lim.FrameRate)
	c.last = now
	if c.tokens < 1 {
		return false
	}
	c.tokens--
	return true
}

func (c *conn) reject(code ErrorCode, msg, ref string) {
	c.n.metrics.rejectedFrames.WithLabelValues(string(code)).Inc()
	c.send(encodeError(code, msg, ref))
}

func (c *conn) ref(room string) presence.SessionRef {
	return presence.SessionRef{Room: room, User: c.user, Session: c.session}
}

// checkRoom validates a request's room id.
func (c *conn) checkRoom(req request) bool {
	if err := presence.ValidateRoom(req.Room); err != nil {
		c.reject(CodeInvalidRoom, err.Error(), req.Ref)
		return false
	}
	return true
}

// joinedRoom returns the index of the request's room in c.rooms, or
// rejects the request: an invalid room id, or a room not joined.
func (c *conn) joinedRoom(req request) (int, bool) {
	if !c.checkRoom(req) {
		return -1, false
	}
	i := slices.Index(c.rooms, req.Room)
	if i < 0 {
		c.reject(CodeNotJoined, fmt.Sprintf("room %q is not joined", req.Room), req.Ref)
		return -1, false
	}
	return i, true
}

// join subscribes to the room's events before the snapshot is taken, so
// no transition after the snapshot is missed; joining a joined room sends
// a fresh snapshot.
func (c *conn) join(ctx context.Context, req request) {
	if !c.checkRoom(req) {
		return
	}
	room := req.Room
	if !c.grant.allowed(room) {
		c.reject(CodeForbidden, fmt.Sprintf("the token does not grant room %q", room), req.Ref)
		return
	}
	if slices.Contains(c.rooms, room) {
		if err := c.n.hub.snapshot(ctx, room, c, req.Ref); err != nil {
			c.unavailable("snapshot", err, req.Ref)
		}
		return
	}
	if len(c.rooms) >= c.n.cfg.Limits.MaxRooms {
		c.reject(CodeTooManyRooms, fmt.Sprintf("at most %d rooms per connection", c.n.cfg.Limits.MaxRooms), req.Ref)
		return
	}
	if err := c.n.hub.add(ctx, room, c); err != nil {
		c.unavailable("subscribe", err, req.Ref)
		return
	}
	ref := c.ref(room)
	if err := c.n.sched.hold(ctx, ref, c); err != nil {
		c.n.hub.remove(room, c)
		c.unavailable("join", err, req.Ref)
		return
	}
	c.rooms = append(c.rooms, room)
	if err := c.n.hub.snapshot(ctx, room, c, req.Ref); err != nil {
		// Undo the join, so that the error means what it says. The grace
		// makes a retry inside it silent.
		c.rooms = c.rooms[:len(c.rooms)-1]
		c.n.hub.remove(room, c)
		uctx, cancel := context.WithTimeout(c.n.ctx, c.n.cfg.StoreTimeout)
		_, _ = c.n.sched.unhold(uctx, ref, c, true)
		cancel()
		c.unavailable("snapshot", err, req.Ref)
		return
	}
	c.n.metrics.joins.Inc()
}

func (c *conn) leave(ctx context.Context, req request) {
	i, ok := c.joinedRoom(req)
	if !ok {
		return
	}
	c.drop(ctx, i, "leave")
	c.send(mustJSON(replyFrame{Type: typeLeft, Ref: req.Ref, Room: req.Room}))
}

// drop leaves c.rooms[i] and releases the session in it; why labels the
// leaves metric.
func (c *conn) drop(ctx context.Context, i int, why string) {
	room := c.rooms[i]
	c.rooms = slices.Delete(c.rooms, i, i+1)
	c.n.hub.remove(room, c)
	// The node no longer holds the session either way; a failed release
	// is retried until the store answers.
	if released, err := c.n.sched.unhold(ctx, c.ref(room), c, true); err != nil {
		c.n.log.Warn("node: release failed; retried until the store answers", "room", room, "user", c.user, "err", err)
	} else if released {
		c.n.metrics.leaves.WithLabelValues(why).Inc()
	}
}

func (c *conn) setState(ctx context.Context, req request) {
	if _, ok := c.joinedRoom(req); !ok {
		return
	}
	st := req.State
	switch {
	case len(st) == 0:
		c.reject(CodeInvalidState, "state is missing (send null to clear it)", req.Ref)
		return
	case len(st) > presence.MaxStateBytes:
		c.reject(CodeInvalidState, fmt.Sprintf("state is %d bytes, at most %d", len(st), presence.MaxStateBytes), req.Ref)
		return
	case !json.Valid(st):
		c.reject(CodeInvalidState, "state is not valid JSON", req.Ref)
		return
	case string(st) == "null":
		st = nil
	}
	ref := c.ref(req.Room)
	ok, err := c.n.cfg.Store.SetState(ctx, ref, st)
	if err == nil && !ok {
		// The session lapsed while held (the store was out of reach for a
		// TTL, or lost its data): bring it back and try once more.
		if err = c.n.sched.revive(ctx, ref); err == nil {
			_, err = c.n.cfg.Store.SetState(ctx, ref, st)
		}
	}
	if errors.Is(err, presence.ErrMoved) {
		// Another node holds the session now: this connection is stale.
		c.sessionMoved()
		return
	}
	if err != nil {
		c.unavailable("set state", err, req.Ref)
		return
	}
	c.send(mustJSON(replyFrame{Type: typeStateSet, Ref: req.Ref, Room: req.Room}))
}

// members sends one page of a joined room's members, from the same
// source as the room's snapshots; it changes nothing.
func (c *conn) members(ctx context.Context, req request) {
	if _, ok := c.joinedRoom(req); !ok {
		return
	}
	most := c.n.cfg.Limits.SnapshotMembers
	offset, limit := 0, most
	if req.Offset != nil {
		offset = *req.Offset
	}
	if req.Limit != nil {
		limit = *req.Limit
	}
	if offset < 0 || limit < 1 || limit > most {
		c.reject(CodeInvalidPage, fmt.Sprintf("offset must be >= 0 and limit between 1 and %d, got %d and %d", most, offset, limit), req.Ref)
		return
	}
	snap, err := c.n.hub.store.Snapshot(ctx, req.Room, offset, limit)
	if err != nil {
		c.unavailable("members", err, req.Ref)
		return
	}
	c.send(mustJSON(membersFrame{Type: typeMembers, Ref: req.Ref, Room: req.Room, Snapshot: snap}))
}

// refresh replaces the connection's token before it expires: same user,
// a later expiry, and rooms the new token no longer grants are left
// (released, grace applies) with an unasked left, reason revoked.
func (c *conn) refresh(ctx context.Context, req request) {
	if c.expiry == nil {
		// Dev mode checks no tokens; a client written for production
		// still gets the reply it waits for.
		c.send(mustJSON(refreshedFrame{Type: typeRefreshed, Ref: req.Ref}))
		return
	}
	if req.Token == "" {
		c.reject(CodeInvalidToken, "refresh needs a token", req.Ref)
		return
	}
	id, err := c.n.auth.parse(req.Token)
	if err != nil {
		c.reject(CodeInvalidToken, err.Error(), req.Ref)
		return
	}
	if id.user != c.user {
		c.reject(CodeInvalidToken, fmt.Sprintf("the token is for user %q, the connection for %q", id.user, c.user), req.Ref)
		return
	}
	if !c.expiry.Stop() {
		return // expired meanwhile: the close is under way
	}
	c.expiry.Reset(time.Until(id.until))
	c.grant = id
	for i := len(c.rooms) - 1; i >= 0; i-- {
		if room := c.rooms[i]; !id.allowed(room) {
			c.drop(ctx, i, "revoked")
			c.send(mustJSON(replyFrame{Type: typeLeft, Room: room, Reason: reasonRevoked}))
		}
	}
	until := id.until
	c.send(mustJSON(refreshedFrame{Type: typeRefreshed, Ref: req.Ref, TokenExpires: &until}))
}

func (c *conn) unavailable(op string, err error, ref string) {
	c.n.log.Warn("node: "+op+" failed", "user", c.user, "session", c.session, "err", err)
	c.n.metrics.rejectedFrames.WithLabelValues(string(CodeUnavailable)).Inc()
	c.send(mustJSON(errorFrame{Type: typeError, Code: CodeUnavailable, Ref: ref,
		Message: op + " failed; nothing changed, retry later", RetryAfterMS: c.n.retryAfter().Milliseconds()}))
}

package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gorilla/websocket"

	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
)

// The protocol's requests: join, leave, state, members, refresh (and
// ping), one frame at a time on the reader goroutine. Their I/O is in
// conn_io.go.

// handle processes one client frame. Malformed input gets an error frame
// and writes nothing; it never ends the connection.
func (c *conn) handle(mt int, data []byte) {
	req, ok := c.request(mt, data)
	if !ok {
		return
	}
	switch req.Type {
	case protocol.TypeJoin, protocol.TypeLeave, protocol.TypeState, protocol.TypeMembers, protocol.TypeWatch:
		if !c.admitRequest(req) {
			return
		}
		defer c.d.admission.release()
	}
	ctx, cancel := context.WithTimeout(c.d.ctx, c.d.storeTimeout)
	defer cancel()
	switch req.Type {
	case protocol.TypeJoin:
		c.join(ctx, req)
	case protocol.TypeLeave:
		c.leave(ctx, req)
	case protocol.TypeState:
		c.setState(ctx, req)
	case protocol.TypePing:
		c.send(mustJSON(protocol.Reply{Type: protocol.TypePong, Ref: req.Ref}))
	case protocol.TypeRefresh:
		c.refresh(ctx, req)
	case protocol.TypeMembers:
		c.members(ctx, req)
	case protocol.TypeWatch:
		c.watch(ctx, req)
	case "":
		c.reject(protocol.CodeBadFrame, "frame has no type", req.Ref)
	default:
		c.reject(protocol.CodeUnknownType, fmt.Sprintf("unknown frame type %.40q (protocol v%d knows join, leave, state, ping, refresh, members, watch)", req.Type, protocol.Version), req.Ref)
	}
}

// request decodes a client frame within the rate limit; false: it was
// refused (answered, or the connection closed).
func (c *conn) request(mt int, data []byte) (protocol.Request, bool) {
	var req protocol.Request
	if c.closing() {
		return req, false
	}
	if !c.allow() {
		if c.strikes.refuse(c.d.mono(), c.d.lim.RateStrikes, c.d.lim.RateWindow) {
			// The close frame says why: error frames queued before it
			// are dropped with the close.
			c.d.metrics.rejectedFrames.WithLabelValues(string(protocol.CodeRateLimited)).Inc()
			c.shutdown(protocol.ClosePolicy, policyReason(&c.d.lim), false)
			return req, false
		}
		c.reject(protocol.CodeRateLimited, fmt.Sprintf("more than %g frames per second (burst %d); frame dropped; %d refused within %v close the connection (1008)",
			c.d.lim.FrameRate, c.d.lim.FrameBurst, c.d.lim.RateStrikes, c.d.lim.RateWindow), "")
		return req, false
	}
	if mt != websocket.TextMessage {
		c.reject(protocol.CodeBadFrame, "binary frames are not part of the protocol: send JSON text frames", "")
		return req, false
	}
	if err := json.Unmarshal(data, &req); err != nil {
		c.reject(protocol.CodeBadFrame, "frame is not a JSON object of the protocol: "+err.Error(), "")
		return req, false
	}
	if len(req.Ref) > protocol.MaxRefLen {
		c.reject(protocol.CodeBadFrame, fmt.Sprintf("ref is longer than %d bytes", protocol.MaxRefLen), "")
		return req, false
	}
	return req, true
}

// admitRequest takes an admission slot for a request that waits on the
// store, or refuses it (a join through the storm gate); the caller gives
// the slot back.
func (c *conn) admitRequest(req protocol.Request) bool {
	if c.d.admission.admit() {
		return true
	}
	if req.Type == protocol.TypeJoin {
		c.refuseJoin(req, c.d.joins.Refused(c.ref(req.Room)), "the node is at capacity")
		return false
	}
	c.d.metrics.rejectedFrames.WithLabelValues(string(protocol.CodeUnavailable)).Inc()
	c.send(mustJSON(protocol.Error{Type: protocol.TypeError, Code: protocol.CodeUnavailable, Ref: req.Ref,
		Message:      "the node is at capacity; nothing changed, retry after retry_after_ms",
		RetryAfterMS: c.d.admission.retryAfter().Milliseconds()}))
	return false
}

func (c *conn) closing() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closeCode != 0
}

// allow takes a token from the connection's bucket.
func (c *conn) allow() bool {
	lim := &c.d.lim
	now := c.d.mono()
	c.tokens = min(float64(lim.FrameBurst), c.tokens+float64(now-c.last)/1e9*lim.FrameRate)
	c.last = now
	if c.tokens < 1 {
		return false
	}
	c.tokens--
	return true
}

func (c *conn) reject(code protocol.ErrorCode, msg, ref string) {
	c.d.metrics.rejectedFrames.WithLabelValues(string(code)).Inc()
	c.send(encodeError(code, msg, ref))
}

// checkRoom validates a request's room id.
func (c *conn) checkRoom(req protocol.Request) bool {
	if err := presence.ValidateRoom(req.Room); err != nil {
		c.reject(protocol.CodeInvalidRoom, err.Error(), req.Ref)
		return false
	}
	return true
}

// joinedRoom returns the index of the request's room in c.rooms, or
// rejects the request: an invalid room id, or a room not joined.
func (c *conn) joinedRoom(req protocol.Request) (int, bool) {
	if !c.checkRoom(req) {
		return -1, false
	}
	i := slices.Index(c.rooms, req.Room)
	if i < 0 {
		c.reject(protocol.CodeNotJoined, fmt.Sprintf("room %q is not joined", req.Room), req.Ref)
		return -1, false
	}
	return i, true
}

// join subscribes to the room's events before the snapshot is taken, so
// no transition after the snapshot is missed; joining a joined room sends
// a fresh snapshot.
func (c *conn) join(ctx context.Context, req protocol.Request) {
	room := req.Room
	in, present, ok := c.joinAllowed(req)
	if !ok {
		return
	}
	joined, following := slices.Contains(c.rooms, room), slices.Contains(c.follows, room)
	if joined || following {
		if joined != present {
			c.reject(protocol.CodeInvalidView, fmt.Sprintf("room %q is joined with present %t; leave it first to change that", room, joined), req.Ref)
			return
		}
		if err := c.d.rooms.snapshot(ctx, room, c, req.Ref, in); err != nil {
			c.unavailable("snapshot", err, req.Ref)
		}
		return
	}
	if len(c.rooms)+len(c.follows) >= c.d.lim.MaxRooms {
		c.reject(protocol.CodeTooManyRooms, fmt.Sprintf("at most %d rooms per connection", c.d.lim.MaxRooms), req.Ref)
		return
	}
	if present && !c.admitJoin(req) {
		return
	}
	if err := c.d.rooms.add(ctx, room, c, in); err != nil {
		c.unavailable("subscribe", err, req.Ref)
		return
	}
	if present {
		c.joinPresent(ctx, req, in)
		return
	}
	c.follows = append(c.follows, room)
	if err := c.d.rooms.snapshot(ctx, room, c, req.Ref, in); err != nil {
		c.follows = c.follows[:len(c.follows)-1]
		c.d.rooms.remove(room, c)
		c.unavailable("snapshot", err, req.Ref)
		return
	}
	c.d.joined()
}

// joinAllowed checks a join's room, view, grant and revocations, and
// returns its interest and whether it is with presence; false: it was
// refused.
func (c *conn) joinAllowed(req protocol.Request) (interest, bool, bool) {
	if !c.checkRoom(req) {
		return interest{}, false, false
	}
	room := req.Room
	in, ok := c.interestOf(req)
	if !ok {
		return in, false, false
	}
	present := req.Present == nil || *req.Present
	if !c.grant.allowed(room) {
		c.reject(protocol.CodeForbidden, fmt.Sprintf("the token does not grant room %q", room), req.Ref)
		return in, present, false
	}
	if until, revoked := c.d.revoked.join(c.user, room); revoked {
		c.reject(protocol.CodeRevoked, fmt.Sprintf("revoked from room %q until %s", room, until.UTC().Format(time.RFC3339)), req.Ref)
		return in, present, false
	}
	if !present && !c.grant.observe {
		c.reject(protocol.CodeForbidden, `joining without presence ("present":false) needs the token's observe claim`, req.Ref)
		return in, present, false
	}
	return in, present, true
}

// joinPresent claims the session of a join with presence, c already a
// member of the room, then sends the snapshot; a failure undoes both.
func (c *conn) joinPresent(ctx context.Context, req protocol.Request, in interest) {
	room := req.Room
	ref := c.ref(room)
	began := time.Now()
	err := c.d.sessions.hold(ctx, ref, c)
	c.d.metrics.claim.Observe(time.Since(began).Seconds())
	if err != nil {
		c.d.rooms.remove(room, c)
		c.d.log.Warn("node: join failed", "user", c.user, "session", c.session, "err", err)
		c.refuseJoin(req, c.d.joins.Refused(ref), "join failed")
		return
	}
	c.rooms = append(c.rooms, room)
	if err := c.d.rooms.snapshot(ctx, room, c, req.Ref, in); err != nil {
		// Undo the join, so that the error means what it says. The grace
		// makes a retry inside it silent.
		c.rooms = c.rooms[:len(c.rooms)-1]
		c.d.rooms.remove(room, c)
		uctx, cancel := context.WithTimeout(c.d.ctx, c.d.storeTimeout)
		_, _ = c.d.sessions.unhold(uctx, ref, c, true)
		cancel()
		c.unavailable("snapshot", err, req.Ref)
		return
	}
	c.d.joined()
}

// interestOf reads a join's detail, view and batch, or rejects the join.
func (c *conn) interestOf(req protocol.Request) (interest, bool) {
	d, ok := c.detailOf(req)
	if !ok {
		return interest{}, false
	}
	in := interest{detail: d, batch: req.Batch}
	switch req.View {
	case "", protocol.ViewMembers:
	case protocol.ViewCount:
		if req.Detail != "" {
			c.reject(protocol.CodeInvalidView, `detail applies to the members view; a count view has none`, req.Ref)
			return interest{}, false
		}
		in.count = true
	default:
		c.reject(protocol.CodeInvalidView, fmt.Sprintf("view must be %q, %q or absent, got %.40q", protocol.ViewMembers, protocol.ViewCount, req.View), req.Ref)
		return interest{}, false
	}
	return in, true
}

// detailOf reads a join's detail, or rejects the join.
func (c *conn) detailOf(req protocol.Request) (detail, bool) {
	switch {
	case req.Detail == "":
		return detailStates, true
	case req.Detail != protocol.DetailSessions:
		c.reject(protocol.CodeInvalidDetail, fmt.Sprintf("detail must be %q or absent, got %q", protocol.DetailSessions, req.Detail), req.Ref)
		return 0, false
	case c.d.global:
		c.reject(protocol.CodeInvalidDetail, "the global view does not keep session lists; join without detail", req.Ref)
		return 0, false
	}
	return detailSessions, true
}

func (c *conn) leave(ctx context.Context, req protocol.Request) {
	if i := slices.Index(c.follows, req.Room); i >= 0 {
		c.follows = slices.Delete(c.follows, i, i+1)
		c.d.rooms.remove(req.Room, c)
		c.send(mustJSON(protocol.Reply{Type: protocol.TypeLeft, Ref: req.Ref, Room: req.Room}))
		return
	}
	i, ok := c.joinedRoom(req)
	if !ok {
		return
	}
	c.drop(ctx, i, "leave")
	c.send(mustJSON(protocol.Reply{Type: protocol.TypeLeft, Ref: req.Ref, Room: req.Room}))
}

// drop leaves c.rooms[i] and releases the session in it; why labels the
// leaves metric.
func (c *conn) drop(ctx context.Context, i int, why string) {
	room := c.rooms[i]
	c.rooms = slices.Delete(c.rooms, i, i+1)
	c.d.rooms.remove(room, c)
	// The node no longer holds the session either way; a failed release
	// is retried until the store answers.
	if released, err := c.d.sessions.unhold(ctx, c.ref(room), c, true); err != nil {
		c.d.log.Warn("node: release failed; retried until the store answers", "room", room, "user", c.user, "err", err)
	} else if released {
		c.d.metrics.leaves.WithLabelValues(why).Inc()
	}
}

func (c *conn) setState(ctx context.Context, req protocol.Request) {
	if slices.Contains(c.follows, req.Room) {
		c.reject(protocol.CodeNotJoined, fmt.Sprintf("room %q is joined without presence: there is no session to set a state on", req.Room), req.Ref)
		return
	}
	if _, ok := c.joinedRoom(req); !ok {
		return
	}
	st := req.State
	switch {
	case len(st) == 0:
		c.reject(protocol.CodeInvalidState, "state is missing (send null to clear it)", req.Ref)
		return
	case len(st) > presence.MaxStateBytes:
		c.reject(protocol.CodeInvalidState, fmt.Sprintf("state is %d bytes, at most %d", len(st), presence.MaxStateBytes), req.Ref)
		return
	case !json.Valid(st):
		c.reject(protocol.CodeInvalidState, "state is not valid JSON", req.Ref)
		return
	case string(st) == "null":
		st = nil
	}
	// State writes go through the session keeper, which brings back a
	// session that lapsed while held.
	err := c.d.sessions.setState(ctx, c.ref(req.Room), st)
	if errors.Is(err, presence.ErrMoved) {
		// Another node holds the session now: this connection is stale.
		c.sessionMoved()
		return
	}
	if err != nil {
		c.unavailable("set state", err, req.Ref)
		return
	}
	c.send(mustJSON(protocol.Reply{Type: protocol.TypeStateSet, Ref: req.Ref, Room: req.Room}))
}

// members sends one page of a joined room's members, from the same
// source as the room's snapshots; it changes nothing.
func (c *conn) members(ctx context.Context, req protocol.Request) {
	if !slices.Contains(c.follows, req.Room) {
		if _, ok := c.joinedRoom(req); !ok {
			return
		}
	}
	most := c.d.lim.SnapshotMembers
	offset, limit := 0, most
	if req.Offset != nil {
		offset = *req.Offset
	}
	if req.Limit != nil {
		limit = *req.Limit
	}
	if offset < 0 || limit < 1 || limit > most {
		c.reject(protocol.CodeInvalidPage, fmt.Sprintf("offset must be >= 0 and limit between 1 and %d, got %d and %d", most, offset, limit), req.Ref)
		return
	}
	snap, err := c.d.rooms.page(ctx, req.Room, c, offset, limit)
	if err != nil {
		c.unavailable("members", err, req.Ref)
		return
	}
	c.send(mustJSON(protocol.Members{Type: protocol.TypeMembers, Ref: req.Ref, Room: req.Room, Snapshot: snap}))
}

// refresh replaces the connection's token before it expires: same user,
// a later expiry, and rooms the new token no longer grants are left
// (released, grace applies) with an unasked left, reason revoked.
func (c *conn) refresh(ctx context.Context, req protocol.Request) {
	if c.expiry == nil {
		// A dev connection without a token (?user=); a client written for production
		// still gets the reply it waits for.
		c.send(mustJSON(protocol.Refreshed{Type: protocol.TypeRefreshed, Ref: req.Ref}))
		return
	}
	if req.Token == "" {
		c.reject(protocol.CodeInvalidToken, "refresh needs a token", req.Ref)
		return
	}
	id, err := c.d.tokens.parse(req.Token)
	if err != nil {
		c.reject(protocol.CodeInvalidToken, err.Error(), req.Ref)
		return
	}
	if id.user != c.user {
		c.reject(protocol.CodeInvalidToken, fmt.Sprintf("the token is for user %q, the connection for %q", id.user, c.user), req.Ref)
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
			c.send(mustJSON(protocol.Reply{Type: protocol.TypeLeft, Room: room, Reason: protocol.ReasonRevoked}))
		}
	}
	for i := len(c.follows) - 1; i >= 0; i-- {
		if room := c.follows[i]; !id.allowed(room) || !id.observe {
			c.follows = slices.Delete(c.follows, i, i+1)
			c.d.rooms.remove(room, c)
			c.send(mustJSON(protocol.Reply{Type: protocol.TypeLeft, Room: room, Reason: protocol.ReasonRevoked}))
		}
	}
	for i := len(c.watches) - 1; i >= 0; i-- {
		if room := c.watches[i]; !id.allowed(room) {
			c.watches = slices.Delete(c.watches, i, i+1)
			c.d.watches.unwatch(room, c)
			c.send(encodeWatching("", protocol.ReasonRevoked, room, []string{}, nil))
		}
	}
	until := id.until
	c.send(mustJSON(protocol.Refreshed{Type: protocol.TypeRefreshed, Ref: req.Ref, TokenExpires: &until}))
}

// watch replaces the connection's watch list of a room; an empty list
// ends it. Bad input changes nothing.
func (c *conn) watch(ctx context.Context, req protocol.Request) {
	if !c.checkRoom(req) {
		return
	}
	room, lim := req.Room, &c.d.lim
	if req.Users == nil {
		c.reject(protocol.CodeInvalidWatch, "watch needs users: an array of user ids ([] ends the watch)", req.Ref)
		return
	}
	users := *req.Users
	if len(users) > lim.MaxWatchUsers {
		c.reject(protocol.CodeInvalidWatch, fmt.Sprintf("%d users, at most %d per watch", len(users), lim.MaxWatchUsers), req.Ref)
		return
	}
	seen := make(map[string]struct{}, len(users))
	for _, u := range users {
		if err := presence.ValidateUser(u); err != nil {
			c.reject(protocol.CodeInvalidWatch, fmt.Sprintf("users: %v", err), req.Ref)
			return
		}
		if _, dup := seen[u]; dup {
			c.reject(protocol.CodeInvalidWatch, fmt.Sprintf("users: %q is listed twice", u), req.Ref)
			return
		}
		seen[u] = struct{}{}
	}
	if c.d.global {
		c.reject(protocol.CodeInvalidWatch, "watch lists are not offered on a node serving the global view", req.Ref)
		return
	}
	if !c.grant.allowed(room) {
		c.reject(protocol.CodeForbidden, fmt.Sprintf("the token does not grant room %q", room), req.Ref)
		return
	}
	i := slices.Index(c.watches, room)
	if len(users) > 0 && i < 0 && len(c.watches) >= lim.MaxWatches {
		c.reject(protocol.CodeTooManyRooms, fmt.Sprintf("at most %d watched rooms per connection", lim.MaxWatches), req.Ref)
		return
	}
	err := c.d.watches.watchUsers(ctx, room, c, req.Ref, users)
	switch {
	case (err != nil || len(users) == 0) && i >= 0:
		c.watches = slices.Delete(c.watches, i, i+1)
	case err == nil && len(users) > 0 && i < 0:
		c.watches = append(c.watches, room)
	}
	if err != nil {
		c.unavailable("watch", err, req.Ref)
	}
}

func (c *conn) unavailable(op string, err error, ref string) {
	c.d.log.Warn("node: "+op+" failed", "user", c.user, "session", c.session, "err", err)
	c.d.metrics.rejectedFrames.WithLabelValues(string(protocol.CodeUnavailable)).Inc()
	c.send(mustJSON(protocol.Error{Type: protocol.TypeError, Code: protocol.CodeUnavailable, Ref: ref,
		Message: op + " failed; nothing changed, retry later", RetryAfterMS: c.d.admission.retryAfter().Milliseconds()}))
}

package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/presence-dev/presence/presence"
)

// Query answers presence queries for one view: a region's, or with
// GlobalRegion the cross-region one. It is the one implementation of each
// answer (validation, limits, the read, the reply's shape and its error
// codes): the micro service (StartService) and the HTTP API (package
// httpapi) only map their transport onto it. Errors are *QueryError.
type Query struct {
	region string
	r      Reader
	serviceOpts
}

// NewQuery returns the queries of region's view (or of GlobalRegion's),
// read from r. WithRequestTimeout bounds each answer's reads, WithLogger
// is where backend errors go.
func NewQuery(region string, r Reader, opts ...ServiceOption) (*Query, error) {
	if r == nil {
		return nil, errors.New("bus: query: a reader is required")
	}
	if region != GlobalRegion {
		if err := ValidateRegion(region); err != nil {
			return nil, fmt.Errorf("bus: query: %w", err)
		}
	}
	o := serviceOpts{timeout: DefaultRequestTimeout, log: slog.Default()}
	for _, f := range opts {
		f(&o)
	}
	return &Query{region: region, r: r, serviceOpts: o}, nil
}

// Region is the view's region token.
func (q *Query) Region() string { return q.region }

// answer runs one query: its reads bounded by the request timeout, a
// panic in the backend turned into a 500.
func answer[Req, Rep any](o *serviceOpts, ctx context.Context, op string, req Req, fn func(context.Context, Req) (Rep, *QueryError)) (rep Rep, err error) {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	defer func() {
		if p := recover(); p != nil {
			o.log.Error("presence: query panicked", "op", op, "panic", p)
			var zero Rep
			rep, err = zero, &QueryError{Code: CodeInternal, Description: "internal error"}
		}
	}()
	rep, qe := fn(ctx, req)
	if qe != nil {
		return rep, qe
	}
	return rep, nil
}

func badRequest(format string, a ...any) *QueryError {
	return &QueryError{Code: CodeBadRequest, Description: fmt.Sprintf(format, a...)}
}

// idErrors is a 400 naming every invalid id of err, on one line.
func idErrors(err error) *QueryError {
	return badRequest("%s", strings.ReplaceAll(err.Error(), "\n", "; "))
}

// backend turns a Reader error into a 500, logging the detail.
func (q *Query) backend(ctx context.Context, op string, err error) *QueryError {
	return backendError(&q.serviceOpts, ctx, q.region, op, err)
}

// backendError is a 500 for a backend's err; the detail is logged, not
// sent.
func backendError(o *serviceOpts, ctx context.Context, region, op string, err error) *QueryError {
	o.log.Error("presence: query failed", "region", region, "op", op, "err", err)
	if errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
		return &QueryError{Code: CodeInternal, Description: fmt.Sprintf("%s: backend timed out after %v", op, o.timeout)}
	}
	return &QueryError{Code: CodeInternal, Description: op + ": backend error"}
}

// Members returns one page of a room's members, a snapshot: offset 0 or
// more, limit 1 to MaxLimit (0 means DefaultLimit).
func (q *Query) Members(ctx context.Context, req MembersRequest) (presence.Snapshot, error) {
	return answer(&q.serviceOpts, ctx, EndpointMembers, req, q.members)
}

func (q *Query) members(ctx context.Context, req MembersRequest) (presence.Snapshot, *QueryError) {
	if err := presence.ValidateRoom(req.Room); err != nil {
		return presence.Snapshot{}, badRequest("%v", err)
	}
	if req.Offset < 0 {
		return presence.Snapshot{}, badRequest("offset must be >= 0, got %d", req.Offset)
	}
	if req.Limit == 0 {
		req.Limit = DefaultLimit
	}
	if req.Limit < 0 || req.Limit > MaxLimit {
		return presence.Snapshot{}, badRequest("limit must be between 1 and %d, got %d", MaxLimit, req.Limit)
	}
	snap, err := q.r.Snapshot(ctx, req.Room, req.Offset, req.Limit)
	if err != nil {
		return presence.Snapshot{}, q.backend(ctx, "members", err)
	}
	snap.At = snap.At.UTC()
	if snap.Members == nil {
		snap.Members = []presence.Member{}
	}
	for i := range snap.Members {
		utcMember(&snap.Members[i])
	}
	return snap, nil
}

// Count returns a room's number of members.
func (q *Query) Count(ctx context.Context, req CountRequest) (CountReply, error) {
	return answer(&q.serviceOpts, ctx, EndpointCount, req, q.count)
}

func (q *Query) count(ctx context.Context, req CountRequest) (CountReply, *QueryError) {
	if err := presence.ValidateRoom(req.Room); err != nil {
		return CountReply{}, badRequest("%v", err)
	}
	n, err := q.r.Count(ctx, req.Room)
	if err != nil {
		return CountReply{}, q.backend(ctx, "count", err)
	}
	return CountReply{Region: q.region, Room: req.Room, Count: n}, nil
}

// User returns one user's presence in a room, with their last seen.
func (q *Query) User(ctx context.Context, req UserRequest) (UserReply, error) {
	return answer(&q.serviceOpts, ctx, EndpointUser, req, q.user)
}

func (q *Query) user(ctx context.Context, req UserRequest) (UserReply, *QueryError) {
	if err := errors.Join(presence.ValidateRoom(req.Room), presence.ValidateUser(req.User)); err != nil {
		return UserReply{}, idErrors(err)
	}
	m, ok, err := q.r.Sessions(ctx, req.Room, req.User)
	if err != nil {
		return UserReply{}, q.backend(ctx, "user", err)
	}
	seen, qe := q.lastSeen(ctx, req.User)
	if qe != nil {
		return UserReply{}, qe
	}
	rep := UserReply{Region: q.region, Room: req.Room, User: req.User, Online: ok, LastSeen: seen}
	if rl, isGlobal := q.r.(RegionLister); isGlobal {
		rep.Regions = rl.Regions(req.Room, req.User)
	}
	if ok {
		utcMember(&m)
		rep.Member = &m
	}
	return rep, nil
}

// LastSeen returns when a user was last active in the view, in any room.
func (q *Query) LastSeen(ctx context.Context, req LastSeenRequest) (LastSeenReply, error) {
	return answer(&q.serviceOpts, ctx, EndpointLastSeen, req, func(ctx context.Context, req LastSeenRequest) (LastSeenReply, *QueryError) {
		if err := presence.ValidateUser(req.User); err != nil {
			return LastSeenReply{}, badRequest("%v", err)
		}
		seen, qe := q.lastSeen(ctx, req.User)
		if qe != nil {
			return LastSeenReply{}, qe
		}
		return LastSeenReply{Region: q.region, User: req.User, LastSeen: seen}, nil
	})
}

// lastSeen reads a valid user's last seen, nil if none was recorded.
func (q *Query) lastSeen(ctx context.Context, user string) (*time.Time, *QueryError) {
	seen, ok, err := q.r.LastSeen(ctx, user)
	if err != nil {
		return nil, q.backend(ctx, "last seen", err)
	}
	if !ok {
		return nil, nil
	}
	seen = seen.UTC()
	return &seen, nil
}

// Rooms returns one page of the view's rooms with members, ordered by
// id, with their counts: those whose id starts with Prefix, after Cursor
// (the NextCursor of the page before), at most Limit (1 to MaxLimit, 0
// means DefaultLimit).
func (q *Query) Rooms(ctx context.Context, req RoomsRequest) (RoomsReply, error) {
	return answer(&q.serviceOpts, ctx, EndpointRooms, req, q.rooms)
}

func (q *Query) rooms(ctx context.Context, req RoomsRequest) (RoomsReply, *QueryError) {
	var err error
	if req.Prefix != "" {
		err = presence.ValidateRoom(req.Prefix)
	}
	if req.Cursor != "" {
		err = errors.Join(err, presence.ValidateRoom(req.Cursor))
	}
	if err != nil {
		return RoomsReply{}, badRequest("prefix and cursor must be empty or room ids: %s", strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	if req.Limit == 0 {
		req.Limit = DefaultLimit
	}
	if req.Limit < 0 || req.Limit > MaxLimit {
		return RoomsReply{}, badRequest("limit must be between 1 and %d, got %d", MaxLimit, req.Limit)
	}
	rooms, next, rerr := q.r.ListRooms(ctx, req.Prefix, req.Cursor, req.Limit)
	if rerr != nil {
		return RoomsReply{}, q.backend(ctx, "rooms", rerr)
	}
	if rooms == nil {
		rooms = []presence.RoomCount{}
	}
	return RoomsReply{Region: q.region, Rooms: rooms, NextCursor: next}, nil
}

// Counts returns the counts of 1 to MaxBatchRooms rooms, in the order
// asked. An invalid room id fails the whole request.
func (q *Query) Counts(ctx context.Context, req CountsRequest) (CountsReply, error) {
	return answer(&q.serviceOpts, ctx, EndpointCounts, req, q.counts)
}

func (q *Query) counts(ctx context.Context, req CountsRequest) (CountsReply, *QueryError) {
	if len(req.Rooms) == 0 || len(req.Rooms) > MaxBatchRooms {
		return CountsReply{}, badRequest("rooms must hold 1 to %d room ids, got %d", MaxBatchRooms, len(req.Rooms))
	}
	for i, room := range req.Rooms {
		if err := presence.ValidateRoom(room); err != nil {
			return CountsReply{}, badRequest("rooms[%d]: %v", i, err)
		}
	}
	ns, err := q.r.Counts(ctx, req.Rooms)
	if err != nil {
		return CountsReply{}, q.backend(ctx, "counts", err)
	}
	if len(ns) != len(req.Rooms) {
		return CountsReply{}, q.backend(ctx, "counts", fmt.Errorf("%d counts for %d rooms", len(ns), len(req.Rooms)))
	}
	out := CountsReply{Region: q.region, Rooms: make([]presence.RoomCount, len(ns))}
	for i, n := range ns {
		out.Rooms[i] = presence.RoomCount{Room: req.Rooms[i], Count: n}
	}
	return out, nil
}

// utcMember makes a member's times UTC, so replies do not depend on the
// server's time zone, and its sessions a list, never null.
func utcMember(m *presence.Member) {
	m.Until = m.Until.UTC()
	if m.Sessions == nil {
		m.Sessions = []presence.SessionInfo{}
	}
	for i := range m.Sessions {
		m.Sessions[i].Expires = m.Sessions[i].Expires.UTC()
	}
}

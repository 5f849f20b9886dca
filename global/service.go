package global

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/presence"
)

// UserReply answers a bus.UserRequest on presence-api.global.user: the
// regional reply's fields (region "global", last_seen always null) plus
// the regions currently listing the user.
type UserReply struct {
	bus.UserReply
	Regions []string `json:"regions"`
}

// Snapshot returns one page of a room's global members, ordered by user
// id: the users whose last global transition is online. Each member's
// sessions are the union of their session ids over the regions not
// dropped (no expiry: regions do not publish it); a member with none is
// inside the global grace. Until is the earliest moment the member could
// be announced offline. RoomSeq and Epoch are the room's last global
// transition, StreamSeq its position in the global stream.
func (a *Aggregator) Snapshot(_ context.Context, room string, offset, limit int) (presence.Snapshot, error) {
	snap := presence.Snapshot{Region: bus.GlobalRegion, Room: room, Offset: offset, Members: []presence.Member{}}
	if err := presence.ValidateRoom(room); err != nil {
		return snap, err
	}
	if offset < 0 || limit <= 0 {
		return snap, fmt.Errorf("global: snapshot: offset must be >= 0 and limit > 0, got %d and %d", offset, limit)
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	now := time.Now()
	snap.At = now
	r := a.c.ann.rooms[room]
	if r == nil {
		return snap, nil
	}
	snap.Total, snap.RoomSeq, snap.Epoch, snap.StreamSeq = len(r.members), r.seq, r.epoch, r.last
	users := sortedKeys(r.members)
	for _, u := range users[min(offset, len(users)):min(offset+limit, len(users))] {
		snap.Members = append(snap.Members, a.memberLocked(room, u, now))
	}
	return snap, nil
}

// memberLocked builds a member of the global view. a.mu is held.
func (a *Aggregator) memberLocked(room, user string, now time.Time) presence.Member {
	m := presence.Member{User: user, Until: now.Add(a.cfg.Grace).UTC(), Sessions: []presence.SessionInfo{}}
	if d := a.c.dec[room][user]; d != nil && !d.since.IsZero() {
		m.Until = d.since.Add(a.cfg.Grace).UTC()
	}
	for _, s := range a.c.sessions(room, user) {
		m.Sessions = append(m.Sessions, presence.SessionInfo{ID: s})
	}
	return m
}

// Count returns the number of global members of a room.
func (a *Aggregator) Count(_ context.Context, room string) (int, error) {
	if err := presence.ValidateRoom(room); err != nil {
		return 0, err
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	if r := a.c.ann.rooms[room]; r != nil {
		return len(r.members), nil
	}
	return 0, nil
}

// Sessions returns one user's global presence in a room; ok is false
// when the user is not a global member.
func (a *Aggregator) Sessions(_ context.Context, room, user string) (presence.Member, bool, error) {
	if err := errors.Join(presence.ValidateRoom(room), presence.ValidateUser(user)); err != nil {
		return presence.Member{}, false, err
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	if !a.c.ann.member(room, user) {
		return presence.Member{User: user, Sessions: []presence.SessionInfo{}}, false, nil
	}
	return a.memberLocked(room, user, time.Now()), true, nil
}

// LastSeen is not tracked globally; it reports nothing. With Snapshot,
// Count and Sessions it makes the Aggregator a bus.Reader.
func (a *Aggregator) LastSeen(context.Context, string) (time.Time, bool, error) {
	return time.Time{}, false, nil
}

// Regions returns the user's regions in a room, sorted.
func (a *Aggregator) Regions(room, user string) []string {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.c.regionsOf(room, user)
}

// Union returns a room's users with their session ids over every region
// not dropped, whether announced yet or not: the aggregator's merge of
// the regional truths.
func (a *Aggregator) Union(room string) map[string][]string {
	a.mu.RLock()
	defer a.mu.RUnlock()
	users := map[string]struct{}{}
	for _, r := range a.c.regions {
		if !r.dropped {
			for u := range r.rooms[room] {
				users[u] = struct{}{}
			}
		}
	}
	out := make(map[string][]string, len(users))
	for u := range users {
		out[u] = a.c.sessions(room, u)
	}
	return out
}

// RegionStatus is what an aggregator knows of one region.
type RegionStatus struct {
	Region string
	State  RegionState
	Gen    uint64
	Seq    uint64
	Heard  time.Time // last publication applied; zero if never
}

// RegionStatuses returns every region the aggregator knows, sorted.
func (a *Aggregator) RegionStatuses() []RegionStatus {
	a.mu.RLock()
	defer a.mu.RUnlock()
	now := time.Now()
	var out []RegionStatus
	for _, name := range sortedKeys(a.c.regions) {
		r := a.c.regions[name]
		out = append(out, RegionStatus{Region: name, State: a.c.state(r, now), Gen: r.gen, Seq: r.seq, Heard: r.heard})
	}
	return out
}

// startService adds the global query service: micro service
// bus.ServiceName with metadata region=global and endpoints members,
// count and user on presence-api.global.<endpoint>, with the request and
// reply shapes of the regional service. Every aggregator serves them in
// one queue group.
func startService(nc *nats.Conn, a *Aggregator) (micro.Service, error) {
	svc, err := micro.AddService(nc, micro.Config{
		Name:        bus.ServiceName,
		Version:     bus.Version,
		Description: "presence queries for the global view",
		Metadata:    map[string]string{"region": bus.GlobalRegion},
	})
	if err != nil {
		return nil, fmt.Errorf("global: service: %w", err)
	}
	for _, ep := range []struct {
		name string
		fn   func([]byte) (any, *apiError)
	}{
		{bus.EndpointMembers, a.handleMembers},
		{bus.EndpointCount, a.handleCount},
		{bus.EndpointUser, a.handleUser},
	} {
		err := svc.AddEndpoint(ep.name, wrap(ep.fn),
			micro.WithEndpointSubject(bus.APISubject(bus.GlobalRegion, ep.name)),
			micro.WithEndpointMetadata(map[string]string{"region": bus.GlobalRegion}))
		if err != nil {
			_ = svc.Stop()
			return nil, fmt.Errorf("global: service: endpoint %s: %w", ep.name, err)
		}
	}
	return svc, nil
}

type apiError struct{ code, desc string }

func badRequest(format string, a ...any) *apiError {
	return &apiError{bus.CodeBadRequest, fmt.Sprintf(format, a...)}
}

func wrap(fn func([]byte) (any, *apiError)) micro.HandlerFunc {
	return func(req micro.Request) {
		out, aerr := fn(req.Data())
		if aerr == nil {
			if body, err := json.Marshal(out); err == nil {
				_ = req.Respond(body)
				return
			}
			aerr = &apiError{bus.CodeInternal, "internal error: reply not encodable"}
		}
		desc := strings.NewReplacer("\r", " ", "\n", "; ").Replace(aerr.desc)
		body, _ := json.Marshal(bus.ErrorReply{Code: aerr.code, Error: desc})
		_ = req.Error(aerr.code, desc, body)
	}
}

// decode reads exactly one JSON object with no unknown fields, as the
// regional service does.
func decode(data []byte, v any, want string) *apiError {
	if len(bytes.TrimSpace(data)) == 0 {
		return badRequest("empty request, want %s", want)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return badRequest("bad request JSON (want %s): %v", want, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return badRequest("bad request JSON (want %s): data after the object", want)
	}
	return nil
}

func (a *Aggregator) handleMembers(data []byte) (any, *apiError) {
	var q bus.MembersRequest
	if e := decode(data, &q, `{"room":"r","offset":0,"limit":100}`); e != nil {
		return nil, e
	}
	if err := presence.ValidateRoom(q.Room); err != nil {
		return nil, badRequest("%v", err)
	}
	if q.Offset < 0 {
		return nil, badRequest("offset must be >= 0, got %d", q.Offset)
	}
	if q.Limit == 0 {
		q.Limit = bus.DefaultLimit
	}
	if q.Limit < 0 || q.Limit > bus.MaxLimit {
		return nil, badRequest("limit must be between 1 and %d, got %d", bus.MaxLimit, q.Limit)
	}
	snap, _ := a.Snapshot(context.Background(), q.Room, q.Offset, q.Limit)
	snap.At = snap.At.UTC()
	return snap, nil
}

func (a *Aggregator) handleCount(data []byte) (any, *apiError) {
	var q bus.CountRequest
	if e := decode(data, &q, `{"room":"r"}`); e != nil {
		return nil, e
	}
	if err := presence.ValidateRoom(q.Room); err != nil {
		return nil, badRequest("%v", err)
	}
	n, _ := a.Count(context.Background(), q.Room)
	return bus.CountReply{Region: bus.GlobalRegion, Room: q.Room, Count: n}, nil
}

func (a *Aggregator) handleUser(data []byte) (any, *apiError) {
	var q bus.UserRequest
	if e := decode(data, &q, `{"room":"r","user":"u"}`); e != nil {
		return nil, e
	}
	if err := errors.Join(presence.ValidateRoom(q.Room), presence.ValidateUser(q.User)); err != nil {
		return nil, badRequest("%v", err)
	}
	m, ok, _ := a.Sessions(context.Background(), q.Room, q.User)
	rep := UserReply{UserReply: bus.UserReply{Region: bus.GlobalRegion, Room: q.Room, User: q.User, Online: ok}, Regions: a.Regions(q.Room, q.User)}
	if rep.Regions == nil {
		rep.Regions = []string{}
	}
	if ok {
		rep.Member = &m
	}
	return rep, nil
}

// QueryError is an error reply of the global query service.
type QueryError struct {
	Code        string // bus.CodeBadRequest or bus.CodeInternal
	Description string
}

// Error implements error.
func (e *QueryError) Error() string {
	return fmt.Sprintf("global: query: %s %s", e.Code, e.Description)
}

// Client queries the global view on presence-api.global.*: the members
// endpoint gives an edge node a room's snapshot, which it joins to
// bus.WatchRoom(nc, bus.GlobalRegion, room, fn) exactly as to a region's.
type Client struct {
	nc *nats.Conn
}

// NewClient returns a Client on nc.
func NewClient(nc *nats.Conn) *Client { return &Client{nc: nc} }

func (c *Client) request(ctx context.Context, endpoint string, req, out any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, bus.DefaultRequestTimeout)
		defer cancel()
	}
	m, err := c.nc.RequestWithContext(ctx, bus.APISubject(bus.GlobalRegion, endpoint), body)
	if err != nil {
		return fmt.Errorf("global: query %s: %w", endpoint, err)
	}
	if code := m.Header.Get(micro.ErrorCodeHeader); code != "" {
		return &QueryError{Code: code, Description: m.Header.Get(micro.ErrorHeader)}
	}
	if err := json.Unmarshal(m.Data, out); err != nil {
		return fmt.Errorf("global: query %s: reply: %w", endpoint, err)
	}
	return nil
}

// Snapshot returns one page of a room's global members (see
// Aggregator.Snapshot). It has the signature of the regional store's, so
// an edge node can use a Client where it uses a store.
func (c *Client) Snapshot(ctx context.Context, room string, offset, limit int) (presence.Snapshot, error) {
	var snap presence.Snapshot
	err := c.request(ctx, bus.EndpointMembers, bus.MembersRequest{Room: room, Offset: offset, Limit: limit}, &snap)
	return snap, err
}

// Count returns a room's number of global members.
func (c *Client) Count(ctx context.Context, room string) (int, error) {
	var rep bus.CountReply
	err := c.request(ctx, bus.EndpointCount, bus.CountRequest{Room: room}, &rep)
	return rep.Count, err
}

// User returns one user's global presence in a room.
func (c *Client) User(ctx context.Context, room, user string) (UserReply, error) {
	var rep UserReply
	err := c.request(ctx, bus.EndpointUser, bus.UserRequest{Room: room, User: user}, &rep)
	return rep, err
}

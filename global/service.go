package global

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/presence"
)

// Snapshot returns one page of a room's global members, ordered by user
// id: the users whose last global transition is online. Each member's
// sessions are the union of their session ids over the regions not
// dropped (no expiry: regions do not publish it); a member with none is
// inside the global grace. Until is the earliest moment the member could
// be announced offline. RoomSeq and Epoch are the room's last global
// transition, StreamSeq its position in the global stream.
//
// Like every query, it first makes sure the view holds everything the
// global stream held when it was called (see current): it fails, rather
// than answer from a view it cannot vouch for, while this aggregator
// cannot read the stream.
func (a *Aggregator) Snapshot(ctx context.Context, room string, offset, limit int) (presence.Snapshot, error) {
	snap := presence.Snapshot{Region: bus.GlobalRegion, Room: room, Offset: offset, Members: []presence.Member{}}
	if err := presence.ValidateRoom(room); err != nil {
		return snap, err
	}
	if offset < 0 || limit <= 0 {
		return snap, fmt.Errorf("global: snapshot: offset must be >= 0 and limit > 0, got %d and %d", offset, limit)
	}
	if err := a.current(ctx); err != nil {
		return snap, err
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
	// States are the announced ones, so a snapshot and the updates after
	// its room_seq agree.
	states := a.c.ann.states(room, user)
	for _, s := range a.c.sessions(room, user) {
		si := presence.SessionInfo{ID: s}
		if st, ok := states[s]; ok {
			si.State = json.RawMessage(st)
		}
		m.Sessions = append(m.Sessions, si)
	}
	return m
}

// Count returns the number of global members of a room.
func (a *Aggregator) Count(ctx context.Context, room string) (int, error) {
	if err := presence.ValidateRoom(room); err != nil {
		return 0, err
	}
	if err := a.current(ctx); err != nil {
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
func (a *Aggregator) Sessions(ctx context.Context, room, user string) (presence.Member, bool, error) {
	if err := errors.Join(presence.ValidateRoom(room), presence.ValidateUser(user)); err != nil {
		return presence.Member{}, false, err
	}
	if err := a.current(ctx); err != nil {
		return presence.Member{}, false, err
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	if !a.c.ann.member(room, user) {
		return presence.Member{User: user, Sessions: []presence.SessionInfo{}}, false, nil
	}
	return a.memberLocked(room, user, time.Now()), true, nil
}

// ListRooms returns a page of the global view's rooms with members,
// ordered by id, with their global counts (see bus.Reader).
func (a *Aggregator) ListRooms(ctx context.Context, prefix, after string, limit int) ([]presence.RoomCount, string, error) {
	if limit <= 0 {
		return nil, "", fmt.Errorf("global: list rooms: limit must be > 0, got %d", limit)
	}
	if err := a.current(ctx); err != nil {
		return nil, "", err
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	rooms := a.c.ann.rooms
	page, more := presence.PageOfRooms(sortedKeys(rooms), prefix, after, limit)
	out := make([]presence.RoomCount, 0, len(page))
	for _, room := range page {
		if n := len(rooms[room].members); n > 0 {
			out = append(out, presence.RoomCount{Room: room, Count: n})
		}
	}
	next := ""
	if more {
		next = page[len(page)-1]
	}
	return out, next, nil
}

// Counts returns the global counts of rooms, in their order.
func (a *Aggregator) Counts(ctx context.Context, rooms []string) ([]int, error) {
	for _, room := range rooms {
		if err := presence.ValidateRoom(room); err != nil {
			return nil, err
		}
	}
	if err := a.current(ctx); err != nil {
		return nil, err
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	out := make([]int, len(rooms))
	for i, room := range rooms {
		if r := a.c.ann.rooms[room]; r != nil {
			out[i] = len(r.members)
		}
	}
	return out, nil
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
	Region string      `json:"region"`
	State  RegionState `json:"state"`
	Gen    uint64      `json:"gen"`
	Seq    uint64      `json:"seq"`
	Heard  time.Time   `json:"heard"` // last publication applied; zero if never
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

// QueryError is an error reply of the global query service.
type QueryError = bus.QueryError

// Client queries the global view on presence-api.global.*: the members
// endpoint gives an edge node a room's snapshot, which it joins to
// bus.WatchRoom(nc, bus.GlobalRegion, room, fn) exactly as to a region's.
type Client struct{ *bus.Client }

// NewClient returns a Client on nc.
func NewClient(nc *nats.Conn) *Client { return &Client{bus.NewClient(nc, bus.GlobalRegion)} }

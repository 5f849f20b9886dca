package region

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/presence-dev/presence/presence"
)

// Snapshot returns one page of a room's live members, ordered by user id,
// with each member's live sessions and their states, and the sequences
// that join it to the event stream (see presence.Snapshot). A read needs
// no reaper: expired entries are excluded by their score. A room of more
// than 512 sessions pages its member index, so a page costs its own size,
// not the room's; offsets there also count members overdue by less than a
// reap interval, who are left off the page.
func (s *Store) Snapshot(ctx context.Context, room string, offset, limit int) (presence.Snapshot, error) {
	snap := presence.Snapshot{Region: s.opt.Region, Room: room, Offset: offset}
	if err := presence.ValidateRoom(room); err != nil {
		return snap, &OpError{"snapshot", err}
	}
	if offset < 0 || limit <= 0 {
		return snap, &OpError{"snapshot", fmt.Errorf("offset must be >= 0 and limit > 0, got %d and %d", offset, limit)}
	}
	res, err := scriptSnapshot.Run(ctx, s.rdb, s.roomKeys(room).snapshotKeys(), offset, limit, s.readCut(), ms(s.readSlack())).Slice()
	if err != nil {
		return snap, &OpError{"snapshot", err}
	}
	if len(res) < 5 {
		return snap, &OpError{"snapshot", fmt.Errorf("short reply of %d items", len(res))}
	}
	snap.At = time.UnixMilli(num(res[0]))
	snap.RoomSeq = uint64(num(res[1]))
	snap.StreamSeq = uint64(num(res[2]))
	snap.Total = int(num(res[3]))
	snap.Epoch = num(res[4])
	snap.Members = []presence.Member{}
	for i := 5; i+2 < len(res); {
		m := presence.Member{User: str(res[i]), Until: time.UnixMilli(num(res[i+1])), Sessions: []presence.SessionInfo{}}
		k := int(num(res[i+2]))
		i += 3
		for j := 0; j < k && i+2 < len(res); j++ {
			m.Sessions = append(m.Sessions, sessionInfo(res[i], res[i+1], res[i+2]))
			i += 3
		}
		snap.Members = append(snap.Members, m)
	}
	return snap, nil
}

// rosterBatch bounds the rooms of one Rosters pipeline.
const rosterBatch = 100

// Rosters returns whole snapshots of rooms (every member, Offset 0,
// ordered by user id), reading up to 100 rooms per round trip. It serves
// readers of entire regions; clients page with Snapshot. A room's
// snapshot is one atomic read, but different rooms are read at slightly
// different moments.
func (s *Store) Rosters(ctx context.Context, rooms []string) ([]presence.Snapshot, error) {
	for _, room := range rooms {
		if err := presence.ValidateRoom(room); err != nil {
			return nil, &OpError{"rosters", err}
		}
	}
	out := make([]presence.Snapshot, 0, len(rooms))
	for start := 0; start < len(rooms); start += rosterBatch {
		batch := rooms[start:min(start+rosterBatch, len(rooms))]
		calls := make([]call, len(batch))
		for i, room := range batch {
			calls[i] = call{script: scriptRoster, keys: s.roomKeys(room).rosterKeys(), args: []any{s.readCut(), ms(s.readSlack())}}
		}
		cmds, err := runAll(ctx, s.rdb, calls)
		if err != nil {
			return nil, &OpError{"rosters", err}
		}
		for i, cmd := range cmds {
			res, err := cmd.Slice()
			if err != nil {
				return nil, &OpError{"rosters", fmt.Errorf("room %s: %w", batch[i], err)}
			}
			snap, err := s.roster(batch[i], res)
			if err != nil {
				return nil, &OpError{"rosters", err}
			}
			out = append(out, snap)
		}
	}
	return out, nil
}

// roster decodes one reply of roster.lua.
func (s *Store) roster(room string, res []any) (presence.Snapshot, error) {
	part := func(i int) []any {
		if i < len(res) {
			a, _ := res[i].([]any)
			return a
		}
		return nil
	}
	head, users, ss, st := part(0), part(1), part(2), part(3)
	if len(res) != 4 || len(head) != 4 || len(users)%2 != 0 || len(ss)%2 != 0 || len(st)%2 != 0 {
		return presence.Snapshot{}, fmt.Errorf("room %s: malformed roster reply", room)
	}
	snap := presence.Snapshot{
		Region: s.opt.Region, Room: room, At: time.UnixMilli(num(head[0])),
		RoomSeq: uint64(num(head[1])), StreamSeq: uint64(num(head[2])), Epoch: num(head[3]),
		Total: len(users) / 2, Members: make([]presence.Member, 0, len(users)/2),
	}
	states := make(map[string]string, len(st)/2)
	for i := 0; i < len(st); i += 2 {
		states[str(st[i])] = str(st[i+1])
	}
	index := make(map[string]int, len(users)/2)
	for i := 0; i < len(users); i += 2 {
		u := str(users[i])
		index[u] = len(snap.Members)
		snap.Members = append(snap.Members, presence.Member{User: u, Until: time.UnixMilli(num(users[i+1])), Sessions: []presence.SessionInfo{}})
	}
	for i := 0; i < len(ss); i += 2 {
		u, rest, ok := strings.Cut(str(ss[i]), ":")
		sid, _, _ := strings.Cut(rest, ":") // then the holder
		j, member := index[u]
		if !ok || !member {
			continue // a live session of a user whose until passed: not a member
		}
		snap.Members[j].Sessions = append(snap.Members[j].Sessions, sessionInfo(sid, ss[i+1], states[u+":"+sid]))
	}
	slices.SortFunc(snap.Members, func(a, b presence.Member) int { return strings.Compare(a.User, b.User) })
	for _, m := range snap.Members {
		slices.SortFunc(m.Sessions, func(a, b presence.SessionInfo) int { return strings.Compare(a.ID, b.ID) })
	}
	return snap, nil
}

func sessionInfo(id, exp, state any) presence.SessionInfo {
	si := presence.SessionInfo{ID: str(id), Expires: time.Unix(num(exp), 0)}
	if st := str(state); st != "" {
		si.State = json.RawMessage(st)
	}
	return si
}

// Count returns the number of live members of a room without listing them.
func (s *Store) Count(ctx context.Context, room string) (int, error) {
	if err := presence.ValidateRoom(room); err != nil {
		return 0, &OpError{"count", err}
	}
	n, err := scriptCount.Run(ctx, s.rdb, s.roomKeys(room).countKeys(), s.readCut(), ms(s.readSlack())).Int()
	if err != nil {
		return 0, &OpError{"count", err}
	}
	return n, nil
}

// Sessions returns one user's presence in a room: ok is false when the
// user is not a member. A member with no sessions is inside the grace.
func (s *Store) Sessions(ctx context.Context, room, user string) (m presence.Member, ok bool, err error) {
	if err := presence.ValidateRoom(room); err != nil {
		return m, false, &OpError{"sessions", err}
	}
	if err := presence.ValidateUser(user); err != nil {
		return m, false, &OpError{"sessions", err}
	}
	res, err := scriptSessions.Run(ctx, s.rdb, s.roomKeys(room).sessionsKeys(), user, s.readCut(), ms(s.readSlack())).Slice()
	if err != nil {
		return m, false, &OpError{"sessions", err}
	}
	now := num(res[0])
	m = presence.Member{User: user, Sessions: []presence.SessionInfo{}}
	if str(res[1]) != "" && num(res[1]) >= now {
		ok, m.Until = true, time.UnixMilli(num(res[1]))
	}
	for i := 2; i+2 < len(res); i += 3 {
		m.Sessions = append(m.Sessions, sessionInfo(res[i], res[i+1], res[i+2]))
	}
	return m, ok, nil
}

package region

import (
	"context"
	"fmt"
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
	if tx, ok, err := s.snapshotTx(ctx, room, offset, limit); err != nil {
		return snap, &OpError{"snapshot", err}
	} else if ok {
		return tx, nil
	}
	return s.snapshotScript(ctx, snap, limit)
}

// snapshotScript is Snapshot read by snapshot.lua; a whole small room it
// reads is marked for the transaction (snaptx.go).
func (s *Store) snapshotScript(ctx context.Context, snap presence.Snapshot, limit int) (presence.Snapshot, error) {
	room, offset := snap.Room, snap.Offset
	res, err := scriptSnapshot.Run(ctx, s.rdb, s.roomKeys(room).snapshotKeys(), offset, limit, s.readCut(), ms(s.readSlack())).Slice()
	if err != nil {
		return snap, &OpError{"snapshot", err}
	}
	if len(res) < 5 {
		return snap, &OpError{"snapshot", fmt.Errorf("short reply of %d items", len(res))}
	}
	decodeSnapshot(&snap, res)
	s.noteSnapshot(snap)
	return snap, nil
}

// rosterBatch bounds the rooms of one Rosters pipeline, rosterPerCall
// those of one roster.lua call (rooms of one slot).
const (
	rosterBatch   = 100
	rosterPerCall = 20
)

// Rosters returns whole snapshots of rooms (every member, Offset 0,
// ordered by user id), in the order given, reading up to 100 rooms per
// round trip and up to 20 rooms of one slot per script call. It serves
// readers of entire regions; clients page with Snapshot. A room's
// snapshot is one atomic read, but different rooms are read at slightly
// different moments.
func (s *Store) Rosters(ctx context.Context, rooms []string) ([]presence.Snapshot, error) {
	out, _, err := s.rosters(ctx, rooms, false)
	return out, err
}

// rosters is Rosters, and with names also each room's live entries of
// its members.
func (s *Store) rosters(ctx context.Context, rooms []string, names bool) ([]presence.Snapshot, map[string][]string, error) {
	for _, room := range rooms {
		if err := presence.ValidateRoom(room); err != nil {
			return nil, nil, &OpError{"rosters", err}
		}
	}
	var entries map[string][]string
	if names {
		entries = make(map[string][]string, len(rooms))
	}
	out := make([]presence.Snapshot, 0, len(rooms))
	for start := 0; start < len(rooms); start += rosterBatch {
		batch := rooms[start:min(start+rosterBatch, len(rooms))]
		groups := s.slotGroups(batch, rosterPerCall)
		calls := make([]call, len(groups))
		for i, g := range groups {
			var keys []string
			for _, room := range g {
				keys = append(keys, s.roomKeys(room).rosterKeys()...)
			}
			calls[i] = call{script: scriptRoster, keys: keys, args: []any{s.readCut(), ms(s.readSlack())}}
		}
		cmds, err := runAll(ctx, s.rdb, calls)
		if err != nil {
			return nil, nil, &OpError{"rosters", err}
		}
		byRoom := make(map[string]presence.Snapshot, len(batch))
		for i, cmd := range cmds {
			res, err := cmd.Slice()
			if err != nil || len(res) != len(groups[i]) {
				return nil, nil, &OpError{"rosters", fmt.Errorf("rooms %v: %d replies: %v", groups[i], len(res), err)}
			}
			for j, room := range groups[i] {
				r, _ := res[j].([]any)
				snap, live, err := decodeRoster(s.opt.Region, room, r, names)
				if err != nil {
					return nil, nil, &OpError{"rosters", err}
				}
				byRoom[room] = snap
				if names {
					entries[room] = live
				}
			}
		}
		for _, room := range batch {
			out = append(out, byRoom[room])
		}
	}
	return out, entries, nil
}

// slotGroups splits rooms into groups of at most per rooms that share a
// slot (on a single Redis, any rooms), keeping their order within a
// group: the rooms of one script call.
func (s *Store) slotGroups(rooms []string, per int) [][]string {
	byIndex := map[string]int{} // index key -> its open group
	var out [][]string
	for _, room := range rooms {
		k := s.indexKey(room)
		i, ok := byIndex[k]
		if !ok || len(out[i]) >= per {
			i = len(out)
			out = append(out, nil)
			byIndex[k] = i
		}
		out[i] = append(out[i], room)
	}
	return out
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
	if str(res[1]) != "" && num(res[1])*1000 >= now {
		ok, m.Until = true, time.Unix(num(res[1]), 0)
	}
	for i := 2; i+2 < len(res); i += 3 {
		m.Sessions = append(m.Sessions, sessionInfo(res[i], res[i+1], res[i+2]))
	}
	return m, ok, nil
}

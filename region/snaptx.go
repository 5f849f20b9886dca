package region

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/presence"
)

// A small room's snapshot is read in one MULTI of plain commands instead
// of snapshot.lua: a script's replies cross into Lua and back, and that
// made a join's snapshot the largest share of Redis's time under join
// load; the transaction costs a third of it (go test ./region -bench
// BenchmarkSnapshotReads). The transaction reads the
// room whole (TIME, m, u's existence, z, s, st) and Go does what the
// script's small-room path does: the same cut, members in user id order,
// each with its live sessions in s's order, the same page. A test reads
// rooms both ways and compares.
//
// Only rooms this store last found small go this way, since the
// transaction reads st whole: a room's first read, a room with a member
// index (u) and one past txEntries entries go to the script, which pages.
// On a Redis Cluster every read is the script's.
const (
	txSmall   = 256         // live session entries up to which a room is marked small
	txEntries = 1024        // entries of z or s a transaction reads at most
	txMarkFor = time.Minute // a mark's life, renewed by each read that finds the room small
	txMarks   = 1 << 16     // marks kept at most: past it they start over
)

// smallRooms are the rooms this store last found small, with when.
type smallRooms struct {
	mu sync.Mutex
	at map[string]time.Time
}

func (m *smallRooms) marked(room string, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.at[room]
	return ok && now.Sub(t) < txMarkFor
}

// note marks room small, or drops its mark.
func (m *smallRooms) note(room string, small bool, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case !small:
		delete(m.at, room)
	case m.at == nil || len(m.at) >= txMarks:
		m.at = map[string]time.Time{room: now}
	default:
		m.at[room] = now
	}
}

// noteSnapshot marks a room small from a whole snapshot the script read.
func (s *Store) noteSnapshot(snap presence.Snapshot) {
	if snap.Offset != 0 || snap.Total != len(snap.Members) {
		return
	}
	n := 0
	for _, m := range snap.Members {
		n += max(len(m.Sessions), 1)
	}
	s.small.note(snap.Room, n <= txSmall, time.Now())
}

// snapshotTx reads a page of a room marked small in one transaction; ok
// false: the script must read it (not marked, or no longer small).
func (s *Store) snapshotTx(ctx context.Context, room string, offset, limit int) (snap presence.Snapshot, ok bool, err error) {
	c, isClient := s.rdb.(*redis.Client)
	if !isClient || !s.small.marked(room, time.Now()) {
		return snap, false, nil
	}
	k := s.roomKeys(room)
	var tm *redis.TimeCmd
	var meta *redis.SliceCmd
	var big *redis.IntCmd
	var zs, ss *redis.ZSliceCmd
	var st *redis.MapStringStringCmd
	_, err = c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		tm = p.Time(ctx)
		meta = p.HMGet(ctx, k.m, "seq", "jsseq", "epoch")
		big = p.Exists(ctx, k.u)
		zs = p.ZRangeWithScores(ctx, k.z, 0, txEntries-1)
		ss = p.ZRangeWithScores(ctx, k.s, 0, txEntries-1)
		st = p.HGetAll(ctx, k.st)
		return nil
	})
	if err != nil {
		return snap, false, err
	}
	if big.Val() == 1 || len(zs.Val()) == txEntries || len(ss.Val()) == txEntries {
		s.small.note(room, false, time.Now())
		return snap, false, nil
	}
	now := tm.Val().UnixMilli()
	at := now - ms(s.readSlack())
	if cut := s.readCut(); cut > 0 && cut < at {
		at = cut
	}
	snap = txSnapshot(s.opt.Region, room, offset, limit, now, float64(at)/1000, meta.Val(), zs.Val(), ss.Val(), st.Val())
	s.small.note(room, len(ss.Val()) <= txSmall, time.Now())
	return snap, true, nil
}

// txSnapshot is snapshot.lua's small-room path over what the transaction
// read: members of z scored at or above live (seconds), in user id order,
// the page of them from offset, each with their entries of s scored at or
// above live, in s's order, and their states.
func txSnapshot(region, room string, offset, limit int, now int64, live float64, meta []any, zs, ss []redis.Z, st map[string]string) presence.Snapshot {
	meta = append(meta, nil, nil, nil) // HMGET answers three; num reads nil as 0
	snap := presence.Snapshot{Region: region, Room: room, Offset: offset, At: time.UnixMilli(now),
		RoomSeq: uint64(num(meta[0])), StreamSeq: uint64(num(meta[1])), Epoch: num(meta[2])}
	members := zs[:0:0]
	for _, z := range zs {
		if _, ok := z.Member.(string); ok && z.Score >= live {
			members = append(members, z) // only strings: the asserts below hold
		}
	}
	slices.SortFunc(members, func(a, b redis.Z) int { return strings.Compare(a.Member.(string), b.Member.(string)) })
	snap.Total = len(members)
	from := min(offset, len(members))
	page := members[from : from+min(limit, len(members)-from)] // no offset+limit: it may overflow
	at := make(map[string]int, len(page))
	snap.Members = make([]presence.Member, 0, len(page))
	for _, z := range page {
		u := z.Member.(string)
		at[u] = len(snap.Members)
		snap.Members = append(snap.Members, presence.Member{User: u, Until: time.Unix(int64(z.Score), 0), Sessions: []presence.SessionInfo{}})
	}
	for _, z := range ss {
		e, _ := z.Member.(string)
		u, sid, _, ok := splitEntry(e)
		i, member := at[u]
		if !ok || !member || z.Score < live {
			continue
		}
		si := presence.SessionInfo{ID: sid, Expires: time.Unix(int64(z.Score), 0)}
		if len(st) > 0 { // most rooms hold no state: no key to make
			if v := stateRead(st[u+":"+sid]); v != "" {
				si.State = json.RawMessage(v)
			}
		}
		snap.Members[i].Sessions = append(snap.Members[i].Sessions, si)
	}
	return snap
}

// stateRead is state_read in lib.lua: a value of st as its state JSON, of
// any format this release reads.
func stateRead(v string) string {
	if newestFormat >= 3 && strings.HasPrefix(v, state3) {
		return v[len(state3):]
	}
	return v
}

// state3 begins a state stored in format 3 (STATE3 in lib.lua).
const state3 = "~"

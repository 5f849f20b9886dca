package region

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/presence"
)

// The change log (mark in lua/lib.lua, one per slot's reap index) lets the
// cross-region publisher find what changed since its last read in
// proportion to the changes, not to the region. Reading it is not
// consuming it: any number of readers (a publisher that lost its lease
// without knowing yet, its successor) each follow it with their own
// cursor, so none takes a change from another.

var (
	scriptChanges = loadFlags("changes", false, "allow-cross-slot-keys")
	scriptMembers = load("members", true)
)

func init() { allScripts = append(allScripts, scriptChanges, scriptMembers) }

// ChangesKeep is how long a change log keeps a mark, and how long it is
// kept at all after its last read: a reader whose cursor is older, or
// that finds a log gone, reads everything instead.
const ChangesKeep = 5 * time.Minute

// Changes returns the names marked changed since cursor, by room, and
// the cursor to pass next: a user whose listing changed, or an entry
// added to the room (an entry: "user:session" then a holder code; see MembersOf). complete is false when the log cannot say
// (cursor is "", too old, a log was not kept, Redis lost it, the cluster's
// masters changed, or more than most changed): then changed is nil and the
// caller reads everything, after this call, so what it reads is at least
// as new as the next cursor. A member is named at most once however often
// it changed, and may be named again by the next call (a change at the
// cursor's own millisecond). Each call keeps the log for ChangesKeep.
func (s *Store) Changes(ctx context.Context, cursor string, most int) (changed map[string][]string, next string, complete bool, err error) {
	groups, err := s.changeLogs(ctx)
	if err != nil {
		return nil, "", false, &OpError{"changes", err}
	}
	from := parseCursor(cursor)
	calls := make([]call, len(groups))
	for i, g := range groups {
		args := append([]any{from[g[0]], ms(ChangesKeep), most}, anys(g)...)
		calls[i] = call{script: scriptChanges, keys: g[:1], args: args}
	}
	cmds, err := runAll(ctx, s.rdb, calls)
	if err != nil {
		return nil, "", false, &OpError{"changes", err}
	}
	complete = cursor != "" && len(from) == len(groups)
	changed = map[string][]string{}
	stamps := make(map[string]int64, len(groups))
	n := 0
	for i, c := range cmds {
		res, err := c.Slice()
		if err != nil || len(res) < 2 {
			return nil, "", false, &OpError{"changes", fmt.Errorf("log %s: malformed reply: %v", groups[i][0], err)}
		}
		stamps[groups[i][0]] = num(res[0])
		if num(res[1]) != 1 {
			complete = false
		}
		for _, m := range res[2:] {
			room, user, ok := strings.Cut(str(m), ":")
			if ok && room != "" && user != "" {
				changed[room] = append(changed[room], user)
				n++
			}
		}
	}
	if n > most {
		complete = false // several masters together
	}
	if !complete {
		changed = nil
	}
	return changed, formatCursor(stamps), complete, nil
}

// changeLogs returns the change logs, grouped by the Redis node holding
// them: one group on a single Redis, one per master on a cluster.
func (s *Store) changeLogs(ctx context.Context) ([][]string, error) {
	if _, ok := s.rdb.(*redis.ClusterClient); !ok {
		return [][]string{{changesKey(s.opt.Prefix + ":reap")}}, nil
	}
	groups, err := s.masterIndexes(ctx)
	if err != nil {
		return nil, err
	}
	for _, g := range groups {
		for i, k := range g {
			g[i] = changesKey(k)
		}
	}
	return groups, nil
}

// parseCursor reads "log=stamp;log=stamp..." (one entry per node group,
// named by its first log).
func parseCursor(c string) map[string]int64 {
	out := map[string]int64{}
	for _, kv := range strings.Split(c, ";") {
		k, v, ok := strings.Cut(kv, "=")
		if n, err := strconv.ParseInt(v, 10, 64); ok && err == nil {
			out[k] = n
		}
	}
	return out
}

func formatCursor(stamps map[string]int64) string {
	keys := make([]string, 0, len(stamps))
	for k := range stamps {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(';')
		}
		b.WriteString(k + "=" + strconv.FormatInt(stamps[k], 10))
	}
	return b.String()
}

func anys(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// membersBatch bounds the rooms of one MembersOf pipeline, membersPerCall
// those of one members.lua call (rooms of one slot).
const (
	membersBatch   = 1000
	membersPerCall = 100
)

// MembersOf reads members of rooms (room -> names) as Rosters reads whole
// rooms: a snapshot per room (in room order) listing those of the named
// users who are members, with their live sessions (sorted, each once)
// and states; a named user missing from it is not a member. A name is a
// user, or one of their entries as Changes, Entries and MembersOf give
// them: given entries, the user's listing is those of them that live,
// looked up one by one; given the user alone, the room is scanned for
// their entries. It also returns each room's live entries of the members
// read. Each room is one atomic read; up to 100 rooms of one slot go in
// one script call, 1,000 rooms in one round trip.
func (s *Store) MembersOf(ctx context.Context, want map[string][]string) ([]presence.Snapshot, map[string][]string, error) {
	rooms := make([]string, 0, len(want))
	for room, names := range want {
		if err := presence.ValidateRoom(room); err != nil {
			return nil, nil, &OpError{"members of", err}
		}
		for _, n := range names {
			u, _, _ := strings.Cut(n, ":")
			if err := presence.ValidateUser(u); err != nil {
				return nil, nil, &OpError{"members of", err}
			}
		}
		rooms = append(rooms, room)
	}
	sort.Strings(rooms)
	out := make([]presence.Snapshot, 0, len(rooms))
	entries := make(map[string][]string, len(rooms))
	for start := 0; start < len(rooms); start += membersBatch {
		groups := s.slotGroups(rooms[start:min(start+membersBatch, len(rooms))], membersPerCall)
		calls := make([]call, len(groups))
		for i, g := range groups {
			var keys []string
			args := []any{s.readCut(), ms(s.readSlack())}
			for _, room := range g {
				k := s.roomKeys(room)
				keys = append(keys, k.z, k.s, k.st, k.u)
				args = append(append(args, len(want[room])), anys(want[room])...)
			}
			calls[i] = call{script: scriptMembers, keys: keys, args: args}
		}
		cmds, err := runAll(ctx, s.rdb, calls)
		if err != nil {
			return nil, nil, &OpError{"members of", err}
		}
		for i, cmd := range cmds {
			res, err := cmd.Slice()
			if err != nil || len(res) != len(groups[i]) {
				return nil, nil, &OpError{"members of", fmt.Errorf("rooms %v: %d replies: %v", groups[i], len(res), err)}
			}
			for j, room := range groups[i] {
				r, _ := res[j].([]any)
				snap, live := decodeMembers(s.opt.Region, room, r)
				out = append(out, snap)
				entries[room] = live
			}
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Room < out[b].Room })
	return out, entries, nil
}

// Entries is Rosters that also returns each room's live entries of its
// members, the names MembersOf looks up.
func (s *Store) Entries(ctx context.Context, rooms []string) ([]presence.Snapshot, map[string][]string, error) {
	return s.rosters(ctx, rooms, true)
}

// decodeMembers decodes a reply of members.lua: the snapshot and the live
// entries it lists.
func decodeMembers(region, room string, res []any) (presence.Snapshot, []string) {
	snap := presence.Snapshot{Region: region, Room: room, Members: []presence.Member{}}
	if len(res) > 0 {
		snap.At = time.UnixMilli(num(res[0]))
	}
	var live []string
	for i := 1; i+2 < len(res); {
		u, until, k := str(res[i]), str(res[i+1]), int(num(res[i+2]))
		i += 3
		m := presence.Member{User: u, Sessions: []presence.SessionInfo{}}
		seen := map[string]bool{}
		for j := 0; j < k && i+1 < len(res); j++ {
			e := str(res[i])
			_, sid, _, _ := splitEntry(e)
			si := presence.SessionInfo{ID: sid} // expiry is not read
			if st := str(res[i+1]); st != "" {
				si.State = json.RawMessage(st)
			}
			i += 2
			live = append(live, e)
			if !seen[sid] { // two holders' entries of one session list it once
				seen[sid] = true
				m.Sessions = append(m.Sessions, si)
			}
		}
		if until == "" {
			continue
		}
		m.Until = time.Unix(num(until), 0)
		sort.Slice(m.Sessions, func(a, b int) bool { return m.Sessions[a].ID < m.Sessions[b].ID })
		snap.Members = append(snap.Members, m)
	}
	snap.Total = len(snap.Members)
	sort.Slice(snap.Members, func(a, b int) bool { return snap.Members[a].User < snap.Members[b].User })
	return snap, live
}

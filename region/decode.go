package region

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/presence-dev/presence/presence"
)

// Decoders of script replies. Redis sends integers as numbers or, from
// Lua tables built of strings, as strings.

// ms is a duration as a script argument.
func ms(d time.Duration) int64 { return d.Milliseconds() }

// num reads an integer reply that Redis may send as a number or a string.
func num(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		f, _ := strconv.ParseFloat(x, 64)
		return int64(f)
	}
	return 0
}

func toStrings(v []any) []string {
	out := make([]string, 0, len(v))
	for _, x := range v {
		out = append(out, str(x))
	}
	return out
}

func str(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case int64:
		return strconv.FormatInt(x, 10)
	case nil:
		return ""
	}
	return fmt.Sprint(v)
}

// decodeSnapshot fills snap from a reply of snapshot.lua of at least 5
// items (see there for the layout).
func decodeSnapshot(snap *presence.Snapshot, res []any) {
	snap.At = time.UnixMilli(num(res[0]))
	snap.RoomSeq = uint64(num(res[1]))
	snap.StreamSeq = uint64(num(res[2]))
	snap.Total = int(num(res[3]))
	snap.Epoch = num(res[4])
	snap.Members = []presence.Member{}
	for i := 5; i+2 < len(res); {
		m := presence.Member{User: str(res[i]), Until: time.Unix(num(res[i+1]), 0), Sessions: []presence.SessionInfo{}}
		k := int(num(res[i+2]))
		i += 3
		for j := 0; j < k && i+2 < len(res); j++ {
			m.Sessions = append(m.Sessions, sessionInfo(res[i], res[i+1], res[i+2]))
			i += 3
		}
		snap.Members = append(snap.Members, m)
	}
}

// decodeRoster decodes one reply of roster.lua for room of region; with
// names it also returns the members' live entries.
func decodeRoster(region, room string, res []any, names bool) (presence.Snapshot, []string, error) {
	part := func(i int) []any {
		if i < len(res) {
			a, _ := res[i].([]any)
			return a
		}
		return nil
	}
	head, users, ss, st := part(0), part(1), part(2), part(3)
	if len(res) != 4 || len(head) != 4 || len(users)%2 != 0 || len(ss)%2 != 0 || len(st)%2 != 0 {
		return presence.Snapshot{}, nil, fmt.Errorf("room %s: malformed roster reply", room)
	}
	snap := presence.Snapshot{
		Region: region, Room: room, At: time.UnixMilli(num(head[0])),
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
		snap.Members = append(snap.Members, presence.Member{User: u, Until: time.Unix(num(users[i+1]), 0), Sessions: []presence.SessionInfo{}})
	}
	var live []string
	for i := 0; i < len(ss); i += 2 {
		e := str(ss[i])
		u, sid, _, ok := splitEntry(e)
		j, member := index[u]
		if !ok || !member {
			continue // a live session of a user whose until passed: not a member
		}
		if names {
			live = append(live, e)
		}
		snap.Members[j].Sessions = append(snap.Members[j].Sessions, sessionInfo(sid, ss[i+1], states[u+":"+sid]))
	}
	slices.SortFunc(snap.Members, func(a, b presence.Member) int { return strings.Compare(a.User, b.User) })
	for _, m := range snap.Members {
		slices.SortFunc(m.Sessions, func(a, b presence.SessionInfo) int { return strings.Compare(a.ID, b.ID) })
	}
	return snap, live, nil
}

func sessionInfo(id, exp, state any) presence.SessionInfo {
	si := presence.SessionInfo{ID: str(id), Expires: time.Unix(num(exp), 0)}
	if st := str(state); st != "" {
		si.State = json.RawMessage(st)
	}
	return si
}

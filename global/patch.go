package global

import (
	"encoding/json"
	"fmt"
	"maps"

	"github.com/presence-dev/presence/presence"
)

// patch is what a cadence read from a ChangeSource: whole rooms of the
// anti-entropy check (rosters), then the members the change log named
// (changed, read as members).
type patch struct {
	rosters []presence.Snapshot
	changed map[string][]string
	members []presence.Snapshot
}

// ops returns the operations that bring last to what the patch read, and
// the members ("room/user") that differed although the log did not name
// them: changes the log missed, which the check repairs. Every member
// the patch read is compared: one present there is set if it differs,
// one absent is deleted if last has it. The members' reads are later
// than the rosters', so they win.
func (pt patch) ops(last truth) ([]roomOps, []string) {
	now := truth{Members: regionView{}, States: stateView{}}
	read := map[string]map[string]bool{} // room -> user -> named by the log
	cover := func(room, user string, named bool) {
		if read[room] == nil {
			read[room] = map[string]bool{}
		}
		read[room][user] = read[room][user] || named
	}
	for _, snap := range pt.rosters {
		now.add(snap.Room, snap.Members)
		for _, m := range snap.Members {
			cover(snap.Room, m.User, false)
		}
		for u := range last.Members[snap.Room] {
			cover(snap.Room, u, false)
		}
	}
	for room, users := range pt.changed {
		for _, u := range users {
			cover(room, u, true)
			delete(now.Members[room], u)
			delete(now.States[room], u)
		}
	}
	for _, snap := range pt.members {
		now.add(snap.Room, snap.Members)
	}
	var out []roomOps
	var repaired []string
	for _, room := range sortedKeys(read) {
		ops := roomOps{Room: room}
		for _, u := range sortedKeys(read[room]) {
			ss, present := now.Members[room][u]
			prev, had := last.Members[room][u]
			st, prevSt := now.States[room][u], last.States[room][u]
			switch {
			case present && (!had || !equalStrings(prev, ss) || !maps.Equal(st, prevSt)):
				ops.set(u, ss, st)
			case !present && had:
				ops.Del = append(ops.Del, u)
			default:
				continue
			}
			if !read[room][u] {
				repaired = append(repaired, fmt.Sprintf("%s/%s: published %v %v, read %v %v", room, u, prev, prevSt, ss, st))
			}
		}
		if ops.Set != nil || ops.Del != nil {
			out = append(out, ops)
		}
	}
	return out, repaired
}

// set gives user u whole in o: their session ids and the states of those
// that have one.
func (o *roomOps) set(u string, ss []string, st map[string]string) {
	if o.Set == nil {
		o.Set = map[string][]string{}
	}
	o.Set[u] = nonNil(ss)
	if len(st) == 0 {
		return
	}
	if o.St == nil {
		o.St = map[string]map[string]json.RawMessage{}
	}
	raw := make(map[string]json.RawMessage, len(st))
	for s, j := range st {
		raw[s] = json.RawMessage(j)
	}
	o.St[u] = raw
}

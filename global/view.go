package global

import (
	"encoding/json"
	"maps"
	"sort"
)

// regionView is a region's presence as publications carry it:
// room -> user -> sorted live session ids. A user with no sessions is
// inside the regional offline grace and still present.
type regionView map[string]map[string][]string

// stateView holds session states: room -> user -> session -> state
// (JSON). Only sessions with a state are in it.
type stateView map[string]map[string]map[string]string

// truth is a region's presence as a publisher reads it: members with
// their sessions, and the sessions' states.
type truth struct {
	Members regionView
	States  stateView
}

// Diff returns the operations that turn old into v, rooms and users in
// sorted order. Session states are not compared (see truth.Diff).
func (v regionView) Diff(old regionView) []roomOps {
	return truth{Members: v}.Diff(truth{Members: old})
}

// Diff returns the operations that turn old into t, rooms and users in
// sorted order. A user whose sessions or states changed is set whole.
func (t truth) Diff(old truth) []roomOps {
	v := t.Members
	rooms := map[string]struct{}{}
	for r := range v {
		rooms[r] = struct{}{}
	}
	for r := range old.Members {
		rooms[r] = struct{}{}
	}
	var out []roomOps
	for _, r := range sortedKeys(rooms) {
		now, was := v[r], old.Members[r]
		ops := roomOps{Room: r}
		for _, u := range sortedKeys(now) {
			st := t.States[r][u]
			if prev, ok := was[u]; !ok || !equalStrings(prev, now[u]) || !maps.Equal(st, old.States[r][u]) {
				if ops.Set == nil {
					ops.Set = map[string][]string{}
				}
				ops.Set[u] = nonNil(now[u])
				if len(st) > 0 {
					if ops.St == nil {
						ops.St = map[string]map[string]json.RawMessage{}
					}
					raw := make(map[string]json.RawMessage, len(st))
					for s, j := range st {
						raw[s] = json.RawMessage(j)
					}
					ops.St[u] = raw
				}
			}
		}
		for _, u := range sortedKeys(was) {
			if _, ok := now[u]; !ok {
				ops.Del = append(ops.Del, u)
			}
		}
		if ops.Set != nil || ops.Del != nil {
			out = append(out, ops)
		}
	}
	return out
}

// Ops returns v as operations from nothing, as a full carries it.
func (v regionView) Ops() []roomOps { return v.Diff(nil) }

// Ops returns t as operations from nothing, as a full carries it.
func (t truth) Ops() []roomOps { return t.Diff(truth{}) }

// Apply applies the state part of ops to v in place: a user set is given
// whole, so their states are replaced (or cleared when St omits them).
func (v stateView) Apply(ops []roomOps) {
	for _, op := range ops {
		room := v[op.Room]
		if room == nil {
			room = map[string]map[string]string{}
			v[op.Room] = room
		}
		for u := range op.Set {
			if st := op.St[u]; len(st) > 0 {
				m := make(map[string]string, len(st))
				for s, j := range st {
					m[s] = string(j)
				}
				room[u] = m
			} else {
				delete(room, u)
			}
		}
		for _, u := range op.Del {
			delete(room, u)
		}
		if len(room) == 0 {
			delete(v, op.Room)
		}
	}
}

// Apply applies ops to v in place.
func (v regionView) Apply(ops []roomOps) {
	for _, op := range ops {
		room := v[op.Room]
		if room == nil {
			room = map[string][]string{}
			v[op.Room] = room
		}
		for u, ss := range op.Set {
			room[u] = normSessions(ss)
		}
		for _, u := range op.Del {
			delete(room, u)
		}
		if len(room) == 0 {
			delete(v, op.Room)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// normSessions returns ss sorted and without duplicates.
func normSessions(ss []string) []string {
	out := append([]string{}, ss...)
	sort.Strings(out)
	n := 0
	for i, s := range out {
		if i == 0 || s != out[n-1] {
			out[n] = s
			n++
		}
	}
	return out[:n]
}

package global

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/presence"
)

// SyncVersion is the version of the publication encoding. An aggregator
// drops (and counts) a version it does not know.
const SyncVersion = 1

// Publication kinds; each is also the last token of its subject (see
// bus.SyncDeltaSubject, bus.SyncFullSubject).
const (
	KindDelta = "delta"
	KindFull  = "full"
)

// DeltaSubject is bus.SyncDeltaSubject.
//
// Deprecated: the subject namespace lives in package bus; use
// bus.SyncDeltaSubject.
func DeltaSubject(region string) string { return bus.SyncDeltaSubject(region) }

// FullSubject is bus.SyncFullSubject.
//
// Deprecated: the subject namespace lives in package bus; use
// bus.SyncFullSubject.
func FullSubject(region string) string { return bus.SyncFullSubject(region) }

// Publication is one message of a region's publication stream (version
// 1). A delta applies to the state after Seq-1; a full (Parts messages
// sharing one Seq) replaces the state. Gen is the revision of the lease
// that made this publisher active; with Inst it names the publisher's
// term. It does not decide who publishes: an aggregator keeps a region's
// current publisher while it publishes (see core.publication).
//
//	{"v":1,"kind":"delta","region":"eu","gen":7,"inst":"Xq3…","seq":42,
//	 "at":1764444000000,"rooms":[{"room":"r1","set":{"u1":["tab1","tab2"]},"del":["u2"]}]}
//
// set gives a user's complete list of live session ids in the region
// (empty: the user is inside the regional offline grace, still present);
// del removes the user from the room in this region. An empty delta is
// the region's liveness signal.
type Publication struct {
	V      int       `json:"v"`
	Kind   string    `json:"kind"`
	Region string    `json:"region"`
	Gen    uint64    `json:"gen"`
	Inst   string    `json:"inst"`
	Seq    uint64    `json:"seq"`
	Part   int       `json:"part,omitempty"`  // full only: 1..Parts
	Parts  int       `json:"parts,omitempty"` // full only
	At     int64     `json:"at"`              // publisher clock, unix ms; informational
	Rooms  []RoomOps `json:"rooms"`

	size int // encoded bytes, as received; bounds a full's assembly
}

// RoomOps is the part of a publication about one room. A user in Set is
// given whole: their session ids, and in St the states of those of their
// sessions that have one (a user in Set but not in St has none).
type RoomOps struct {
	Room string                                `json:"room"`
	Set  map[string][]string                   `json:"set,omitempty"`
	St   map[string]map[string]json.RawMessage `json:"st,omitempty"`
	Del  []string                              `json:"del,omitempty"`
}

// maxParts bounds a full snapshot's parts. Each part is one NATS message
// of up to the connection's max payload, and an assembly's bytes are
// bounded too (AggregatorConfig.MaxFullBytes), so a full that announces
// more parts than it could ever fill is refused at once.
const maxParts = 10000

// DecodePublication parses and checks a publication received on subject.
// A publication whose body disagrees with its subject is malformed.
func DecodePublication(subject string, data []byte) (*Publication, error) {
	var p Publication
	if err := json.Unmarshal(data, &p); err != nil {
		return nil, fmt.Errorf("global: decode publication: %w", err)
	}
	if p.V != SyncVersion {
		return nil, fmt.Errorf("global: decode publication: version %d, this build reads %d", p.V, SyncVersion)
	}
	if err := bus.ValidateRegion(p.Region); err != nil {
		return nil, fmt.Errorf("global: decode publication: %w", err)
	}
	switch p.Kind {
	case KindDelta:
		if subject != bus.SyncDeltaSubject(p.Region) || p.Part != 0 || p.Parts != 0 {
			return nil, fmt.Errorf("global: decode publication: delta of %s on %q", p.Region, subject)
		}
	case KindFull:
		if subject != bus.SyncFullSubject(p.Region) {
			return nil, fmt.Errorf("global: decode publication: full of %s on %q", p.Region, subject)
		}
		if p.Parts < 1 || p.Parts > maxParts || p.Part < 1 || p.Part > p.Parts {
			return nil, fmt.Errorf("global: decode publication: part %d of %d", p.Part, p.Parts)
		}
	default:
		return nil, fmt.Errorf("global: decode publication: unknown kind %q", p.Kind)
	}
	if p.Gen == 0 || p.Seq == 0 || p.Inst == "" {
		return nil, errors.New("global: decode publication: gen, seq and inst are required")
	}
	for _, r := range p.Rooms {
		if err := presence.ValidateRoom(r.Room); err != nil {
			return nil, fmt.Errorf("global: decode publication: %w", err)
		}
		for u, ss := range r.Set {
			if err := presence.ValidateUser(u); err != nil {
				return nil, fmt.Errorf("global: decode publication: %w", err)
			}
			for _, s := range ss {
				if err := presence.ValidateSession(s); err != nil {
					return nil, fmt.Errorf("global: decode publication: %w", err)
				}
			}
		}
		for u, states := range r.St {
			ss, ok := r.Set[u]
			if !ok {
				return nil, fmt.Errorf("global: decode publication: state of %s, who is not in set", u)
			}
			for s, st := range states {
				if !slices.Contains(ss, s) {
					return nil, fmt.Errorf("global: decode publication: state of session %s/%s, which is not in set", u, s)
				}
				if len(st) == 0 || len(st) > presence.MaxStateBytes || !json.Valid(st) || string(st) == "null" {
					return nil, fmt.Errorf("global: decode publication: state of %s/%s: not a JSON value of at most %d bytes", u, s, presence.MaxStateBytes)
				}
			}
		}
		if p.Kind == KindFull && len(r.Del) > 0 {
			return nil, errors.New("global: decode publication: a full has no deletions")
		}
		for _, u := range r.Del {
			if err := presence.ValidateUser(u); err != nil {
				return nil, fmt.Errorf("global: decode publication: %w", err)
			}
		}
	}
	p.size = len(data)
	return &p, nil
}

// RegionView is a region's presence as publications carry it:
// room -> user -> sorted live session ids. A user with no sessions is
// inside the regional offline grace and still present.
type RegionView map[string]map[string][]string

// StateView holds session states: room -> user -> session -> state
// (JSON). Only sessions with a state are in it.
type StateView map[string]map[string]map[string]string

// Truth is a region's presence as a publisher reads it: members with
// their sessions, and the sessions' states.
type Truth struct {
	Members RegionView
	States  StateView
}

// Diff returns the operations that turn old into v, rooms and users in
// sorted order. Session states are not compared (see Truth.Diff).
func (v RegionView) Diff(old RegionView) []RoomOps {
	return Truth{Members: v}.Diff(Truth{Members: old})
}

// Diff returns the operations that turn old into t, rooms and users in
// sorted order. A user whose sessions or states changed is set whole.
func (t Truth) Diff(old Truth) []RoomOps {
	v := t.Members
	rooms := map[string]struct{}{}
	for r := range v {
		rooms[r] = struct{}{}
	}
	for r := range old.Members {
		rooms[r] = struct{}{}
	}
	var out []RoomOps
	for _, r := range sortedKeys(rooms) {
		now, was := v[r], old.Members[r]
		ops := RoomOps{Room: r}
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
func (v RegionView) Ops() []RoomOps { return v.Diff(nil) }

// Ops returns t as operations from nothing, as a full carries it.
func (t Truth) Ops() []RoomOps { return t.Diff(Truth{}) }

// Apply applies the state part of ops to v in place: a user set is given
// whole, so their states are replaced (or cleared when St omits them).
func (v StateView) Apply(ops []RoomOps) {
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
func (v RegionView) Apply(ops []RoomOps) {
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

// chunkOps splits ops into groups whose JSON stays under budget bytes,
// splitting a large room across groups. Entry sizes are an upper bound of
// their JSON (ids need no escaping), so no group exceeds the budget
// unless one user alone does.
func chunkOps(ops []RoomOps, budget int) [][]RoomOps {
	var (
		out  [][]RoomOps
		cur  []RoomOps
		size int
	)
	for _, op := range ops {
		roomCost := len(op.Room) + 32
		// place returns the RoomOps of op.Room in the current group,
		// starting a new group when cost would not fit.
		place := func(cost int) *RoomOps {
			open := len(cur) > 0 && cur[len(cur)-1].Room == op.Room
			need := cost
			if !open {
				need += roomCost
			}
			if len(cur) > 0 && size+need > budget {
				out = append(out, cur)
				cur, size, open, need = nil, 0, false, cost+roomCost
			}
			if !open {
				cur = append(cur, RoomOps{Room: op.Room})
			}
			size += need
			return &cur[len(cur)-1]
		}
		for _, u := range sortedKeys(op.Set) {
			ss := op.Set[u]
			cost := len(u) + 6
			for _, s := range ss {
				cost += len(s) + 3
			}
			st := op.St[u]
			for s, j := range st {
				// Marshal escapes <, > and & in a RawMessage as \u00XX.
				cost += len(s) + len(j) + 4 + 5*(bytes.Count(j, []byte("<"))+bytes.Count(j, []byte(">"))+bytes.Count(j, []byte("&")))
			}
			p := place(cost)
			if p.Set == nil {
				p.Set = map[string][]string{}
			}
			p.Set[u] = nonNil(ss)
			if len(st) > 0 {
				if p.St == nil {
					p.St = map[string]map[string]json.RawMessage{}
				}
				p.St[u] = st
			}
		}
		for _, u := range op.Del {
			p := place(len(u) + 3)
			p.Del = append(p.Del, u)
		}
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
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

// keyEscape maps a region id onto the bytes KV bucket names allow
// ([A-Za-z0-9_-]): other bytes, and '_' itself, become _XX (hex).
func keyEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "_%02X", c)
		}
	}
	return b.String()
}

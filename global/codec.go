package global

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/presence"
)

// syncVersion is the version of the publication encoding. An aggregator
// drops (and counts) a version it does not know.
const syncVersion = 1

// Publication kinds; each is also the last token of its subject (see
// bus.SyncDeltaSubject, bus.SyncFullSubject).
const (
	kindDelta = "delta"
	kindFull  = "full"
)

// publication is one message of a region's publication stream (version
// 1). A delta applies to the state after Seq-1; a full (Parts messages
// sharing one Seq) replaces the state. Gen is the revision of the lease
// that made this publisher active; with Inst it names the publisher's
// term. It does not decide who publishes: an aggregator keeps a region's
// current publisher while it publishes (see core.publication).
//
//	{"v":1,"kind":"delta","region":"eu","gen":7,"inst":"Xq3…","seq":42,
//	 "at":1764444000000,"rooms":[{"room":"r1","set":{"u1":["tab1","tab2"]},"del":["u2"]}],"dg":"9f3c…"}
//
// set gives a user's complete list of live session ids in the region
// (empty: the user is inside the regional offline grace, still present);
// del removes the user from the room in this region. An empty delta is
// the region's liveness signal.
type publication struct {
	V      int       `json:"v"`
	Kind   string    `json:"kind"`
	Region string    `json:"region"`
	Gen    uint64    `json:"gen"`
	Inst   string    `json:"inst"`
	Seq    uint64    `json:"seq"`
	Part   int       `json:"part,omitempty"`  // full only: 1..Parts
	Parts  int       `json:"parts,omitempty"` // full only
	At     int64     `json:"at"`              // publisher clock, unix ms; informational
	Rooms  []roomOps `json:"rooms"`
	// Digest (delta only, now and then) is the digest of the region's view
	// once this delta is applied; an aggregator whose copy differs asks
	// for a full. Older aggregators ignore it.
	Digest string `json:"dg,omitempty"`

	size int // encoded bytes, as received; bounds a full's assembly
}

// roomOps is the part of a publication about one room. A user in Set is
// given whole: their session ids, and in St the states of those of their
// sessions that have one (a user in Set but not in St has none).
type roomOps struct {
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

// decodePublication parses and checks a publication received on subject.
// A publication whose body disagrees with its subject is malformed.
func decodePublication(subject string, data []byte) (*publication, error) {
	var p publication
	if err := json.Unmarshal(data, &p); err != nil {
		return nil, fmt.Errorf("global: decode publication: %w", err)
	}
	if p.V != syncVersion {
		return nil, fmt.Errorf("global: decode publication: version %d, this build reads %d", p.V, syncVersion)
	}
	if err := bus.ValidateRegion(p.Region); err != nil {
		return nil, fmt.Errorf("global: decode publication: %w", err)
	}
	if err := checkEnvelope(subject, &p); err != nil {
		return nil, err
	}
	for i := range p.Rooms {
		if err := checkRoomOps(p.Kind, &p.Rooms[i]); err != nil {
			return nil, err
		}
	}
	p.size = len(data)
	return &p, nil
}

// checkEnvelope checks a publication's kind, subject, parts and ids.
func checkEnvelope(subject string, p *publication) error {
	switch p.Kind {
	case kindDelta:
		if subject != bus.SyncDeltaSubject(p.Region) || p.Part != 0 || p.Parts != 0 {
			return fmt.Errorf("global: decode publication: delta of %s on %q", p.Region, subject)
		}
	case kindFull:
		if p.Digest != "" {
			return errors.New("global: decode publication: a full carries no digest")
		}
		if subject != bus.SyncFullSubject(p.Region) {
			return fmt.Errorf("global: decode publication: full of %s on %q", p.Region, subject)
		}
		if p.Parts < 1 || p.Parts > maxParts || p.Part < 1 || p.Part > p.Parts {
			return fmt.Errorf("global: decode publication: part %d of %d", p.Part, p.Parts)
		}
	default:
		return fmt.Errorf("global: decode publication: unknown kind %q", p.Kind)
	}
	if p.Gen == 0 || p.Seq == 0 || p.Inst == "" {
		return errors.New("global: decode publication: gen, seq and inst are required")
	}
	return nil
}

// checkRoomOps checks one room of a publication: valid ids, states only
// of sessions in its set and valid JSON, deletions only in a delta.
func checkRoomOps(kind string, r *roomOps) error {
	if err := presence.ValidateRoom(r.Room); err != nil {
		return fmt.Errorf("global: decode publication: %w", err)
	}
	for u, ss := range r.Set {
		if err := presence.ValidateUser(u); err != nil {
			return fmt.Errorf("global: decode publication: %w", err)
		}
		for _, s := range ss {
			if err := presence.ValidateSession(s); err != nil {
				return fmt.Errorf("global: decode publication: %w", err)
			}
		}
	}
	for u, states := range r.St {
		ss, ok := r.Set[u]
		if !ok {
			return fmt.Errorf("global: decode publication: state of %s, who is not in set", u)
		}
		for s, st := range states {
			if !slices.Contains(ss, s) {
				return fmt.Errorf("global: decode publication: state of session %s/%s, which is not in set", u, s)
			}
			if len(st) == 0 || len(st) > presence.MaxStateBytes || !json.Valid(st) || string(st) == "null" {
				return fmt.Errorf("global: decode publication: state of %s/%s: not a JSON value of at most %d bytes", u, s, presence.MaxStateBytes)
			}
		}
	}
	if kind == kindFull && len(r.Del) > 0 {
		return errors.New("global: decode publication: a full has no deletions")
	}
	for _, u := range r.Del {
		if err := presence.ValidateUser(u); err != nil {
			return fmt.Errorf("global: decode publication: %w", err)
		}
	}
	return nil
}

// chunkOps splits ops into groups whose JSON stays under budget bytes,
// splitting a large room across groups. Entry sizes are an upper bound of
// their JSON (ids need no escaping), so no group exceeds the budget
// unless one user alone does.
func chunkOps(ops []roomOps, budget int) [][]roomOps {
	var (
		out  [][]roomOps
		cur  []roomOps
		size int
	)
	for _, op := range ops {
		roomCost := len(op.Room) + 32
		// place returns the roomOps of op.Room in the current group,
		// starting a new group when cost would not fit.
		place := func(cost int) *roomOps {
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
				cur = append(cur, roomOps{Room: op.Room})
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

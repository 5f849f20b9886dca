package bigroom

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/presence-dev/presence/presence"
)

// This file is the client side of docs/PROTOCOL.md that the big-room
// scenarios check: folding a room's snapshot, its `members` pages and its
// events (one `event` each, or compact entries of an `events` frame) into
// a view, and comparing views. It does no I/O.

// view is a room as a client without `detail` keeps it: user -> session
// -> state. Without detail a member lists only its sessions that have a
// state, so a member with no state maps to an empty map.
type view map[string]map[string]string

// entry is one event, whether it came alone or in an `events` frame.
type entry struct {
	Seq      uint64
	Kind     presence.Kind
	Reason   presence.Reason
	User     string
	Session  string
	Sessions int
	State    json.RawMessage
}

// parseCompact reads one entry of an `events` frame: [seq, kind, reason,
// user, session, sessions(, state)].
func parseCompact(raw []json.RawMessage) (entry, error) {
	var e entry
	if len(raw) < 6 || len(raw) > 7 {
		return e, fmt.Errorf("events entry with %d fields, want 6 or 7", len(raw))
	}
	var kind, reason string
	for i, dst := range []any{&e.Seq, &kind, &reason, &e.User, &e.Session, &e.Sessions} {
		if err := json.Unmarshal(raw[i], dst); err != nil {
			return e, fmt.Errorf("events entry field %d: %w", i, err)
		}
	}
	e.Kind, e.Reason = presence.Kind(kind), presence.Reason(reason)
	if !e.Kind.Valid() {
		return e, fmt.Errorf("events entry: unknown kind %q", kind)
	}
	if len(raw) == 7 {
		e.State = raw[6]
	}
	if e.Seq == 0 || e.User == "" {
		return e, errors.New("events entry without seq or user")
	}
	return e, nil
}

// eventsFrame is an `events` frame.
type eventsFrame struct {
	Room   string              `json:"room"`
	Region string              `json:"region"`
	Epoch  int64               `json:"epoch"`
	Events [][]json.RawMessage `json:"events"`
}

// parseEvents reads an `events` frame into its entries; entries must be
// in strictly increasing seq order.
func parseEvents(data []byte) (eventsFrame, []entry, error) {
	var f eventsFrame
	if err := json.Unmarshal(data, &f); err != nil {
		return f, nil, err
	}
	es := make([]entry, 0, len(f.Events))
	for _, raw := range f.Events {
		e, err := parseCompact(raw)
		if err != nil {
			return f, nil, err
		}
		if n := len(es); n > 0 && e.Seq <= es[n-1].Seq {
			return f, nil, fmt.Errorf("events frame out of order: seq %d after %d", e.Seq, es[n-1].Seq)
		}
		es = append(es, e)
	}
	return f, es, nil
}

// entryOf is the entry of a single `event` frame's transition.
func entryOf(t presence.Transition) entry {
	return entry{Seq: t.Seq, Kind: t.Kind, Reason: t.Reason, User: t.User, Session: t.Session, Sessions: t.Sessions, State: t.State}
}

// folder keeps one client's view of one room as PROTOCOL.md tells a
// client to: a snapshot replaces it, events apply in order, and `members`
// pages fill in a large room. It counts what the protocol rules out: an
// event at or below the last applied seq (repeated or out of order) and a
// gap in the room's seq (each transition takes the next seq, so a gap is
// a missing event). It is not safe for concurrent use.
type folder struct {
	v       view
	epoch   int64
	seq     uint64            // last seq applied (the snapshot's room_seq, then events)
	base    uint64            // the snapshot's room_seq
	lastSeq map[string]uint64 // per user, the seq of the last event applied
	ready   bool              // a snapshot came
	filter  map[string]bool   // watch list: only these users (nil: everyone)

	// Paging: the next page to ask for, in the generation of the last
	// snapshot (a resync restarts it).
	gen       int
	paging    bool
	nextOff   int
	prevLast  string // last user of the page before
	backoff   int    // how far before the last page's end to ask again after a slip
	pageSlips int

	dups, gaps, missing int // events repeated/out of order; gaps and events missing in them
	resyncs             int
	epochErrs           int
}

func newFolder() *folder { return &folder{v: view{}, lastSeq: map[string]uint64{}} }

// pageLimit is the page size the folder asks for: the snapshot size.
const pageLimit = 1000

// snapshot replaces the view with s (a join's or a resync's). It returns
// whether pages must be read (the snapshot is truncated).
func (f *folder) snapshot(s *presence.Snapshot, resync bool) bool {
	if resync {
		f.resyncs++
	}
	f.v = view{}
	clear(f.lastSeq)
	f.epoch, f.seq, f.base, f.ready = s.Epoch, s.RoomSeq, s.RoomSeq, true
	for _, m := range s.Members {
		f.v[m.User] = sessionsOf(m)
	}
	f.gen++
	f.paging = s.Total > len(s.Members) && f.filter == nil
	f.nextOff, f.backoff = max(len(s.Members)-1, 0), 1
	if len(s.Members) > 0 {
		f.prevLast = s.Members[len(s.Members)-1].User
	}
	return f.paging
}

func sessionsOf(m presence.Member) map[string]string {
	ss := map[string]string{}
	for _, s := range m.Sessions {
		if len(s.State) > 0 {
			ss[s.ID] = string(s.State)
		}
	}
	return ss
}

// page applies a `members` page of generation gen (pages of an earlier
// generation are dropped). Each user on it is taken unless an event for
// that user with a seq above the page's room_seq was applied. It returns
// whether another page must be read, from f.nextOff. A page whose first
// user comes after the last user of the page before means members left or
// joined between the two requests and someone may have slipped between
// them: it is asked again from an earlier offset.
func (f *folder) page(gen int, s *presence.Snapshot) (more bool) {
	if gen != f.gen || !f.paging {
		return false
	}
	if len(s.Members) > 0 && f.prevLast != "" && s.Members[0].User > f.prevLast && s.Offset > 0 {
		f.pageSlips++
		f.backoff = min(f.backoff*8, 4096)
		f.nextOff = max(s.Offset-f.backoff, 0)
		return true
	}
	for _, m := range s.Members {
		if f.lastSeq[m.User] > s.RoomSeq {
			continue
		}
		f.v[m.User] = sessionsOf(m)
	}
	if len(s.Members) == 0 || s.Offset+len(s.Members) >= s.Total || len(s.Members) < pageLimit {
		f.paging = false
		return false
	}
	f.prevLast = s.Members[len(s.Members)-1].User
	f.backoff = 1
	f.nextOff = s.Offset + len(s.Members) - 1
	return true
}

// apply applies one event of epoch. Without a snapshot, or in another
// epoch, nothing is applied (and another epoch is counted: a new epoch
// must come with a resync snapshot).
func (f *folder) apply(epoch int64, e entry) {
	if !f.ready {
		return
	}
	if epoch != f.epoch {
		f.epochErrs++
		return
	}
	if f.filter != nil && !f.filter[e.User] {
		return
	}
	if f.filter != nil {
		// A watch list promises each user's events in seq order, not the
		// room's: two users' events may cross (docs/PROTOCOL.md).
		if e.Seq <= f.base || e.Seq <= f.lastSeq[e.User] {
			f.dups++
			return
		}
		f.seq = max(f.seq, e.Seq)
	} else {
		if e.Seq <= f.seq {
			f.dups++
			return
		}
		if e.Seq > f.seq+1 {
			f.gaps++
			f.missing += int(e.Seq - f.seq - 1)
		}
		f.seq = e.Seq
	}
	f.lastSeq[e.User] = e.Seq
	switch e.Kind {
	case presence.Online:
		f.v[e.User] = map[string]string{}
	case presence.Offline:
		delete(f.v, e.User)
	case presence.Update:
		ss := f.v[e.User]
		if ss == nil {
			ss = map[string]string{}
			f.v[e.User] = ss
		}
		switch e.Reason {
		case presence.Reason("state"):
			if len(e.State) > 0 && string(e.State) != "null" {
				ss[e.Session] = string(e.State)
			} else {
				delete(ss, e.Session)
			}
		case presence.Reason("left"), presence.Reason("expired"):
			delete(ss, e.Session)
		}
		// update/joined adds a session without a state: not listed
		// without detail.
	}
}

// diffViews lists how got differs from want, sorted: users missing,
// users extra, states that differ. Only users in only (nil: all) count.
func diffViews(want, got view, only map[string]bool) []string {
	var d []string
	for u, ws := range want {
		if only != nil && !only[u] {
			continue
		}
		gs, ok := got[u]
		switch {
		case !ok:
			d = append(d, "missing "+u)
		case !sameSessions(ws, gs):
			d = append(d, fmt.Sprintf("state of %s: want %v, got %v", u, ws, gs))
		}
	}
	for u := range got {
		if only != nil && !only[u] {
			continue
		}
		if _, ok := want[u]; !ok {
			d = append(d, "extra "+u)
		}
	}
	slices.Sort(d)
	return d
}

func sameSessions(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// frameKind classifies a frame from its first bytes: the node writes
// "type" first. "" when it cannot tell.
func frameKind(head []byte) string {
	const p = `{"type":"`
	s := string(head)
	if !strings.HasPrefix(s, p) {
		return ""
	}
	s = s[len(p):]
	i := strings.IndexByte(s, '"')
	if i < 0 {
		return ""
	}
	return s[:i]
}

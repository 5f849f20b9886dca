package client

import (
	"encoding/json"
	"maps"
	"slices"

	"github.com/presence-dev/presence/presence"
)

// Member is a user present in a room, as a view keeps it: with detail
// "sessions" every session, otherwise only the sessions that have a
// state.
type Member struct {
	User     string
	Sessions []Session // ordered by id
}

// Session is one session of a member; State is nil when it has none.
type Session struct {
	ID    string
	State json.RawMessage
}

// view folds a snapshot and the events after it into the members a
// client shows, by the rule of docs/PROTOCOL.md, "What a view holds"
// (the browser client and node/fold_test.go follow the same one):
// applying the events to the snapshot gives what a fresh snapshot at the
// same point holds.
type view struct {
	sessions bool // detail "sessions": every session, not only states
	members  map[string]map[string]json.RawMessage
	// An event at or below the snapshot's room_seq is already in it; one
	// at or below the last applied for its user is a repeat (a watch's
	// streams may cross users, never one user's). Both are skipped.
	floor uint64
	seqs  map[string]uint64
}

func newView(sessions bool) *view {
	return &view{sessions: sessions, members: map[string]map[string]json.RawMessage{}, seqs: map[string]uint64{}}
}

// reset replaces the view with snapshot s; keep, when not nil, says which
// users to keep (a watch list).
func (v *view) reset(s *presence.Snapshot, keep func(string) bool) {
	v.members, v.seqs, v.floor = map[string]map[string]json.RawMessage{}, map[string]uint64{}, 0
	if s == nil {
		return
	}
	v.floor = s.RoomSeq
	for _, m := range s.Members {
		if keep != nil && !keep(m.User) {
			continue
		}
		ss := map[string]json.RawMessage{}
		for _, si := range m.Sessions {
			if v.sessions || len(si.State) > 0 {
				ss[si.ID] = si.State
			}
		}
		v.members[m.User] = ss
	}
}

// apply folds one event in; it reports whether the event applied.
func (v *view) apply(t presence.Transition) bool {
	if t.Seq <= v.floor || t.Seq <= v.seqs[t.User] {
		return false
	}
	v.seqs[t.User] = t.Seq
	ss, member := v.members[t.User]
	switch {
	case t.Kind == presence.Online:
		ss = map[string]json.RawMessage{}
		if v.sessions && t.Session != "" {
			ss[t.Session] = nil
		}
		v.members[t.User] = ss
	case t.Kind == presence.Offline:
		delete(v.members, t.User)
	case t.Kind != presence.Update || t.Session == "":
		return false
	case t.Reason == presence.State:
		if !member {
			ss = map[string]json.RawMessage{} // an unknown member is added
			v.members[t.User] = ss
		}
		if len(t.State) > 0 && string(t.State) != "null" {
			ss[t.Session] = t.State
		} else if v.sessions {
			ss[t.Session] = nil
		} else {
			delete(ss, t.Session)
		}
	case t.Reason == presence.Joined && v.sessions:
		if !member {
			ss = map[string]json.RawMessage{}
			v.members[t.User] = ss
		}
		ss[t.Session] = nil
	case (t.Reason == presence.Left || t.Reason == presence.Expired) && member:
		delete(ss, t.Session)
	default:
		return false
	}
	return true
}

// list returns the members ordered by user id, each a copy.
func (v *view) list() []Member {
	out := make([]Member, 0, len(v.members))
	for _, u := range slices.Sorted(maps.Keys(v.members)) {
		ss := v.members[u]
		m := Member{User: u, Sessions: make([]Session, 0, len(ss))}
		for _, id := range slices.Sorted(maps.Keys(ss)) {
			m.Sessions = append(m.Sessions, Session{ID: id, State: slices.Clone(ss[id])})
		}
		out = append(out, m)
	}
	return out
}

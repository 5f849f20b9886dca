package node

import (
	"encoding/json"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
)

// The frames, error codes and close codes are package protocol's; this
// file holds what the node keeps of them for itself.

// detail is what a member of a room is kept up to date with (the join's
// "detail"): by default membership and session states; with
// detailSessions also every session of every member.
type detail uint8

const (
	detailStates detail = iota
	detailSessions
)

// interest is what a member of a room is sent: the join's detail, view
// and batch.
type interest struct {
	detail detail
	count  bool // view "count": the member count, never the members
	batch  bool // the client reads events frames
}

// sessionsOnly reports whether t changes only session lists: a new
// session of a member that is already online (update, joined). Members
// kept at detailStates are not sent it.
func sessionsOnly(t presence.Transition) bool {
	return t.Kind == presence.Update && t.Reason == presence.Joined
}

// forDetail returns s as a member kept at detail d sees it: without
// detailSessions only sessions that have a state are listed, since only
// those do events keep true. s is not modified.
func forDetail(s presence.Snapshot, d detail) presence.Snapshot {
	if d == detailSessions {
		return s
	}
	ms := make([]presence.Member, len(s.Members))
	for i, m := range s.Members {
		ms[i] = m
		ms[i].Sessions = statesOnly(m.Sessions)
	}
	s.Members = ms
	return s
}

// statesOnly returns the sessions that have a state; ss itself when all do.
func statesOnly(ss []presence.SessionInfo) []presence.SessionInfo {
	n := 0
	for _, si := range ss {
		if len(si.State) > 0 {
			n++
		}
	}
	if n == len(ss) {
		return ss
	}
	out := make([]presence.SessionInfo, 0, n)
	for _, si := range ss {
		if len(si.State) > 0 {
			out = append(out, si)
		}
	}
	return out
}

// mustJSON encodes frames built from this package's types, which cannot
// fail to encode.
func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic("node: encoding a frame: " + err.Error())
	}
	return b
}

func encodeError(code protocol.ErrorCode, msg, ref string) []byte {
	return mustJSON(protocol.Error{Type: protocol.TypeError, Code: code, Message: msg, Ref: ref})
}

// eventPrefix begins every event frame encodeEvent makes.
const eventPrefix = `{"type":"event","event":`

// watchFrame is an event frame of a watch list: marked "watch":true, so a
// client that also joined the room tells the two streams apart.
func watchFrame(frame []byte) []byte {
	const watchPrefix = `{"type":"event","watch":true,"event":`
	b := make([]byte, 0, len(frame)+len(watchPrefix)-len(eventPrefix))
	b = append(b, watchPrefix...)
	return append(b, frame[len(eventPrefix):]...)
}

// encodeEvent wraps a version 1 bus event: {"type":"event","event":{...}}.
func encodeEvent(t presence.Transition) ([]byte, error) {
	ev, err := bus.EncodeEvent(t)
	if err != nil {
		return nil, err
	}
	b := make([]byte, 0, len(ev)+27)
	b = append(b, eventPrefix...)
	b = append(b, ev...)
	return append(b, '}'), nil
}

package node

import (
	"encoding/json"
	"strconv"
	"time"

	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
)

// A snapshot frame is encoded for every join, and reflection made it a
// tenth of the node's CPU under join load. appendSnapshot writes the
// bytes json.Marshal writes for the same snapshotFrame (a test compares
// them on random and hostile input): ids pass validation and take the
// fast path; anything that needs escaping or compacting falls back to
// encoding/json for that one value.

// encodeSnapshot is the snapshot frame: a join's reply (ref set) or a
// resync (ref empty, reason set).
func encodeSnapshot(ref, reason string, s presence.Snapshot) []byte {
	return encodeSnapshotBody(ref, reason, s.Room, s.Total > len(s.Members), appendSnapshotBody(make([]byte, 0, 256+len(s.Members)*160), s))
}

// encodeSnapshotBody is encodeSnapshot around a body appendSnapshotBody
// wrote: joiners sharing one read share its body, encoded once.
func encodeSnapshotBody(ref, reason, room string, truncated bool, body []byte) []byte {
	b := make([]byte, 0, 128+len(ref)+len(room)+len(body))
	b = append(b, `{"type":"snapshot"`...)
	if ref != "" {
		b = append(b, `,"ref":`...)
		b = appendString(b, ref)
	}
	b = append(b, `,"room":`...)
	b = appendString(b, room)
	b = append(b, `,"reason":`...)
	b = appendString(b, reason)
	b = append(b, `,"truncated":`...)
	b = strconv.AppendBool(b, truncated)
	b = append(b, `,"snapshot":`...)
	b = append(b, body...)
	return append(b, '}')
}

func appendSnapshotBody(b []byte, s presence.Snapshot) []byte {
	b = append(b, `{"region":`...)
	b = appendString(b, s.Region)
	b = append(b, `,"room":`...)
	b = appendString(b, s.Room)
	b = append(b, `,"at":`...)
	b = appendTime(b, s.At)
	b = append(b, `,"total":`...)
	b = strconv.AppendInt(b, int64(s.Total), 10)
	b = append(b, `,"offset":`...)
	b = strconv.AppendInt(b, int64(s.Offset), 10)
	b = append(b, `,"members":`...)
	if s.Members == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i, m := range s.Members {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendMember(b, m)
		}
		b = append(b, ']')
	}
	b = append(b, `,"room_seq":`...)
	b = strconv.AppendUint(b, s.RoomSeq, 10)
	b = append(b, `,"epoch":`...)
	b = strconv.AppendInt(b, s.Epoch, 10)
	b = append(b, `,"stream_seq":`...)
	b = strconv.AppendUint(b, s.StreamSeq, 10)
	return append(b, '}')
}

func appendMember(b []byte, m presence.Member) []byte {
	b = append(b, `{"user":`...)
	b = appendString(b, m.User)
	b = append(b, `,"until":`...)
	b = appendTime(b, m.Until)
	b = append(b, `,"sessions":`...)
	if m.Sessions == nil {
		return append(b, "null}"...)
	}
	b = append(b, '[')
	for i, s := range m.Sessions {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"id":`...)
		b = appendString(b, s.ID)
		b = append(b, `,"expires":`...)
		b = appendTime(b, s.Expires)
		if len(s.State) > 0 {
			b = append(b, `,"state":`...)
			b = appendRaw(b, s.State)
		}
		b = append(b, '}')
	}
	return append(b, "]}"...)
}

// appendString quotes s the way encoding/json does. Plain printable
// ASCII without '"', '\\' or the HTML characters json escapes is copied.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x80 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return appendJSON(b, s)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// appendRaw writes a state as encoding/json writes a json.RawMessage:
// compacted, HTML characters escaped. State without whitespace, HTML
// characters or non-ASCII is already in that form.
func appendRaw(b []byte, raw json.RawMessage) []byte {
	for _, c := range raw {
		if c <= ' ' || c >= 0x80 || c == '<' || c == '>' || c == '&' {
			return appendJSON(b, raw)
		}
	}
	return append(b, raw...)
}

func appendTime(b []byte, t time.Time) []byte {
	if y := t.Year(); y < 0 || y > 9999 {
		return appendJSON(b, t) // json.Marshal's error case; see appendJSON
	}
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}

// appendJSON is the slow path. Values the node builds always encode; a
// value that does not (a time past year 9999) is written as null rather
// than failing the whole frame.
func appendJSON(b []byte, v any) []byte {
	enc, err := json.Marshal(v)
	if err != nil {
		return append(b, "null"...)
	}
	return append(b, enc...)
}

// encodeEntry is a transition as an entry of an events frame:
// [seq,kind,reason,user,session,sessions] and the state last, only on an
// update that sets one (docs/PROTOCOL.md, "Batched events").
func encodeEntry(t presence.Transition) []byte {
	b := make([]byte, 0, 64+len(t.User)+len(t.Session)+len(t.State))
	b = append(b, '[')
	b = strconv.AppendUint(b, t.Seq, 10)
	b = append(b, ',')
	b = appendString(b, string(t.Kind))
	b = append(b, ',')
	b = appendString(b, string(t.Reason))
	b = append(b, ',')
	b = appendString(b, t.User)
	b = append(b, ',')
	b = appendString(b, t.Session)
	b = append(b, ',')
	b = strconv.AppendInt(b, int64(t.Sessions), 10)
	if t.Kind == presence.Update && t.Reason == presence.State && len(t.State) > 0 {
		b = append(b, ',')
		b = appendRaw(b, t.State)
	}
	return append(b, ']')
}

// encodeEvents is one events frame: the entries of es with a seq above
// after, leaving out session-only ones unless d is detailSessions; nil
// when none is left. es share one epoch.
func encodeEvents(region, room string, es []event, after uint64, d detail) []byte {
	n := 0
	for _, e := range es {
		n += len(e.entry) + 1
	}
	b := make([]byte, 0, 96+len(region)+len(room)+n)
	b = append(b, `{"type":"events","room":`...)
	b = appendString(b, room)
	b = append(b, `,"region":`...)
	b = appendString(b, region)
	b = append(b, `,"epoch":`...)
	if len(es) > 0 {
		b = strconv.AppendInt(b, es[0].epoch, 10)
	} else {
		b = append(b, '0')
	}
	b = append(b, `,"events":[`...)
	first := true
	for _, e := range es {
		if e.seq <= after || e.sessionsOnly && d != detailSessions {
			continue
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = append(b, e.entry...)
	}
	if first {
		return nil
	}
	return append(b, "]}"...)
}

// encodeCount is a count frame: a join's reply (ref and reason set) or a
// change. One per room and tick, shared by its count members: not a hot
// path, so encoding/json writes it.
func encodeCount(ref, reason, room string, count int) []byte {
	return mustJSON(protocol.Count{Type: protocol.TypeCount, Ref: ref, Room: room, Reason: reason, Count: count})
}

// encodeWatching is a watching frame: a watch's reply (ref set) or a
// resync; s is the watched users' presence, absent when the watch ended.
func encodeWatching(ref, reason, room string, users []string, s *presence.Snapshot) []byte {
	return mustJSON(protocol.Watching{Type: protocol.TypeWatching, Ref: ref, Room: room, Reason: reason, Users: users, Snapshot: s})
}

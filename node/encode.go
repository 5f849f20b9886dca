package node

import (
	"encoding/json"
	"strconv"
	"time"

	"github.com/presence-dev/presence/presence"
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
	b := make([]byte, 0, 256+len(s.Members)*160)
	b = append(b, `{"type":"snapshot"`...)
	if ref != "" {
		b = append(b, `,"ref":`...)
		b = appendString(b, ref)
	}
	b = append(b, `,"room":`...)
	b = appendString(b, s.Room)
	b = append(b, `,"reason":`...)
	b = appendString(b, reason)
	b = append(b, `,"truncated":`...)
	b = strconv.AppendBool(b, s.Total > len(s.Members))
	b = append(b, `,"snapshot":`...)
	b = appendSnapshotBody(b, s)
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

package node

import (
	"encoding/json"
	"time"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/presence"
)

// ProtocolVersion is the version of the client protocol in
// docs/PROTOCOL.md, announced in the hello frame.
const ProtocolVersion = 1

// Close codes a node sends. Codes 1000-1015 are RFC 6455's; 4000-4999 are
// the application's own.
const (
	CloseGoingAway    = 1001 // Close without Drain: the node is stopping
	ClosePolicy       = 1008 // persistent rate-limit abuse: back off before reconnecting
	CloseTooBig       = 1009 // a frame was over Limits.MaxFrameBytes
	CloseRestart      = 1012 // Drain: reconnect (elsewhere) with the same session id
	CloseSlowConsumer = 4000 // the client read too slowly; reconnect
	CloseSessionMoved = 4001 // the session was accepted on a newer connection (another node); the session lives on
	CloseTokenExpired = 4002 // the token expired without a refresh; reconnect with a fresh one
	CloseDisconnected = 4003 // the server API disconnected the user; reconnect with a fresh token, after a backoff
	CloseRevoked      = 4004 // the server API revoked the user until the time the reason names; do not reconnect before it
	CloseUnauthorized = 4401 // a browser's handshake failed authentication; the reason says why (instead of a 401 it cannot read)
)

// ErrorCode is the stable code of an error frame.
type ErrorCode string

// Error codes. A client acts on the code, never on the message.
const (
	CodeBadFrame      ErrorCode = "bad_frame"      // not a JSON object of the documented shape, or a binary frame
	CodeUnknownType   ErrorCode = "unknown_type"   // type is not one this version knows
	CodeInvalidRoom   ErrorCode = "invalid_room"   // room missing or not a valid id
	CodeInvalidState  ErrorCode = "invalid_state"  // state missing, not JSON, or over presence.MaxStateBytes
	CodeForbidden     ErrorCode = "forbidden"      // the token does not grant the room
	CodeInvalidToken  ErrorCode = "invalid_token"  // refresh with a token that is bad, expired or for another user
	CodeInvalidPage   ErrorCode = "invalid_page"   // members with an offset or limit out of range
	CodeInvalidDetail ErrorCode = "invalid_detail" // join with a detail other than "sessions"
	CodeTooManyRooms  ErrorCode = "too_many_rooms" // Limits.MaxRooms reached
	CodeNotJoined     ErrorCode = "not_joined"     // leave or state for a room not joined (state: or joined without presence)
	CodeInvalidView   ErrorCode = "invalid_view"   // join with a view other than "members" or "count", detail with count, or a presence change
	CodeInvalidWatch  ErrorCode = "invalid_watch"  // watch without users, too many, an invalid or repeated id, or on the global view
	CodeRateLimited   ErrorCode = "rate_limited"   // frame dropped by the rate limit; slow down
	CodeUnavailable   ErrorCode = "unavailable"    // the store or NATS failed; nothing changed, retry later
	CodeRevoked       ErrorCode = "revoked"        // join of a room the server API revoked the user from, until the time the message names
)

// Frame types.
const (
	typeJoin      = "join"
	typeLeave     = "leave"
	typeState     = "state"
	typePing      = "ping"
	typeRefresh   = "refresh"
	typeMembers   = "members"
	typeWatch     = "watch"
	typeWatching  = "watching"
	typeEvents    = "events"
	typeCount     = "count"
	typeHello     = "hello"
	typeSnapshot  = "snapshot"
	typeEvent     = "event"
	typeLeft      = "left"
	typeStateSet  = "state_set"
	typePong      = "pong"
	typeRefreshed = "refreshed"
	typeError     = "error"
)

// maxRefLen bounds the client's ref, which is echoed.
const maxRefLen = 64

// request is a client frame. Unknown fields are ignored so that a later
// version may add some.
type request struct {
	Type  string          `json:"type"`
	Ref   string          `json:"ref"`
	Room  string          `json:"room"`
	State json.RawMessage `json:"state"`
	Token string          `json:"token"`
	// Detail, on join: "sessions" keeps every member's session list live;
	// absent keeps their states.
	Detail string `json:"detail"`
	// On join: Batch takes events frames; View is "members" (absent) or
	// "count"; Present false follows the room without a session (nil:
	// true).
	Batch   bool   `json:"batch"`
	View    string `json:"view"`
	Present *bool  `json:"present"`
	// Users, on watch: the list; nil when absent.
	Users *[]string `json:"users"`
	// members paging; pointers tell "absent" from 0.
	Offset *int `json:"offset"`
	Limit  *int `json:"limit"`
}

type errorFrame struct {
	Type    string    `json:"type"`
	Code    ErrorCode `json:"code"`
	Message string    `json:"message"`
	Ref     string    `json:"ref,omitempty"`
	// RetryAfterMS, on unavailable, is how long to wait before retrying.
	RetryAfterMS int64 `json:"retry_after_ms,omitempty"`
}

type replyFrame struct {
	Type   string `json:"type"`
	Ref    string `json:"ref,omitempty"`
	Room   string `json:"room,omitempty"`
	Reason string `json:"reason,omitempty"` // on an unasked left: revoked
}

// reasonRevoked marks a left the client did not ask for: a refreshed
// token no longer grants the room.
const reasonRevoked = "revoked"

// refreshedFrame answers a refresh; TokenExpires is absent in dev mode.
type refreshedFrame struct {
	Type         string     `json:"type"`
	Ref          string     `json:"ref,omitempty"`
	TokenExpires *time.Time `json:"token_expires,omitempty"`
}

type helloFrame struct {
	Type    string      `json:"type"`
	V       int         `json:"v"`
	Region  string      `json:"region"`
	User    string      `json:"user"`
	Session string      `json:"session"`
	Limits  helloLimits `json:"limits"`
	// OfflineGraceMS is the region's offline grace: a client that
	// reconnects inside it announces nothing, so it retries often until
	// the grace is nearly over, and backs off further only then.
	OfflineGraceMS int64 `json:"offline_grace_ms"`
	// TokenExpires is when the connection closes with CloseTokenExpired
	// unless a refresh extends it; absent in dev mode.
	TokenExpires *time.Time `json:"token_expires,omitempty"`
}

type helloLimits struct {
	MaxRooms       int     `json:"max_rooms"`
	MaxFrameBytes  int     `json:"max_frame_bytes"`
	MaxStateBytes  int     `json:"max_state_bytes"`
	FrameRate      float64 `json:"frame_rate"`
	FrameBurst     int     `json:"frame_burst"`
	PingIntervalMS int64   `json:"ping_interval_ms"`
	MaxWatches     int     `json:"max_watches"`
	MaxWatchUsers  int     `json:"max_watch_users"`
	TickMS         int64   `json:"tick_ms"`
}

// detail is what a member of a room is kept up to date with (the join's
// "detail"): by default membership and session states; with
// detailSessions also every session of every member.
type detail uint8

const (
	detailStates detail = iota
	detailSessions
)

// detailSessionsName is the join's detail value for detailSessions.
const detailSessionsName = "sessions"

// The join's view values.
const (
	viewMembersName = "members"
	viewCountName   = "count"
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

// Snapshot reasons.
const (
	reasonJoin   = "join"   // reply to a join
	reasonResync = "resync" // the node lost events and starts the room over
	reasonWatch  = "watch"  // reply to a watch
)

type snapshotFrame struct {
	Type      string            `json:"type"`
	Ref       string            `json:"ref,omitempty"`
	Room      string            `json:"room"`
	Reason    string            `json:"reason"`
	Truncated bool              `json:"truncated"`
	Snapshot  presence.Snapshot `json:"snapshot"`
}

// countFrame carries a room's member count (view "count").
type countFrame struct {
	Type   string `json:"type"`
	Ref    string `json:"ref,omitempty"`
	Room   string `json:"room"`
	Reason string `json:"reason,omitempty"`
	Count  int    `json:"count"`
}

// watchingFrame carries a watch list's users and their presence; Snapshot
// is nil when the watch ended.
type watchingFrame struct {
	Type     string             `json:"type"`
	Ref      string             `json:"ref,omitempty"`
	Room     string             `json:"room"`
	Reason   string             `json:"reason"`
	Users    []string           `json:"users"`
	Snapshot *presence.Snapshot `json:"snapshot,omitempty"`
}

// membersFrame answers a members request: one page of a joined room.
type membersFrame struct {
	Type     string            `json:"type"`
	Ref      string            `json:"ref,omitempty"`
	Room     string            `json:"room"`
	Snapshot presence.Snapshot `json:"snapshot"`
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

func encodeError(code ErrorCode, msg, ref string) []byte {
	return mustJSON(errorFrame{Type: typeError, Code: code, Message: msg, Ref: ref})
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

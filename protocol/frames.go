package protocol

import (
	"encoding/json"
	"time"

	"github.com/presence-dev/presence/presence"
)

// Request is a client frame. A node ignores unknown fields, so that a
// later version may add some; fields a request does not use are left out
// when it is encoded.
type Request struct {
	Type  string          `json:"type"`
	Ref   string          `json:"ref,omitempty"`
	Room  string          `json:"room,omitempty"`
	State json.RawMessage `json:"state,omitempty"` // on state: "null" clears it; absent is refused
	Token string          `json:"token,omitempty"` // on refresh
	// Detail, on join: DetailSessions keeps every member's session list
	// live; absent keeps their states.
	Detail string `json:"detail,omitempty"`
	// On join: Batch takes events frames; View is ViewMembers (absent) or
	// ViewCount; Present false follows the room without a session (nil:
	// true).
	Batch   bool   `json:"batch,omitempty"`
	View    string `json:"view,omitempty"`
	Present *bool  `json:"present,omitempty"`
	// Users, on watch: the list (empty ends the watch); nil when absent.
	Users *[]string `json:"users,omitempty"`
	// members paging; pointers tell "absent" from 0.
	Offset *int `json:"offset,omitempty"`
	Limit  *int `json:"limit,omitempty"`
}

// Error is an error frame. It is also a Go error, so a client can hand
// it on as it came.
type Error struct {
	Type    string    `json:"type"`
	Code    ErrorCode `json:"code"`
	Message string    `json:"message"`
	Ref     string    `json:"ref,omitempty"`
	// RetryAfterMS, on unavailable, is how long to wait before retrying.
	RetryAfterMS int64 `json:"retry_after_ms,omitempty"`
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

// RetryAfter is the frame's retry_after_ms as a duration (0 when absent).
func (e *Error) RetryAfter() time.Duration {
	return time.Duration(e.RetryAfterMS) * time.Millisecond
}

// Reply answers leave (left), state (state_set) and ping (pong). An
// unasked left, without a ref, has Reason ReasonRevoked.
type Reply struct {
	Type   string `json:"type"`
	Ref    string `json:"ref,omitempty"`
	Room   string `json:"room,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// Refreshed answers a refresh; TokenExpires is absent in dev mode.
type Refreshed struct {
	Type         string     `json:"type"`
	Ref          string     `json:"ref,omitempty"`
	TokenExpires *time.Time `json:"token_expires,omitempty"`
}

// Hello is the node's first frame on a connection.
type Hello struct {
	Type    string `json:"type"`
	V       int    `json:"v"`
	Region  string `json:"region"`
	User    string `json:"user"`
	Session string `json:"session"`
	Limits  Limits `json:"limits"`
	// OfflineGraceMS is the region's offline grace: a client that
	// reconnects inside it announces nothing, so it retries often until
	// the grace is nearly over, and backs off further only then.
	OfflineGraceMS int64 `json:"offline_grace_ms"`
	// TokenExpires is when the connection closes with CloseTokenExpired
	// unless a refresh extends it; absent in dev mode.
	TokenExpires *time.Time `json:"token_expires,omitempty"`
}

// Limits are the node's limits, announced in hello.
type Limits struct {
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

// Snapshot is a snapshot frame: a join's reply (Ref set, Reason
// ReasonJoin) or unasked (Reason ReasonResync).
type Snapshot struct {
	Type      string            `json:"type"`
	Ref       string            `json:"ref,omitempty"`
	Room      string            `json:"room"`
	Reason    string            `json:"reason"`
	Truncated bool              `json:"truncated"`
	Snapshot  presence.Snapshot `json:"snapshot"`
}

// Count carries a room's member count (view "count"). Every count frame
// is whole: the latest is the count.
type Count struct {
	Type   string `json:"type"`
	Ref    string `json:"ref,omitempty"`
	Room   string `json:"room"`
	Reason string `json:"reason,omitempty"`
	Count  int    `json:"count"`
}

// Watching carries a watch list's users and their presence; Snapshot is
// nil when the watch ended.
type Watching struct {
	Type     string             `json:"type"`
	Ref      string             `json:"ref,omitempty"`
	Room     string             `json:"room"`
	Reason   string             `json:"reason"`
	Users    []string           `json:"users"`
	Snapshot *presence.Snapshot `json:"snapshot,omitempty"`
}

// Members answers a members request: one page of a joined room.
type Members struct {
	Type     string            `json:"type"`
	Ref      string            `json:"ref,omitempty"`
	Room     string            `json:"room"`
	Snapshot presence.Snapshot `json:"snapshot"`
}

// Event is an event frame: one transition of a joined room, or of a watch
// list (Watch true). Event is a bus event, version 1 (docs/BUS.md; package
// bus decodes it).
type Event struct {
	Type  string          `json:"type"`
	Watch bool            `json:"watch,omitempty"`
	Event json.RawMessage `json:"event"`
}

// Events is a batch of one room's events of a tick, to a member that
// joined with batch; each entry decodes with DecodeEntry.
type Events struct {
	Type   string            `json:"type"`
	Room   string            `json:"room"`
	Region string            `json:"region"`
	Epoch  int64             `json:"epoch"`
	Events []json.RawMessage `json:"events"`
}

// Frame is the union of every node-to-client frame: a reader decodes a
// frame into it and acts on Type. Fields a frame does not carry stay
// zero; Snapshot is nil on a frame without one.
type Frame struct {
	Type      string             `json:"type"`
	Ref       string             `json:"ref,omitempty"`
	Room      string             `json:"room,omitempty"`
	Reason    string             `json:"reason,omitempty"`
	Truncated bool               `json:"truncated,omitempty"`
	Snapshot  *presence.Snapshot `json:"snapshot,omitempty"`
	// error
	Code         ErrorCode `json:"code,omitempty"`
	Message      string    `json:"message,omitempty"`
	RetryAfterMS int64     `json:"retry_after_ms,omitempty"`
	// event, events
	Event  json.RawMessage   `json:"event,omitempty"`
	Watch  bool              `json:"watch,omitempty"`
	Events []json.RawMessage `json:"events,omitempty"`
	Region string            `json:"region,omitempty"`
	Epoch  int64             `json:"epoch,omitempty"`
	// count, watching
	Count *int     `json:"count,omitempty"`
	Users []string `json:"users,omitempty"`
	// hello, refreshed
	V              int        `json:"v,omitempty"`
	User           string     `json:"user,omitempty"`
	Session        string     `json:"session,omitempty"`
	Limits         *Limits    `json:"limits,omitempty"`
	OfflineGraceMS int64      `json:"offline_grace_ms,omitempty"`
	TokenExpires   *time.Time `json:"token_expires,omitempty"`
}

// Err returns the frame as an *Error; nil unless Type is TypeError.
func (f *Frame) Err() *Error {
	if f.Type != TypeError {
		return nil
	}
	return &Error{Type: f.Type, Code: f.Code, Message: f.Message, Ref: f.Ref, RetryAfterMS: f.RetryAfterMS}
}

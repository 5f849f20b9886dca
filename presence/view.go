package presence

import (
	"encoding/json"
	"time"
)

// MaxStateBytes bounds a session's state (e.g. {"status":"away"}).
const MaxStateBytes = 1024

// SessionInfo is one live session of a user in a room.
type SessionInfo struct {
	ID      string          `json:"id"`
	Expires time.Time       `json:"expires"`
	State   json.RawMessage `json:"state,omitempty"`
}

// Member is a user present in a room. No sessions means the user's last
// session closed and the offline grace is running.
type Member struct {
	User     string        `json:"user"`
	Until    time.Time     `json:"until"`
	Sessions []SessionInfo `json:"sessions"`
}

// Snapshot is one page of a room's members, ordered by user id.
//
// RoomSeq is the Seq of the last transition the snapshot reflects. Every
// transition of the room with a higher Seq is stored in the stream after
// StreamSeq, so replaying from StreamSeq+1 and skipping the room's
// transitions with Seq <= RoomSeq gives every later change exactly once.
type Snapshot struct {
	Region    string    `json:"region"`
	Room      string    `json:"room"`
	At        time.Time `json:"at"`
	Total     int       `json:"total"` // live members in the room
	Offset    int       `json:"offset"`
	Members   []Member  `json:"members"`
	RoomSeq   uint64    `json:"room_seq"`
	Epoch     int64     `json:"epoch"` // the numbering RoomSeq belongs to; 0 if none yet
	StreamSeq uint64    `json:"stream_seq"`
}

// TouchResult is what a claim (a join) or a refresh (the heartbeat) of
// sessions did.
type TouchResult struct {
	// Transitions the call caused: joins, and departures that were
	// overdue in the rooms it wrote.
	Transitions []Transition
	// Lost are sessions of a refresh that another node has taken over (a
	// client reconnected there); they were not refreshed, and the node
	// that asked no longer holds them.
	Lost []SessionRef
	// Taken are sessions of a claim that another node held until now.
	Taken []SessionRef
	// Orphaned are sessions of a refresh that were taken from the node
	// that asked, or released, and that no node holds now: the taker's
	// connection ended (its client came back here meanwhile). They were
	// not refreshed; a node with a live connection for one claims it again.
	Orphaned []SessionRef
}

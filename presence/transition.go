package presence

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// ErrMoved means another node holds the session now: its client
// reconnected there. The node that asked no longer holds it and must not
// act on it.
var ErrMoved = errors.New("the session moved to another node")

// Kind is what changed about a user in a room.
type Kind string

// Kinds of transition.
const (
	Online  Kind = "online"  // the user's first live session in the room
	Offline Kind = "offline" // the user's last session is gone, after the grace
	Update  Kind = "update"  // a session's state changed; membership did not
)

// Valid reports whether k is a known kind.
func (k Kind) Valid() bool { return k == Online || k == Offline || k == Update }

// Reason says why a transition happened.
type Reason string

// Reasons. Offline carries Left (clean close, grace elapsed), Expired (a
// session was not refreshed: its node died or stalled) or RegionLost (a
// whole region stopped reporting for longer than its down period).
const (
	Joined     Reason = "joined"
	Left       Reason = "left"
	Expired    Reason = "expired"
	State      Reason = "state"
	RegionLost Reason = "region_lost"
)

// Transition is one announced change of a user's presence in a room.
type Transition struct {
	// ID is unique per transition and stable across retries; consumers
	// dedupe on it.
	ID     string
	Region string
	Room   string
	User   string
	Kind   Kind
	Reason Reason
	// Sessions is the number of the user's live sessions in the room
	// after the change.
	Sessions int
	// Seq orders a room's transitions within a region and Epoch; it
	// increases by one per transition. Epoch (unix ms) names the numbering:
	// after a room has been empty for a while its Seq starts again at 1
	// under a later Epoch. Order transitions by (Epoch, Seq).
	Seq   uint64
	Epoch int64
	At    time.Time
	// Session and State are set on Update: the session whose state changed
	// and its new state (nil when cleared).
	Session string
	State   json.RawMessage
}

func (t Transition) String() string {
	return fmt.Sprintf("%s %s/%s %s (%s) sessions=%d seq=%d", t.Kind, t.Room, t.User, t.Reason, t.Region, t.Sessions, t.Seq)
}

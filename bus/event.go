package bus

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/presence-dev/presence/presence"
)

// EventVersion is the version of the event encoding. A consumer rejects a
// version it does not know; fields may be added within a version.
const EventVersion = 1

// Event is the JSON form of a transition on the bus (version 1):
//
//	{"v":1,"id":"eu/room42/1764444000000/17","kind":"offline","reason":"left",
//	 "region":"eu","room":"room42","user":"u_8827","sessions":0,"seq":17,
//	 "epoch":1764444000000,"at":"2025-11-29T19:20:00.123Z"}
//
// id is unique per transition and stable across redelivery: dedupe on it.
// (epoch, seq) orders one room's transitions within a region: seq grows by
// one per transition and restarts at 1 under a later epoch once the room
// has been empty for ten minutes. session and state are present on update.
type Event struct {
	V        int             `json:"v"`
	ID       string          `json:"id"`
	Kind     presence.Kind   `json:"kind"`
	Reason   presence.Reason `json:"reason"`
	Region   string          `json:"region"`
	Room     string          `json:"room"`
	User     string          `json:"user"`
	Sessions int             `json:"sessions"`
	Seq      uint64          `json:"seq"`
	Epoch    int64           `json:"epoch"`
	At       time.Time       `json:"at"`
	Session  string          `json:"session,omitempty"`
	State    json.RawMessage `json:"state,omitempty"`
}

// atLayout is the format of at: RFC 3339 in UTC with exactly three
// fractional digits (milliseconds), zeros kept.
const atLayout = "2006-01-02T15:04:05.000Z"

// MarshalJSON writes at with atLayout; the rest as tagged.
func (e Event) MarshalJSON() ([]byte, error) {
	type wire Event // no methods: no recursion
	return json.Marshal(struct {
		wire
		At string `json:"at"`
	}{wire(e), e.At.UTC().Format(atLayout)})
}

// EncodeEvent returns the version 1 JSON of t.
func EncodeEvent(t presence.Transition) ([]byte, error) {
	if t.ID == "" || !t.Kind.Valid() {
		return nil, fmt.Errorf("bus: encode: transition needs an id and a known kind, got %q %q", t.ID, t.Kind)
	}
	return json.Marshal(Event{
		V: EventVersion, ID: t.ID, Kind: t.Kind, Reason: t.Reason, Region: t.Region, Room: t.Room,
		User: t.User, Sessions: t.Sessions, Seq: t.Seq, Epoch: t.Epoch, At: t.At.UTC(), Session: t.Session, State: t.State,
	})
}

// DecodeEvent parses and checks an event.
func DecodeEvent(data []byte) (presence.Transition, error) {
	var e Event
	if err := json.Unmarshal(data, &e); err != nil {
		return presence.Transition{}, fmt.Errorf("bus: decode event: %w", err)
	}
	if e.V != EventVersion {
		return presence.Transition{}, fmt.Errorf("bus: decode event: version %d, this build reads %d", e.V, EventVersion)
	}
	var err error
	if e.Region != GlobalRegion {
		err = presence.ValidateRegion(e.Region)
	}
	err = errors.Join(err, presence.ValidateRoom(e.Room), presence.ValidateUser(e.User))
	if e.ID == "" {
		err = errors.Join(err, errors.New("missing id"))
	}
	if !e.Kind.Valid() {
		err = errors.Join(err, fmt.Errorf("unknown kind %q", e.Kind))
	}
	if err != nil {
		return presence.Transition{}, fmt.Errorf("bus: decode event: %w", err)
	}
	return presence.Transition{
		ID: e.ID, Region: e.Region, Room: e.Room, User: e.User, Kind: e.Kind, Reason: e.Reason,
		Sessions: e.Sessions, Seq: e.Seq, Epoch: e.Epoch, At: e.At, Session: e.Session, State: e.State,
	}, nil
}

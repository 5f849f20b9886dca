package bus

import (
	"sync"
	"time"

	"github.com/presence-dev/presence/presence"
)

// The flapping detector counts a view's presence events over a sliding
// window, per user and per room, and names the users who come and go.
// Presence events are onlines, offlines and sessions joining, leaving or
// expiring; state updates are not. A user's flaps in a room are the
// returns the window shows: min(arrivals - 1, departures). A client that
// reconnects with a new session id every few seconds flaps at each
// reconnect (its old session departs a grace later, in any order with
// the next arrivals); one tab opened and closed, or a second tab, does
// not. A session that drops and comes back within the offline grace
// with its id is no event at all, so it never counts.
//
// It is a pure core: the clock is injected and nothing runs on its own;
// FlapFeed feeds it from NATS.

// Flapping detector bounds and defaults.
const (
	DefaultFlapWindow = 10 * time.Minute
	// DefaultFlapEvents bounds the events kept; past it the oldest go and
	// the reply's Since says how far back it still reaches.
	DefaultFlapEvents = 100_000
	DefaultFlapTop    = 10
	MaxFlapTop        = 100
)

// flapKind is what an event did to its user's membership.
type flapKind uint8

const (
	flapArrive flapKind = iota + 1
	flapDepart
)

type flapEvent struct {
	at         time.Time
	room, user string
	kind       flapKind
}

// Flapping is the detector. Safe for concurrent use.
type Flapping struct {
	now    func() time.Time
	window time.Duration

	mu      sync.Mutex
	started time.Time
	ring    []flapEvent // oldest at head
	head, n int
}

// NewFlapping returns a detector over window keeping at most max events
// (defaults for values <= 0), reading the time from now (nil: time.Now).
func NewFlapping(window time.Duration, max int, now func() time.Time) *Flapping {
	if window <= 0 {
		window = DefaultFlapWindow
	}
	if max <= 0 {
		max = DefaultFlapEvents
	}
	if now == nil {
		now = time.Now
	}
	return &Flapping{now: now, window: window, started: now(), ring: make([]flapEvent, max)}
}

// kindOf classifies a transition; 0: not a presence event.
func kindOf(t presence.Transition) flapKind {
	switch {
	case t.Kind == presence.Online:
		return flapArrive
	case t.Kind == presence.Offline:
		return flapDepart
	case t.Kind == presence.Update && t.Reason == presence.Joined:
		return flapArrive
	case t.Kind == presence.Update && (t.Reason == presence.Left || t.Reason == presence.Expired):
		return flapDepart
	}
	return 0
}

// Observe records a transition at the detector's now.
func (f *Flapping) Observe(t presence.Transition) {
	if k := kindOf(t); k != 0 {
		f.observe(t.Room, t.User, k)
	}
}

func (f *Flapping) observe(room, user string, k flapKind) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e := flapEvent{at: f.now(), room: room, user: user, kind: k}
	if f.n == len(f.ring) {
		f.ring[f.head] = e
		f.head = (f.head + 1) % len(f.ring)
		return
	}
	f.ring[(f.head+f.n)%len(f.ring)] = e
	f.n++
}

// FlapRequest asks for the detector's report: Room "" for every room,
// else that room's events only; Limit the longest lists (1 to
// MaxFlapTop, 0 means DefaultFlapTop).
type FlapRequest struct {
	Room  string `json:"room"`
	Limit int    `json:"limit"`
}

// FlapRate is events over a set of users and the time covered.
type FlapRate struct {
	Events int `json:"events"`
	Users  int `json:"users"`
	// EventsPerUserPerMinute is Events / Users / minutes covered.
	EventsPerUserPerMinute float64 `json:"events_per_user_per_minute"`
}

// RoomChurn is one room's presence events in the window.
type RoomChurn struct {
	Room string `json:"room"`
	FlapRate
	Flaps int `json:"flaps"`
}

// UserFlaps is one user's presence events and flaps in the window.
type UserFlaps struct {
	User        string `json:"user"`
	Transitions int    `json:"transitions"`
	Flaps       int    `json:"flaps"`
	Rooms       int    `json:"rooms"`
}

// FlapReply is the detector's report. Since is where the events counted
// begin: the window's start, or later while the process is younger than
// the window or the event bound dropped older ones. Rooms are by events,
// most first; Users only those who flapped, by transitions, most first.
type FlapReply struct {
	Region        string      `json:"region"`
	WindowSeconds int         `json:"window_seconds"`
	Since         time.Time   `json:"since"`
	At            time.Time   `json:"at"`
	Overall       FlapRate    `json:"overall"`
	Rooms         []RoomChurn `json:"rooms"`
	Users         []UserFlaps `json:"users"`
}

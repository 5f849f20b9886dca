package oracle

import (
	"fmt"
	"time"
)

// None marks a time that did not happen: a join never acknowledged, a
// connection still open, an event never delivered.
const None time.Duration = -1

// Rounding is how much later than its TTL a session may expire: the store
// keeps session expiry in whole seconds, rounded up.
const Rounding = time.Second

// Timing is the service's timing as the oracle assumes it, plus the
// oracle's own margin. It need not be the timing the nodes really run with:
// a node started with another grace is exactly what the oracle must catch.
type Timing struct {
	TTL       time.Duration // --session-ttl
	Heartbeat time.Duration // --heartbeat
	Grace     time.Duration // --offline-grace
	Reap      time.Duration // --reap-interval
	// Margin absorbs what the harness cannot time exactly: the node
	// processing a frame after the harness sent it, a publish reaching the
	// subscriber, scheduling delays under the race detector. Every bound is
	// widened by it, and the schedule keeps returns and kills out of the
	// ambiguous bands by it.
	Margin time.Duration
	// Lease is the store's publish lease: a transition whose producer died
	// before publishing it is published by a reaper this long after it
	// happened (region.Options.PublishLease).
	Lease time.Duration
	// GapTimeout is how long a node waits for a missing seq before it
	// resyncs a room (node.gapTimeout); used to tell a needed resync from a
	// spurious one.
	GapTimeout time.Duration
}

// TimingA is the short timing of the end-to-end tests.
var TimingA = Timing{TTL: 3 * time.Second, Heartbeat: time.Second, Grace: 1500 * time.Millisecond,
	Reap: 250 * time.Millisecond, Margin: 500 * time.Millisecond, Lease: 5 * time.Second, GapTimeout: time.Second}

// TimingB has the production ratio: heartbeat longer than the grace.
var TimingB = Timing{TTL: 4500 * time.Millisecond, Heartbeat: 1500 * time.Millisecond, Grace: 1200 * time.Millisecond,
	Reap: 250 * time.Millisecond, Margin: 500 * time.Millisecond, Lease: 5 * time.Second, GapTimeout: time.Second}

func (t Timing) String() string {
	return fmt.Sprintf("ttl=%v heartbeat=%v grace=%v reap=%v margin=%v", t.TTL, t.Heartbeat, t.Grace, t.Reap, t.Margin)
}

// Unrefreshed is how long after its holder's last write a session stops
// holding its user against a clean close: 1.5 heartbeats
// (presence.Timing.Unrefreshed).
func (t Timing) Unrefreshed() time.Duration { return t.Heartbeat * 3 / 2 }

// Tail is a session of the user in the room that nothing held any more
// when the user's last held session ended: abandoned at At.
type Tail struct {
	At time.Duration
	// Killed: its node died at At, so nothing of that node was written
	// later; otherwise (a 4001) a live node may still hold its entry,
	// which then holds the user up to its expiry.
	Killed bool
}

// stale is when tail l stops holding its user against a clean close, at
// the latest: a heartbeat and a half after its node's last write (the
// store judges the node's silence, not the session's), or its expiry.
func (t Timing) stale(l Tail) time.Duration {
	if l.Killed {
		return l.At + t.Unrefreshed() + t.Reap + t.Margin
	}
	return t.ExpiryWindow(l.At).Hi
}

// Settled is how long after the last change every departure it can cause
// has certainly been announced: the latest of the two windows' ends.
func (t Timing) Settled() time.Duration {
	return max(t.Grace+t.Reap, t.TTL+Rounding+t.Reap) + t.Margin
}

// Reasons is a set of offline reasons.
type Reasons uint8

// Offline reasons.
const (
	Left Reasons = 1 << iota
	Expired
)

func (r Reasons) String() string {
	switch r {
	case Left:
		return "left"
	case Expired:
		return "expired"
	case Left | Expired:
		return "left|expired"
	}
	return "none"
}

// Has reports whether reason (an event's reason field) is in r.
func (r Reasons) Has(reason string) bool {
	return (reason == "left" && r&Left != 0) || (reason == "expired" && r&Expired != 0)
}

// Window is when and why the offline of a departure is announced by a
// correct service: never before Lo, never after Hi (arrival at a
// subscriber), with one of Reasons. A window that is not Certain is judged
// leniently, and counted: Why says what made it ambiguous.
type Window struct {
	Lo, Hi  time.Duration
	Reasons Reasons
	Certain bool
	Why     string
}

func (w Window) String() string {
	s := fmt.Sprintf("[%v, %v] %v", fmtT(w.Lo), fmtT(w.Hi), w.Reasons)
	if !w.Certain {
		s += " (ambiguous: " + w.Why + ")"
	}
	return s
}

// ReleaseWindow is the departure after the user's last live session was
// released at c (clean close, leave or TCP reset) with no session of a
// recently killed node left: offline, reason left, one grace after c,
// within a reap interval.
func (t Timing) ReleaseWindow(c time.Duration) Window {
	return Window{Lo: c + t.Grace - t.Margin, Hi: c + t.Grace + t.Reap + t.Margin, Reasons: Left, Certain: true}
}

// ExpiryWindow is the departure after the user's last session stopped being
// refreshed at k (its node was killed, or it moved away and nothing took it
// up): the session was last refreshed at most a heartbeat before k, expires
// a TTL after that rounded up to a whole second, and the reaper announces
// it within a reap interval: offline, reason expired.
func (t Timing) ExpiryWindow(k time.Duration) Window {
	return Window{Lo: k + t.TTL - t.Heartbeat - t.Margin, Hi: k + t.TTL + Rounding + t.Reap + t.Margin, Reasons: Expired, Certain: true}
}

// EndKind is how a session stopped being held.
type EndKind uint8

// How holds end.
const (
	// Release: the node released the session (clean close, leave, reset).
	Release EndKind = iota + 1
	// Abandon: nothing refreshes the session any more, it lives out its TTL
	// (its node was killed or crashed, or it closed the connection with
	// 4001/1001/1012, keeping the session).
	Abandon
	// Either: a release sent just before the node died; which one the
	// store saw first cannot be told.
	Either
)

func (k EndKind) String() string {
	switch k {
	case Release:
		return "release"
	case Abandon:
		return "abandon"
	case Either:
		return "release|abandon"
	}
	return "open"
}

// Departure is the window of the offline that follows the end of the
// user's last held session in a room, at end with kind (for Either, k is
// the node's death), given the abandoned sessions of the same user in the
// room that nothing has taken up since (tails) and the latest clean close
// of another session of theirs before end (released, None if none).
//
// A release is announced as left once the grace has ended and every tail
// has gone stale (Unrefreshed after its node's last write): at the
// grace's end for a tail killed more than Unrefreshed - grace before the
// close. An abandon is announced as expired when the latest tail
// expires, unless another session was released so shortly before (within
// a heartbeat) that the abandoned one may not have been refreshed since:
// then it may go stale first, and the departure be left.
func (t Timing) Departure(end time.Duration, kind EndKind, k time.Duration, tails []Tail, released time.Duration) Window {
	latest := None
	for _, l := range tails {
		latest = max(latest, l.At)
	}
	switch kind {
	case Abandon:
		w := t.ExpiryWindow(max(end, latest))
		if released != None && released > end-t.Heartbeat-t.Margin {
			w.Lo = max(end, min(w.Lo, released+t.Grace-t.Margin))
			w.Reasons, w.Certain, w.Why = Left|Expired, false, "kill soon after a clean close of another of the user's sessions"
		}
		return w
	case Either:
		w := t.ReleaseWindow(end)
		w.Hi = max(w.Hi, t.ExpiryWindow(max(k, latest)).Hi)
		w.Reasons, w.Certain, w.Why = Left|Expired, false, "release sent as its node died"
		return w
	}
	w := t.ReleaseWindow(end)
	for _, l := range tails {
		w.Hi = max(w.Hi, t.stale(l))
	}
	return w
}

// ReturnKind is what a correct service announces when a session of the
// user is held again after a departure window opened.
type ReturnKind uint8

// Returns.
const (
	// Silent: the return was acknowledged before the departure could have
	// been announced; nothing at all is announced.
	Silent ReturnKind = iota + 1
	// Flicker: the return was sent after the departure was certainly
	// announced: one offline, then one online.
	Flicker
	// EitherReturn: in between; either nothing, or offline then online.
	EitherReturn
)

// Return classifies a return whose join was sent at send and acknowledged
// at ack, against departure window w.
func (w Window) Return(send, ack time.Duration) ReturnKind {
	switch {
	case ack < w.Lo:
		return Silent
	case send > w.Hi:
		return Flicker
	}
	return EitherReturn
}

func fmtT(d time.Duration) string {
	if d == None {
		return "never"
	}
	return fmt.Sprintf("%.3fs", d.Seconds())
}

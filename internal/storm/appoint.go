package storm

import (
	"sync"
	"time"

	"github.com/presence-dev/presence/presence"
)

// Appointments hold each refused join to its retry hint, so that
// admission does not favour a client that retries early: a join that
// comes back before its appointment is refused again at once, told the
// time left, and takes no token and no place in the limiter's queue;
// only a join at or after its appointment competes for a token. Every
// client then gets one attempt per hint, however often it sends.
//
// A join's appointment is 3/4 of its hint after the refusal: a client
// honouring the hint with its own ±25 % jitter is never early. An
// appointment not yet due stands when the join is refused again (the
// first refusal sets the client's place). Appointments are per node;
// they are forgotten keep after they fell due, and past max entries new
// ones are not kept (the clients are then not held to their hints).
type Appointments struct {
	max  int
	keep time.Duration

	mu    sync.Mutex
	due   map[presence.SessionRef]time.Time
	swept time.Time
}

// NewAppointments returns an empty book of at most max appointments,
// each forgotten keep after it fell due.
func NewAppointments(max int, keep time.Duration) *Appointments {
	return &Appointments{max: max, keep: keep, due: map[presence.SessionRef]time.Time{}}
}

// Set records that a join of ref was refused at now with hint.
func (a *Appointments) Set(ref presence.SessionRef, now time.Time, hint time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sweep(now)
	if d, ok := a.due[ref]; ok && now.Before(d) {
		return
	}
	if len(a.due) >= a.max {
		return
	}
	a.due[ref] = now.Add(hint * 3 / 4)
}

// Early reports whether a join of ref at now comes before its
// appointment, and the time left. A join that is not early uses its
// appointment up.
func (a *Appointments) Early(ref presence.SessionRef, now time.Time) (time.Duration, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	d, ok := a.due[ref]
	if !ok {
		return 0, false
	}
	if now.Before(d) {
		return d.Sub(now), true
	}
	delete(a.due, ref)
	return 0, false
}

// Len is the number of appointments kept.
func (a *Appointments) Len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.due)
}

// sweep forgets, at most once a second, the appointments that fell due
// more than keep ago. a.mu is held.
func (a *Appointments) sweep(now time.Time) {
	if now.Sub(a.swept) < time.Second {
		return
	}
	a.swept = now
	for r, d := range a.due {
		if now.Sub(d) > a.keep {
			delete(a.due, r)
		}
	}
}

package global

import (
	"fmt"
	"time"

	"github.com/presence-dev/presence/presence"
)

// announced is the global view as the stream holds it: per room, the
// members whose last transition is online, and the room's numbering.
// It is the fold of the stream's messages in stream order; applying a
// message at or below through changes nothing, so the leader's own writes
// and the follower's copy of them fold once.
type announced struct {
	rooms   map[string]*annRoom
	through uint64 // every stream message up to this one is folded in
}

// annRoom is one room of the announced view.
type annRoom struct {
	epoch   int64
	seq     uint64
	last    uint64            // stream sequence of the room's newest message
	lastAt  time.Time         // when it was stored
	fresh   bool              // false: a newer message may have expired; renumber
	members map[string]uint64 // user -> stream sequence of their online
	// states are the members' announced session states: user -> session
	// -> state JSON. The stream keeps one update per user, so after a
	// reload only the newest survives and the others are announced again
	// (an update is idempotent).
	states map[string]map[string]string
}

func newAnnounced() *announced { return &announced{rooms: map[string]*annRoom{}} }

func (a *announced) member(room, user string) bool {
	r := a.rooms[room]
	if r == nil {
		return false
	}
	_, ok := r.members[user]
	return ok
}

// states returns the user's announced session states (nil if none).
func (a *announced) states(room, user string) map[string]string {
	if r := a.rooms[room]; r != nil {
		return r.states[user]
	}
	return nil
}

func (a *announced) room(name string) *annRoom {
	r := a.rooms[name]
	if r == nil {
		r = &annRoom{members: map[string]uint64{}}
		a.rooms[name] = r
	}
	return r
}

// apply folds transition t, stored at stream sequence seq at time at. It
// returns the stream sequence of the online message an offline supersedes
// (0 if none): that message is left in the stream until purged.
func (a *announced) apply(t presence.Transition, seq uint64, at time.Time) uint64 {
	if seq <= a.through {
		return 0
	}
	a.through = seq
	r := a.room(t.Room)
	if t.Epoch > r.epoch || t.Epoch == r.epoch && t.Seq > r.seq {
		r.epoch, r.seq = t.Epoch, t.Seq
	}
	r.last, r.lastAt, r.fresh = seq, at, true
	switch t.Kind {
	case presence.Online:
		r.members[t.User] = seq
	case presence.Update:
		if _, ok := r.members[t.User]; !ok {
			break // an update left over from before an offline
		}
		if r.states == nil {
			r.states = map[string]map[string]string{}
		}
		m := r.states[t.User]
		if len(t.State) == 0 {
			delete(m, t.Session)
		} else {
			if m == nil {
				m = map[string]string{}
				r.states[t.User] = m
			}
			m[t.Session] = string(t.State)
		}
		if len(m) == 0 {
			delete(r.states, t.User)
		}
	case presence.Offline:
		delete(r.states, t.User)
		if on, ok := r.members[t.User]; ok {
			delete(r.members, t.User)
			return on
		}
	}
	return 0
}

// skip advances through over a stream message that is not a transition.
func (a *announced) skip(seq uint64) {
	a.through = max(a.through, seq)
}

// settle marks rooms whose newest message is older than half the offline
// retention as not fresh: an offline stored after it may have expired,
// taking the room's true latest Seq with it, so the next transition starts
// a new epoch rather than risk reusing an id.
func (a *announced) settle(now time.Time, retention time.Duration) {
	for _, r := range a.rooms {
		if now.Sub(r.lastAt) >= retention/2 {
			r.fresh = false
		}
	}
}

// next returns the numbering of room's next transition.
func (a *announced) next(room string, now time.Time) (epoch int64, seq uint64) {
	r := a.rooms[room]
	if r == nil {
		return now.UnixMilli(), 1
	}
	if !r.fresh || r.epoch == 0 {
		return max(now.UnixMilli(), r.epoch+1), 1
	}
	return r.epoch, r.seq + 1
}

// transitionID is the id of a global transition: unique per (room,
// epoch, seq), which the stream writes at most once.
func transitionID(room string, epoch int64, seq uint64) string {
	return fmt.Sprintf("%s/%s/%d/%d", "global", room, epoch, seq)
}

// emptyRoomTTL is how long an empty room's numbering is kept in memory;
// a room forgotten starts a new epoch, as the regional store does.
const emptyRoomTTL = 10 * time.Minute

// prune forgets rooms that have had no members for emptyRoomTTL and that
// keep is false for (no region lists anyone in them).
func (a *announced) prune(now time.Time, keep func(room string) bool) {
	for name, r := range a.rooms {
		if len(r.members) == 0 && now.Sub(r.lastAt) >= emptyRoomTTL && !keep(name) {
			delete(a.rooms, name)
		}
	}
}

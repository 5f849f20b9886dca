package bus

import (
	"cmp"
	"slices"
	"time"

	"github.com/presence-dev/presence/presence"
)

// Report checks req and reports the window's events for region.
func (f *Flapping) Report(region string, req FlapRequest) (FlapReply, error) {
	if req.Room != "" {
		if err := presence.ValidateRoom(req.Room); err != nil {
			return FlapReply{}, badRequest("room: %v", err)
		}
	}
	if req.Limit == 0 {
		req.Limit = DefaultFlapTop
	}
	if req.Limit < 0 || req.Limit > MaxFlapTop {
		return FlapReply{}, badRequest("limit must be between 1 and %d, got %d", MaxFlapTop, req.Limit)
	}
	now, events, since := f.inWindow()
	rep := FlapReply{Region: region, WindowSeconds: int(f.window.Seconds()), Since: since.UTC(), At: now.UTC(),
		Rooms: []RoomChurn{}, Users: []UserFlaps{}}
	minutes := max(now.Sub(since).Minutes(), 1)
	t := tally(events, req.Room)
	rep.Overall = rate(t.events, len(t.users), minutes)
	for room, c := range t.rooms {
		rep.Rooms = append(rep.Rooms, RoomChurn{Room: room, FlapRate: rate(c.events, len(c.users), minutes), Flaps: c.flaps})
	}
	slices.SortFunc(rep.Rooms, func(a, b RoomChurn) int {
		return cmp.Or(cmp.Compare(b.Events, a.Events), cmp.Compare(a.Room, b.Room))
	})
	for user, c := range t.users {
		if c.flaps > 0 {
			rep.Users = append(rep.Users, UserFlaps{User: user, Transitions: c.events, Flaps: c.flaps, Rooms: len(c.rooms)})
		}
	}
	slices.SortFunc(rep.Users, func(a, b UserFlaps) int {
		return cmp.Or(cmp.Compare(b.Transitions, a.Transitions), cmp.Compare(b.Flaps, a.Flaps), cmp.Compare(a.User, b.User))
	})
	rep.Rooms = rep.Rooms[:min(len(rep.Rooms), req.Limit)]
	rep.Users = rep.Users[:min(len(rep.Users), req.Limit)]
	return rep, nil
}

// inWindow drops the events older than the window and returns a copy of
// the rest, oldest first, with where they begin.
func (f *Flapping) inWindow() (now time.Time, events []flapEvent, since time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now = f.now()
	cut := now.Add(-f.window)
	for f.n > 0 && f.ring[f.head].at.Before(cut) {
		f.ring[f.head] = flapEvent{}
		f.head = (f.head + 1) % len(f.ring)
		f.n--
	}
	since = f.started
	if f.n == len(f.ring) {
		since = f.ring[f.head].at // the bound dropped older ones
	}
	since = maxTime(since, cut)
	events = make([]flapEvent, f.n)
	for i := range events {
		events[i] = f.ring[(f.head+i)%len(f.ring)]
	}
	return now, events, since
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

type flapCount struct {
	events, flaps int
	users         map[string]struct{} // rooms: who had events
	rooms         map[string]struct{} // users: where
}

type flapTally struct {
	events int
	rooms  map[string]*flapCount
	users  map[string]*flapCount
}

// tally counts events (of room only, unless empty) per room and user,
// and their flaps: per room and user, min(arrivals - 1, departures).
func tally(events []flapEvent, room string) flapTally {
	t := flapTally{rooms: map[string]*flapCount{}, users: map[string]*flapCount{}}
	type moves struct{ arrive, depart int }
	pairs := map[[2]string]*moves{}
	get := func(m map[string]*flapCount, k string) *flapCount {
		c := m[k]
		if c == nil {
			c = &flapCount{users: map[string]struct{}{}, rooms: map[string]struct{}{}}
			m[k] = c
		}
		return c
	}
	for _, e := range events {
		if room != "" && e.room != room {
			continue
		}
		rc, uc := get(t.rooms, e.room), get(t.users, e.user)
		t.events++
		rc.events++
		uc.events++
		rc.users[e.user] = struct{}{}
		uc.rooms[e.room] = struct{}{}
		key := [2]string{e.room, e.user}
		if pairs[key] == nil {
			pairs[key] = &moves{}
		}
		if e.kind == flapDepart {
			pairs[key].depart++
		} else {
			pairs[key].arrive++
		}
	}
	for key, m := range pairs {
		if f := min(m.arrive-1, m.depart); f > 0 {
			t.rooms[key[0]].flaps += f
			t.users[key[1]].flaps += f
		}
	}
	return t
}

// rate is events over users and minutes.
func rate(events, users int, minutes float64) FlapRate {
	r := FlapRate{Events: events, Users: users}
	if users > 0 {
		r.EventsPerUserPerMinute = float64(events) / float64(users) / minutes
	}
	return r
}

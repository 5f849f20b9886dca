package bus

import (
	"testing"
	"time"

	"github.com/presence-dev/presence/presence"
)

// fakeClock is the detector's injected clock.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time      { return c.t }
func (c *fakeClock) add(d time.Duration) { c.t = c.t.Add(d) }
func tr(room, user string, k presence.Kind, r presence.Reason) presence.Transition {
	return presence.Transition{Region: "eu", Room: room, User: user, Kind: k, Reason: r}
}

func newTestFlapping(max int) (*Flapping, *fakeClock) {
	c := &fakeClock{t: time.Date(2026, 1, 2, 15, 0, 0, 0, time.UTC)}
	return NewFlapping(10*time.Minute, max, c.now), c
}

func report(t *testing.T, f *Flapping, req FlapRequest) FlapReply {
	t.Helper()
	rep, err := f.Report("eu", req)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// A user who reconnects with a new session id every few seconds flaps:
// each new session joins and the old one leaves. A steady user, and one
// whose session came back within the grace (no events at all), do not.
func TestFlappingNamesTheUserWhoComesAndGoes(t *testing.T) {
	f, c := newTestFlapping(0)
	f.Observe(tr("lobby", "steady", presence.Online, presence.Joined))
	f.Observe(tr("lobby", "blip", presence.Online, presence.Joined))
	f.Observe(tr("lobby", "flap", presence.Online, presence.Joined))
	for range 6 {
		c.add(3 * time.Second)
		f.Observe(tr("lobby", "flap", presence.Update, presence.Joined))
		f.Observe(tr("lobby", "flap", presence.Update, presence.Left))
		f.Observe(tr("lobby", "steady", presence.Update, presence.State)) // not a presence event
	}
	c.add(2 * time.Minute)
	rep := report(t, f, FlapRequest{})
	if len(rep.Users) != 1 || rep.Users[0].User != "flap" {
		t.Fatalf("users %+v, want flap alone", rep.Users)
	}
	// Seven arrivals, six departures: six returns.
	if u := rep.Users[0]; u.Transitions != 13 || u.Flaps != 6 || u.Rooms != 1 {
		t.Fatalf("flap: %+v, want 13 transitions, 6 flaps, 1 room", u)
	}
	minutes := rep.At.Sub(rep.Since).Minutes()
	if rep.Overall.Events != 15 || rep.Overall.Users != 3 || !near(rep.Overall.EventsPerUserPerMinute, 15/3/minutes) {
		t.Fatalf("overall %+v over %v minutes", rep.Overall, minutes)
	}
	if len(rep.Rooms) != 1 || rep.Rooms[0].Room != "lobby" || rep.Rooms[0].Events != 15 || rep.Rooms[0].Flaps != 6 {
		t.Fatalf("rooms %+v", rep.Rooms)
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

// Events older than the window are gone from the report; while the
// detector is younger than the window, Since is when it started, and a
// rate is over at least a minute.
func TestFlappingWindowSlides(t *testing.T) {
	f, c := newTestFlapping(0)
	start := c.t
	f.Observe(tr("a", "u", presence.Online, presence.Joined))
	f.Observe(tr("a", "u", presence.Offline, presence.Left))
	c.add(10 * time.Second)
	rep := report(t, f, FlapRequest{})
	if !rep.Since.Equal(start) || rep.Overall.Events != 2 || !near(rep.Overall.EventsPerUserPerMinute, 2) {
		t.Fatalf("young detector: %+v", rep)
	}
	c.add(10 * time.Minute)
	f.Observe(tr("b", "v", presence.Online, presence.Joined))
	rep = report(t, f, FlapRequest{})
	if rep.Overall.Events != 1 || len(rep.Rooms) != 1 || rep.Rooms[0].Room != "b" {
		t.Fatalf("after the window: %+v", rep)
	}
	if want := c.t.Add(-10 * time.Minute); !rep.Since.Equal(want) || rep.WindowSeconds != 600 {
		t.Fatalf("since %v, want %v; window %ds", rep.Since, want, rep.WindowSeconds)
	}
}

// Past its bound the detector keeps the newest events, and Since moves
// up to the oldest kept.
func TestFlappingBoundKeepsTheNewest(t *testing.T) {
	f, c := newTestFlapping(4)
	for i := range 10 {
		c.add(time.Second)
		f.Observe(tr("r", "u", presence.Online, presence.Joined))
		if i == 6 {
			f.Observe(tr("r", "u", presence.Offline, presence.Left))
		}
	}
	rep := report(t, f, FlapRequest{})
	if rep.Overall.Events != 4 || !rep.Since.Equal(c.t.Add(-3*time.Second)) {
		t.Fatalf("bounded: %+v (now %v)", rep, c.t)
	}
}

// Departures that come a grace after the next arrivals (a client that
// reconnects with new session ids) are flaps all the same; a second tab,
// or one visit, is not.
func TestFlappingOrderOfArrivalsAndDepartures(t *testing.T) {
	f, _ := newTestFlapping(0)
	f.Observe(tr("r", "flappy", presence.Online, presence.Joined))
	for range 4 {
		f.Observe(tr("r", "flappy", presence.Update, presence.Joined))
	}
	for range 4 {
		f.Observe(tr("r", "flappy", presence.Update, presence.Left))
	}
	f.Observe(tr("r", "tabs", presence.Online, presence.Joined))
	f.Observe(tr("r", "tabs", presence.Update, presence.Joined))
	f.Observe(tr("r", "visit", presence.Online, presence.Joined))
	f.Observe(tr("r", "visit", presence.Offline, presence.Left))
	rep := report(t, f, FlapRequest{})
	if len(rep.Users) != 1 || rep.Users[0].User != "flappy" || rep.Users[0].Flaps != 4 {
		t.Fatalf("users %+v, want flappy with 4 flaps alone", rep.Users)
	}
}

// A room filter counts that room's events only; rooms are sorted by
// events and lists cut at the limit.
func TestFlappingRoomFilterAndLimit(t *testing.T) {
	f, _ := newTestFlapping(0)
	for i, room := range []string{"one", "two", "three"} {
		for range i + 1 {
			f.Observe(tr(room, "u-"+room, presence.Online, presence.Joined))
			f.Observe(tr(room, "u-"+room, presence.Offline, presence.Expired))
		}
	}
	rep := report(t, f, FlapRequest{Limit: 2})
	if len(rep.Rooms) != 2 || rep.Rooms[0].Room != "three" || rep.Rooms[1].Room != "two" {
		t.Fatalf("rooms %+v", rep.Rooms)
	}
	if len(rep.Users) != 2 || rep.Users[0].User != "u-three" || rep.Users[0].Flaps != 2 {
		t.Fatalf("users %+v", rep.Users)
	}
	rep = report(t, f, FlapRequest{Room: "two"})
	if rep.Overall.Events != 4 || len(rep.Rooms) != 1 || len(rep.Users) != 1 || rep.Users[0].User != "u-two" {
		t.Fatalf("room two: %+v", rep)
	}
}

// Bad requests are a 400 with the reason.
func TestFlappingRefusesBadRequests(t *testing.T) {
	f, _ := newTestFlapping(0)
	for _, req := range []FlapRequest{{Limit: -1}, {Limit: MaxFlapTop + 1}, {Room: "bad room"}, {Room: "<script>"}} {
		_, err := f.Report("eu", req)
		if qe := AsQueryError(err); err == nil || qe.Code != CodeBadRequest {
			t.Errorf("%+v: %v, want a 400", req, err)
		}
	}
}

package bus_test

import (
	"testing"
	"time"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/presence"
)

// collected keeps what a watcher (or a replay, in replay_test.go) was
// handed.
type collected struct {
	testkit.Recorder[presence.Transition]
}

func (c *collected) add(t presence.Transition)  { c.Add(t) }
func (c *collected) all() []presence.Transition { return c.All() }

func (c *collected) seqs() []uint64 {
	ts := c.All()
	out := make([]uint64, len(ts))
	for i, t := range ts {
		out[i] = t.Seq
	}
	return out
}

func TestWatchRoom(t *testing.T) {
	e := newEnv(t, "eu")
	var got collected
	sub, err := bus.WatchRoom(e.nc, "eu", "room42", got.add)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	before := bus.MalformedEvents()

	// Live on return: a publish from another connection right away is seen.
	other := newEnvOn(t, connectLike(t, e), "eu")
	if _, err := other.pub.Publish(t.Context(), []presence.Transition{tr("eu", "room42", "u1", presence.Online, 1)}); err != nil {
		t.Fatal(err)
	}
	// Malformed: not JSON, a body of another room, a body of another kind.
	for subj, body := range map[string]string{
		"presence.eu.room42.online.u2":  "garbage",
		"presence.eu.room42.online.u3":  mustEncode(t, tr("eu", "room43", "u3", presence.Online, 9)),
		"presence.eu.room42.offline.u4": mustEncode(t, tr("eu", "room42", "u4", presence.Online, 9)),
	} {
		if err := e.nc.Publish(subj, []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := other.pub.Publish(t.Context(), []presence.Transition{
		tr("eu", "room7", "u1", presence.Online, 1),
		tr("eu", "room42", "u2", presence.Online, 2),
		tr("eu", "room42", "u1", presence.Offline, 3),
	}); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return nSeqs(got.seqs(), 3) })
	if s := got.seqs(); s[0] != 1 || s[1] != 2 || s[2] != 3 {
		t.Fatalf("seqs %v", s)
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.AtLeast("malformed events counted", bus.MalformedEvents()-before, 3) })

	if _, err := bus.WatchRoom(e.nc, "eu", "a.b", got.add); err == nil {
		t.Fatal("watched an invalid room")
	}
	gsub, err := bus.WatchRoom(e.nc, bus.GlobalRegion, "room42", got.add)
	if err != nil {
		t.Fatalf("global view: %v", err)
	}
	_ = gsub.Unsubscribe()
}

func mustEncode(tb testing.TB, t presence.Transition) string {
	tb.Helper()
	b, err := bus.EncodeEvent(t)
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}

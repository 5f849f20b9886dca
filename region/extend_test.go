package region

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
)

func extend(tb testing.TB, s *Store, refs ...presence.SessionRef) int {
	tb.Helper()
	n, err := s.Extend(context.Background(), refs)
	if err != nil {
		tb.Fatalf("Extend: %v", err)
	}
	return n
}

// A session whose holder died, and one released into its grace, both
// outlive their TTL and grace while their clients wait to be admitted
// elsewhere; the join that finally comes is silent. Extending stops, the
// session ends as it would have, announced once.
func TestExtendKeepsWaitingSessionsSilent(t *testing.T) {
	slow(t)
	rdb, _ := testredis.Client(t)
	c := &collector{}
	dead := newStore(t, rdb, c)                  // the old node: never refreshes again
	other := startReaper(t, newStore(t, rdb, c)) // where the clients wait
	crashed, released, quitter := ref("r1", "ann", "tab"), ref("r1", "bob", "tab"), ref("r2", "cid", "tab")
	touch(t, dead, crashed, released, quitter)
	release(t, dead, released)
	start := redisNow(t, rdb)
	// Past the TTL and the grace, twice over.
	for redisNow(t, rdb).Before(start.Add(2*testTiming.SessionTTL + 500*time.Millisecond)) {
		if n := extend(t, other, crashed, released); n != 2 {
			t.Fatalf("extended %d sessions, want 2", n)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got := c.All(); len(got) != 4 { // the three onlines and cid's expiry
		t.Fatalf("transitions while extended: %v, want three onlines and cid's offline", got)
	}
	if off := c.Of(presence.Offline, "r2", "cid"); len(off) != 1 || off[0].Reason != presence.Expired {
		t.Fatalf("cid, never extended: %v, want one offline (expired)", off)
	}
	if m := members(t, other, "r1"); m["ann"] != 1 || m["bob"] != 1 {
		t.Fatalf("members while extended: %v", m)
	}
	touch(t, other, crashed) // admitted at last: silent
	stopped := redisNow(t, rdb)
	testkit.CheckFor(t, testTiming.SessionTTL+testTiming.OfflineGrace+3*time.Second, 10*time.Millisecond, func() error {
		if _, err := other.Refresh(context.Background(), []presence.SessionRef{crashed}); err != nil { // ann's new node lives
			t.Fatalf("Refresh: %v", err)
		}
		return c.WantOf(presence.Offline, "r1", "bob", 1)
	})
	if off := c.Of(presence.Offline, "r1", "bob"); off[0].At.Before(stopped.Add(testTiming.SessionTTL - time.Second)) {
		t.Fatalf("bob left %v after the last extension, want a TTL", off[0].At.Sub(stopped))
	}
	if got := c.Of(presence.Offline, "r1", "ann"); len(got) != 0 {
		t.Fatalf("ann, admitted: %v", got)
	}
}

// Extend creates nothing, revives nothing and shortens nothing; bad input
// writes nothing.
func TestExtendCreatesNothing(t *testing.T) {
	rdb, _ := testredis.Client(t)
	c := &collector{}
	s := newStore(t, rdb, c)
	if n := extend(t, s, ref("r1", "ghost", "tab")); n != 0 {
		t.Fatalf("extended %d unknown sessions", n)
	}
	if keys, _ := rdb.Keys(context.Background(), "presence:{r1}*").Result(); len(keys) != 0 {
		t.Fatalf("keys written for an unknown session: %v", keys)
	}
	touch(t, s, ref("r1", "ann", "a"))
	if n := extend(t, s, ref("r1", "ann", "other"), ref("r1", "bob", "a")); n != 0 {
		t.Fatalf("extended %d sessions that do not exist", n)
	}
	before := untilOf(t, s, "r1", "ann")
	extend(t, s, ref("r1", "ann", "a"))
	if after := untilOf(t, s, "r1", "ann"); after.Before(before) {
		t.Fatalf("until %v shortened to %v", before, after)
	}
	if len(c.All()) != 1 {
		t.Fatalf("transitions: %v, want only the online", c.All())
	}
	for _, bad := range [][]presence.SessionRef{nil, {ref("r:1", "ann", "a")}, {ref("r1", "", "a")}} {
		if _, err := s.Extend(context.Background(), bad); err == nil {
			t.Fatalf("Extend(%v): no error", bad)
		} else if oe := (*OpError)(nil); !errors.As(err, &oe) || oe.Op != "extend" {
			t.Fatalf("Extend(%v): %v, want an extend OpError", bad, err)
		}
	}
}

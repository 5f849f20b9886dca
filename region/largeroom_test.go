package region

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
)

// checkUserIndex fails unless the room's user index lists exactly the
// entries of its session set (or, with want false, does not exist).
func checkUserIndex(tb testing.TB, rdb redis.UniversalClient, s *Store, room string, want bool) {
	tb.Helper()
	ctx := context.Background()
	k := s.roomKeys(room)
	idx, err := rdb.HGetAll(ctx, k[6]).Result()
	if err != nil {
		tb.Fatal(err)
	}
	if !want {
		if len(idx) != 0 {
			tb.Fatalf("room %s has a user index of %d users", room, len(idx))
		}
		return
	}
	entries, err := rdb.ZRange(ctx, k[1], 0, -1).Result()
	if err != nil {
		tb.Fatal(err)
	}
	fromSet := map[string][]string{}
	for _, e := range entries {
		u, sid, _ := strings.Cut(e, ":")
		fromSet[u] = append(fromSet[u], sid)
	}
	fromIdx := map[string][]string{}
	for u, v := range idx {
		fromIdx[u] = strings.Fields(v)
	}
	for _, m := range []map[string][]string{fromSet, fromIdx} {
		for u := range m {
			slices.Sort(m[u])
		}
	}
	if !maps.EqualFunc(fromSet, fromIdx, slices.Equal) {
		tb.Fatalf("room %s: user index disagrees with the session set:\nset   %d users\nindex %d users", room, len(fromSet), len(fromIdx))
	}
}

// A room past 512 sessions keeps a user index, and the rules hold as in
// a small room: a second tab's close is silent, a state update counts the
// user's live sessions, a session that died is dropped from the index,
// and the last close leaves after the grace with reason left.
func TestLargeRoomKeepsAUserIndex(t *testing.T) {
	rdb, _ := testredis.Client(t)
	c := &collector{}
	s := newStore(t, rdb, c)
	ctx := context.Background()
	var refs []presence.SessionRef
	for i := range 500 {
		refs = append(refs, ref("big", fmt.Sprintf("u%04d", i), "a"))
	}
	touch(t, s, refs...)
	checkUserIndex(t, rdb, s, "big", false) // not large yet
	for i := 500; i < 600; i++ {
		refs = append(refs, ref("big", fmt.Sprintf("u%04d", i), "a"))
	}
	second := ref("big", "u0001", "b")
	dying := ref("big", "u0002", "b")
	refs = append(refs, second, dying)
	touch(t, s, refs...)
	checkUserIndex(t, rdb, s, "big", true)

	// u0002's tab b dies: everyone else is refreshed past its expiry.
	alive := slices.DeleteFunc(slices.Clone(refs), func(r presence.SessionRef) bool { return r == dying })
	deadline := time.Now().Add(testTiming.SessionTTL + 2*time.Second)
	for time.Now().Before(deadline) {
		touch(t, s, alive...)
		reap(t, s)
		time.Sleep(testTiming.Heartbeat)
	}
	if m, _, _ := s.Sessions(ctx, "big", "u0002"); len(m.Sessions) != 1 {
		t.Fatalf("u0002 sessions %+v, want the live one", m.Sessions)
	}
	checkUserIndex(t, rdb, s, "big", true)
	if v, _ := rdb.HGet(ctx, s.roomKeys("big")[6], "u0002").Result(); v != "a" {
		t.Fatalf("u0002 in the index: %q, want the live session only", v)
	}

	// Second tab: closing one is silent, the state counts the other.
	before := len(c.All())
	release(t, s, ref("big", "u0001", "a"))
	if _, err := s.SetState(ctx, second, []byte(`"away"`)); err != nil {
		t.Fatal(err)
	}
	upd := c.All()[before:]
	if len(upd) != 1 || upd[0].Kind != presence.Update || upd[0].Sessions != 1 {
		t.Fatalf("after the first tab's close and a state: %v, want one update with 1 session", upd)
	}
	checkUserIndex(t, rdb, s, "big", true)

	// Last tab: left after the grace.
	release(t, s, second)
	release(t, s, ref("big", "u0002", "a"))
	waitRedisPast(t, rdb, time.Now().Add(testTiming.OfflineGrace))
	reap(t, s)
	for _, u := range []string{"u0001", "u0002"} {
		if got := c.Of(presence.Offline, "big", u); len(got) != 1 || got[0].Reason != presence.Left {
			t.Fatalf("%s: offlines %v, want one, reason left", u, got)
		}
	}
	checkUserIndex(t, rdb, s, "big", true)

	// Everyone leaves: the index goes with the last entry.
	for _, r := range alive {
		if r != second && r.User != "u0002" && r != ref("big", "u0001", "a") {
			release(t, s, r)
		}
	}
	waitRedisPast(t, rdb, time.Now().Add(testTiming.OfflineGrace))
	reap(t, s)
	if n := members(t, s, "big"); len(n) != 0 {
		t.Fatalf("%d members left", len(n))
	}
	checkUserIndex(t, rdb, s, "big", false)
}

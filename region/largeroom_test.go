package region

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
)

// checkUserIndex fails unless the room's member index lists exactly the
// members of z, each with their entries of s (or, with want false, does
// not exist).
func checkUserIndex(tb testing.TB, rdb redis.UniversalClient, s *Store, room string, want bool) {
	tb.Helper()
	ctx := context.Background()
	k := s.roomKeys(room)
	idx, err := rdb.ZRange(ctx, k.u, 0, -1).Result()
	if err != nil {
		tb.Fatal(err)
	}
	if !want {
		if len(idx) != 0 {
			tb.Fatalf("room %s has a member index of %d users", room, len(idx))
		}
		return
	}
	users, err := rdb.ZRange(ctx, k.z, 0, -1).Result()
	if err != nil {
		tb.Fatal(err)
	}
	entries, err := rdb.ZRange(ctx, k.s, 0, -1).Result()
	if err != nil {
		tb.Fatal(err)
	}
	fromSets := map[string][]string{}
	for _, u := range users {
		fromSets[u] = []string{}
	}
	for _, e := range entries {
		u, tok, _ := strings.Cut(e, ":") // tok is the session then the code
		if _, ok := fromSets[u]; !ok {
			continue // a dead entry of a user already gone: removed by the next settle
		}
		fromSets[u] = append(fromSets[u], tok)
	}
	fromIdx := map[string][]string{}
	var order []string
	for _, m := range idx {
		f := strings.Fields(m)
		fromIdx[f[0]] = append([]string{}, f[1:]...)
		order = append(order, f[0])
	}
	if !slices.IsSorted(order) {
		tb.Fatalf("room %s: the member index is not in user id order", room)
	}
	for _, m := range []map[string][]string{fromSets, fromIdx} {
		for u := range m {
			slices.Sort(m[u])
		}
	}
	if !maps.EqualFunc(fromSets, fromIdx, slices.Equal) {
		tb.Fatalf("room %s: member index disagrees with the room:\nrooms %d users\nindex %d users", room, len(fromSets), len(fromIdx))
	}
}

// A room past 512 sessions keeps a user index, and the rules hold as in
// a small room: a second tab's close is silent, a state update counts the
// user's live sessions, a session that died is dropped from the index,
// and the last close leaves after the grace with reason left.
func TestLargeRoomKeepsAUserIndex(t *testing.T) {
	slow(t)
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
	checkPages(t, s, "big", 602)

	// u0002's tab b dies: everyone else is refreshed past its expiry.
	alive := slices.DeleteFunc(slices.Clone(refs), func(r presence.SessionRef) bool { return r == dying })
	gone := expiryOf(t, s, dying).Add(time.Second)
	heartbeat := time.NewTicker(testTiming.Heartbeat)
	defer heartbeat.Stop()
	for redisNow(t, rdb).Before(gone) {
		touch(t, s, alive...)
		reap(t, s)
		<-heartbeat.C
	}
	// The dead entry expired at least a second ago. On a loaded machine a
	// slow round of this loop reads as a Redis outage, which holds
	// expiries for OutageHold: keep the others alive until it is past.
	// Every half heartbeat: the sleep comes after the round's work.
	testkit.CheckFor(t, time.Until(gone)+testTiming.OutageHold()+5*time.Second, testTiming.Heartbeat/2, func() error {
		reap(t, s)
		if m, _, _ := s.Sessions(ctx, "big", "u0002"); len(m.Sessions) != 1 {
			touch(t, s, alive...)
			return fmt.Errorf("u0002 sessions %+v, want the live one", m.Sessions)
		}
		return nil
	})
	checkUserIndex(t, rdb, s, "big", true)
	if v, _ := rdb.ZRangeArgs(ctx, redis.ZRangeArgs{Key: s.roomKeys("big").u, Start: "[u0002 ", Stop: "(u0002!", ByLex: true}).Result(); !slices.Equal(v, []string{"u0002 a" + s.code()}) {
		t.Fatalf("u0002 in the index: %q, want the live session only", v)
	}

	// Second tab: closing one is silent; it stays listed through its grace.
	before := len(c.All())
	release(t, s, ref("big", "u0001", "a"))
	if _, err := s.SetState(ctx, second, []byte(`"away"`)); err != nil {
		t.Fatal(err)
	}
	upd := c.All()[before:]
	if len(upd) != 1 || upd[0].Kind != presence.Update || upd[0].Sessions != 2 {
		t.Fatalf("after the first tab's close and a state: %v, want one update with 2 sessions", upd)
	}
	checkUserIndex(t, rdb, s, "big", true)
	checkPages(t, s, "big", 601) // u0001's released tab a is listed

	// A session moves to another node: the index follows the new holder,
	// and the old holder's late release changes nothing.
	other := newStore(t, rdb, c)
	moved := ref("big", "u0003", "a")
	if res, err := other.Claim(ctx, []presence.SessionRef{moved}); err != nil || len(res.Taken) != 1 {
		t.Fatalf("claim in a large room: %+v %v", res, err)
	}
	release(t, s, moved)
	if v, _ := rdb.ZRangeArgs(ctx, redis.ZRangeArgs{Key: s.roomKeys("big").u, Start: "[u0003 ", Stop: "(u0003!", ByLex: true}).Result(); !slices.Equal(v, []string{"u0003 a" + other.code()}) {
		t.Fatalf("u0003 in the index: %q, want the new holder's session", v)
	}
	if res, err := s.Refresh(ctx, []presence.SessionRef{moved}); err != nil || len(res.Lost) != 1 {
		t.Fatalf("old holder's refresh in a large room: %+v %v, want it lost", res, err)
	}
	checkUserIndex(t, rdb, s, "big", true)
	release(t, other, moved)
	touch(t, s, moved) // back on the first node: a claim takes it back

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

// A dead entry of a user already announced gone can outlive the settle
// that announced them (the settle stops at its limit of 1000 users). If
// that session comes back before the next settle, it is a join: one
// online, not a silent member.
func TestLeftoverEntryOfAGoneUserComesBackAsAJoin(t *testing.T) {
	rdb, _ := testredis.Client(t)
	c := &collector{}
	s := newStore(t, rdb, c)
	ctx := context.Background()
	x := ref("r", "ghost", "tab")
	touch(t, s, x)
	// The state a cut-short settle leaves: ghost gone from the members,
	// its entry still in the session set, dead.
	k := s.roomKeys("r")
	if err := rdb.ZRem(ctx, k.z, "ghost").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ZAdd(ctx, k.s, redis.Z{Score: float64(time.Now().Add(-time.Minute).Unix()), Member: "ghost:tab" + s.code()}).Err(); err != nil {
		t.Fatal(err)
	}
	ts := touch(t, s, x)
	if len(ts) != 1 || ts[0].Kind != presence.Online || ts[0].User != "ghost" {
		t.Fatalf("transitions %v, want ghost's online", ts)
	}
	if m := members(t, s, "r"); m["ghost"] != 1 {
		t.Fatalf("members %v", m)
	}
	if ts := touch(t, s, x); len(ts) != 0 {
		t.Fatalf("a refresh announced %v", ts)
	}
}

// checkPages reads the room in pages of 70 and compares them with one
// whole read (Rosters): same members in user id order, same sessions and
// states, and total.
func checkPages(tb testing.TB, s *Store, room string, wantSessions int) {
	tb.Helper()
	ctx := context.Background()
	whole, err := s.Rosters(ctx, []string{room})
	if err != nil {
		tb.Fatal(err)
	}
	var paged []presence.Member
	for off := 0; ; off += 70 {
		p, err := s.Snapshot(ctx, room, off, 70)
		if err != nil {
			tb.Fatal(err)
		}
		if p.Total != whole[0].Total {
			tb.Fatalf("page at %d: total %d, want %d", off, p.Total, whole[0].Total)
		}
		if len(p.Members) == 0 {
			break
		}
		for _, m := range p.Members {
			slices.SortFunc(m.Sessions, func(a, b presence.SessionInfo) int { return strings.Compare(a.ID, b.ID) })
			paged = append(paged, m)
		}
	}
	n := 0
	for _, m := range paged {
		n += len(m.Sessions)
	}
	if !reflect.DeepEqual(paged, whole[0].Members) || n != wantSessions {
		tb.Fatalf("pages: %d members with %d sessions; whole read: %d members; want %d sessions", len(paged), n, len(whole[0].Members), wantSessions)
	}
}

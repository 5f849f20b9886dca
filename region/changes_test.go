package region

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
)

// changes reads the change log from cursor and fails the test unless it
// is complete; it returns the members marked as sorted "room/user" (a
// mark names a user, or an entry added, "user:session" then a code), every
// mark as sorted "room/name", and the next cursor.
func changes(tb testing.TB, s *Store, cursor string) ([]string, []string, string) {
	tb.Helper()
	// A read names again what was marked in its cursor's own millisecond:
	// the clock passes the last mark first, so this read's cursor is
	// after everything marked so far and the next read sees only the new.
	waitRedisPast(tb, s.rdb, redisNow(tb, s.rdb))
	ch, next, ok, err := s.Changes(context.Background(), cursor, 1000)
	if err != nil || !ok {
		tb.Fatalf("Changes(%q): complete %v, %v", cursor, ok, err)
	}
	var users, names []string
	for room, ns := range ch {
		for _, n := range ns {
			u, _, _ := strings.Cut(n, ":")
			names = append(names, room+"/"+n)
			if !slices.Contains(users, room+"/"+u) {
				users = append(users, room+"/"+u)
			}
		}
	}
	sort.Strings(users)
	sort.Strings(names)
	return users, names, next
}

// Every step that changes what a room lists marks its member in the
// change log, and nothing else does: a refresh is not a change.
func TestChangeLogNamesWhatChanged(t *testing.T) {
	rdb, _ := testredis.Client(t)
	// Sessions outlive the test's wait for a grace to end.
	timing := presence.Timing{SessionTTL: 6 * time.Second, Heartbeat: 2 * time.Second, OfflineGrace: time.Second, ReapInterval: 100 * time.Millisecond, LastSeenInterval: 2 * time.Second}
	s := newStore(t, rdb, &collector{}, func(o *Options) { o.Timing = timing })
	ctx := context.Background()
	// Nobody reads the log yet: the writers keep none.
	touch(t, s, ref("r1", "ann", "a"))
	if n, _ := rdb.Exists(ctx, "presence:reap:chg").Result(); n != 0 {
		t.Fatal("a change log is kept with no reader")
	}
	ch, cur, ok, err := s.Changes(ctx, "", 1000)
	if err != nil || ok || ch != nil || cur == "" {
		t.Fatalf("first read: %v %q %v %v, want incomplete with a cursor", ch, cur, ok, err)
	}
	if got, _, _ := changes(t, s, cur); len(got) != 0 {
		t.Fatalf("nothing changed, got %v", got)
	}

	touch(t, s, ref("r1", "bob", "b"), ref("r2", "cat", "c"))
	got, names, cur2 := changes(t, s, cur)
	if !slices.Equal(got, []string{"r1/bob", "r2/cat"}) {
		t.Fatalf("after joins: %v", got)
	}
	// The entries added are named too: a reader looks them up.
	if !slices.Contains(names, "r1/bob:b"+s.code()) || !slices.Contains(names, "r2/cat:c"+s.code()) {
		t.Fatalf("after joins, marks %v lack the entries added", names)
	}
	// A reader that lost its lease without knowing (or a second
	// publisher) reads the log too: it takes nothing from the first.
	if _, again, _ := changes(t, s, cur); !slices.Equal(again, names) {
		t.Fatalf("a second read from the same cursor: %v, want %v", again, names)
	}
	if _, err := s.Refresh(ctx, []presence.SessionRef{ref("r1", "ann", "a"), ref("r1", "bob", "b")}); err != nil {
		t.Fatal(err)
	}
	got, _, cur3 := changes(t, s, cur2)
	if len(got) != 0 {
		t.Fatalf("after refreshes: %v, want nothing", got)
	}
	if _, err := s.SetState(ctx, ref("r1", "ann", "a"), []byte(`{"s":1}`)); err != nil {
		t.Fatal(err)
	}
	release(t, s, ref("r2", "cat", "c"))
	got, names, cur4 := changes(t, s, cur3)
	// A clean close lists the session through the grace, under a
	// released entry, which is named.
	if !slices.Equal(got, []string{"r1/ann", "r2/cat"}) || !slices.Contains(names, "r2/cat:c") {
		t.Fatalf("after a state and a release: %v", names)
	}
	// The grace ends: the reaper's departure is a change.
	waitRedisPast(t, rdb, time.Now().Add(timing.OfflineGrace+1100*time.Millisecond))
	if n := reap(t, s); n == 0 {
		t.Fatal("nothing reaped")
	}
	got, _, cur5 := changes(t, s, cur4)
	if !slices.Contains(got, "r2/cat") {
		t.Fatalf("after cat's departure: %v", got)
	}

	// What MembersOf reads of the named users is what Rosters reads,
	// whether it scans for them or looks up the entries Entries gave.
	rosters, known, err := s.Entries(ctx, []string{"r1", "r2"})
	if err != nil {
		t.Fatal(err)
	}
	if len(known["r1"]) != 2 || len(known["r2"]) != 0 {
		t.Fatalf("entries %v, want ann's and bob's in r1", known)
	}
	for _, want := range []map[string][]string{
		{"r1": {"ann", "bob", "nobody"}, "r2": {"cat"}},
		{"r1": append(slices.Clone(known["r1"]), "nobody"), "r2": {"cat:c:"}},
	} {
		snaps, live, err := s.MembersOf(ctx, want)
		if err != nil {
			t.Fatal(err)
		}
		if len(snaps) != 2 || len(snaps[1].Members) != 0 {
			t.Fatalf("members of %v: %+v", want, snaps)
		}
		if a, b := fmtMembers(snaps[0].Members), fmtMembers(rosters[0].Members); a != b {
			t.Fatalf("members of %v: r1 %s, roster %s", want, a, b)
		}
		sort.Strings(live["r1"])
		sort.Strings(known["r1"])
		if !slices.Equal(live["r1"], known["r1"]) {
			t.Fatalf("members of %v: live entries %v, want %v", want, live["r1"], known["r1"])
		}
	}

	// More changes than asked for: the log cannot say.
	for i := range 5 {
		touch(t, s, ref("r3", fmt.Sprintf("u%d", i), "x"))
	}
	if _, _, ok, _ := s.Changes(ctx, cur5, 4); ok {
		t.Fatal("5 changes reported complete with a limit of 4")
	}
	// Redis lost the log (or nobody read it for ChangesKeep): incomplete.
	if err := rdb.Del(ctx, "presence:reap:chg").Err(); err != nil {
		t.Fatal(err)
	}
	if _, _, ok, _ := s.Changes(ctx, cur5, 1000); ok {
		t.Fatal("a lost log reported complete")
	}
}

func fmtMembers(ms []presence.Member) string {
	out := ""
	for _, m := range ms {
		out += m.User + "["
		for _, si := range m.Sessions {
			out += si.ID + "=" + string(si.State) + " "
		}
		out += "] "
	}
	return out
}

// On a cluster each slot has its own log; one read per master covers them.
func TestClusterChangeLog(t *testing.T) {
	slow(t)
	cc, _ := testredis.Cluster(t, 3)
	s := newStore(t, cc, &collector{})
	ctx := context.Background()
	_, cur, ok, err := s.Changes(ctx, "", 1000)
	if err != nil || ok {
		t.Fatalf("first read: %v %v", ok, err)
	}
	var want []string
	for i := range 30 {
		room := fmt.Sprintf("room%d", i) // spread over the slots of all masters
		touch(t, s, ref(room, "u", "s"))
		want = append(want, room+"/u")
	}
	sort.Strings(want)
	got, _, _ := changes(t, s, cur)
	if !slices.Equal(got, want) {
		t.Fatalf("cluster marks %v, want %v", got, want)
	}
}

package region

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
)

func TestJoinAnnouncesOnceAndRefreshesAreSilent(t *testing.T) {
	rdb, _ := testredis.Client(t)
	c := &collector{}
	s := newStore(t, rdb, c)

	ts := touch(t, s, ref("r1", "alice", "tab1"))
	if len(ts) != 1 || ts[0].Kind != presence.Online || ts[0].Reason != presence.Joined || ts[0].Sessions != 1 {
		t.Fatalf("first touch: got %v, want one online/joined with 1 session", ts)
	}
	if ts[0].ID != "eu/r1/"+fmt.Sprint(ts[0].At.UnixMilli())+"/1" || ts[0].Seq != 1 || ts[0].Region != "eu" {
		t.Fatalf("event id/seq/region: %+v", ts[0])
	}
	if ts[0].Session != "tab1" {
		t.Fatalf("online names session %q, want tab1", ts[0].Session)
	}
	touch(t, s, ref("r1", "alice", "tab2")) // second tab: a new session of a member
	for range 3 {
		touch(t, s, ref("r1", "alice", "tab1"), ref("r1", "alice", "tab2")) // refreshes
	}
	if got := c.Of(presence.Online, "r1", "alice"); len(got) != 1 {
		t.Fatalf("online transitions: got %d, want 1: %v", len(got), got)
	}
	all := c.All()
	if len(all) != 2 || all[1].Kind != presence.Update || all[1].Reason != presence.Joined || all[1].Session != "tab2" || all[1].Sessions != 2 || all[1].State != nil {
		t.Fatalf("transitions: %v, want the online and one update (joined) for tab2 with 2 sessions", all)
	}
	if m := members(t, s, "r1"); m["alice"] != 2 || len(m) != 1 {
		t.Fatalf("members: got %v, want alice with 2 sessions", m)
	}
	us, ok, err := s.Sessions(context.Background(), "r1", "alice")
	if err != nil || !ok || len(us.Sessions) != 2 {
		t.Fatalf("sessions: %+v %v %v", us, ok, err)
	}
}

// Closing one of two tabs keeps the user online: the closed session stays
// listed through its grace, then one update (left) ends it.
func TestSecondTabCloseIsAnUpdateAfterTheGrace(t *testing.T) {
	slow(t)
	rdb, _ := testredis.Client(t)
	c := &collector{}
	s := newStore(t, rdb, c)

	touch(t, s, ref("r1", "bob", "a"), ref("r1", "bob", "b"))
	before := len(c.All())
	release(t, s, ref("r1", "bob", "a"))
	released := redisNow(t, rdb)
	if m := members(t, s, "r1"); m["bob"] != 2 || len(c.All()) != before {
		t.Fatalf("inside the grace: %v, %v; want bob with both sessions listed and no event", m, c.All()[before:])
	}
	// Keep tab b alive well past the grace the close would have started
	// (a session's grace ends on a whole second: up to one more).
	for redisNow(t, rdb).Before(released.Add(testTiming.OfflineGrace + time.Second + 300*time.Millisecond)) {
		touch(t, s, ref("r1", "bob", "b"))
		reap(t, s)
		time.Sleep(50 * time.Millisecond)
	}
	reap(t, s)
	if got := c.Of(presence.Offline, "r1", "bob"); len(got) != 0 {
		t.Fatalf("offline after closing one of two tabs: %v", got)
	}
	if got := c.All()[before:]; len(got) != 1 || got[0].Kind != presence.Update || got[0].Reason != presence.Left || got[0].Session != "a" || got[0].Sessions != 1 {
		t.Fatalf("after the grace: %v, want one update (left) of session a with 1 session", got)
	}
	if m := members(t, s, "r1"); m["bob"] != 1 {
		t.Fatalf("members: got %v, want bob with 1 session", m)
	}
}

func TestBlipInsideGraceIsSilent(t *testing.T) {
	slow(t)
	rdb, _ := testredis.Client(t)
	c := &collector{}
	s := newStore(t, rdb, c)

	touch(t, s, ref("r1", "carol", "tab"))
	release(t, s, ref("r1", "carol", "tab"))
	released := redisNow(t, rdb)
	if m := members(t, s, "r1"); m["carol"] != 1 || len(m) != 1 {
		t.Fatalf("inside grace: got %v, want carol listed with her released session", m)
	}
	touch(t, s, ref("r1", "carol", "tab")) // reconnect, same session id
	waitRedisPast(t, rdb, released.Add(testTiming.OfflineGrace+200*time.Millisecond))
	reap(t, s)
	if got := len(c.All()); got != 1 { // just the join
		t.Fatalf("transitions: got %v, want only the first online", c.All())
	}
	if m := members(t, s, "r1"); m["carol"] != 1 {
		t.Fatalf("members: %v", m)
	}
}

func TestReconnectOnAnotherNodeInsideGraceIsSilent(t *testing.T) {
	slow(t)
	rdb, _ := testredis.Client(t)
	c := &collector{}
	a := newStore(t, rdb, c)
	b := newStore(t, rdb, c)
	startReaper(t, a)
	startReaper(t, b)

	touch(t, a, ref("r1", "dave", "tab"))
	release(t, a, ref("r1", "dave", "tab"))
	released := redisNow(t, rdb)
	touch(t, b, ref("r1", "dave", "tab"))
	// Node b keeps the session alive past the grace, with both reapers running.
	for redisNow(t, rdb).Before(released.Add(testTiming.OfflineGrace + 500*time.Millisecond)) {
		touch(t, b, ref("r1", "dave", "tab"))
		time.Sleep(100 * time.Millisecond)
	}
	if got := len(c.All()); got != 1 {
		t.Fatalf("transitions: got %v, want only the first online", c.All())
	}
}

func TestDepartureAfterGraceByAnotherProcess(t *testing.T) {
	rdb, _ := testredis.Client(t)
	c := &collector{}
	closer := newStore(t, rdb, c) // sees the close, then is gone: it runs no reaper
	touch(t, closer, ref("r1", "erin", "tab"))
	release(t, closer, ref("r1", "erin", "tab"))
	released := redisNow(t, rdb)

	other := newStore(t, rdb, c)
	startReaper(t, other)
	testkit.CheckFor(t, testTiming.OfflineGrace+2*time.Second, 10*time.Millisecond, func() error {
		return c.AtLeastOf(presence.Offline, "r1", "erin", 1)
	})
	off := c.Of(presence.Offline, "r1", "erin")
	if len(off) != 1 || off[0].Reason != presence.Left || off[0].Sessions != 0 {
		t.Fatalf("offline: %v, want one with reason left", off)
	}
	lag := off[0].At.Sub(released)
	if lag < testTiming.OfflineGrace || lag > testTiming.OfflineGrace+testTiming.ReapInterval+150*time.Millisecond {
		t.Fatalf("offline %v after the close, want within [grace, grace+reap interval]", lag)
	}
	if m := members(t, other, "r1"); len(m) != 0 {
		t.Fatalf("members after departure: %v", m)
	}
	// Nothing more comes later.
	reap(t, other)
	if n := len(c.Of(presence.Offline, "r1", "erin")); n != 1 {
		t.Fatalf("offline count: %d", n)
	}
}

func TestCrashExpiresFromReadsAndAnnouncesOnce(t *testing.T) {
	slow(t)
	rdb, _ := testredis.Client(t)
	c := &collector{}
	crashed := newStore(t, rdb, c)
	touch(t, crashed, ref("r1", "fay", "a"), ref("r1", "fay", "b"), ref("r2", "gus", "x"))
	touched := redisNow(t, rdb)
	exp := untilOf(t, crashed, "r1", "fay")
	if d := exp.Sub(touched); d < testTiming.SessionTTL || d > testTiming.SessionTTL+time.Second {
		t.Fatalf("expiry %v after the touch, want the TTL rounded up to a whole second", d)
	}

	// Reads are right without any reaper: the entry drops out when it
	// expires, and a reaper's usual lag (the read slack), in which a
	// reaper would have announced it.
	if n, _ := crashed.Count(context.Background(), "r1"); n != 1 {
		t.Fatalf("count before expiry: %d", n)
	}
	waitRedisPast(t, rdb, exp.Add(crashed.readSlack()))
	if n, _ := crashed.Count(context.Background(), "r1"); n != 0 {
		t.Fatalf("count after expiry with no reaper: %d, want 0", n)
	}
	if m := members(t, crashed, "r2"); len(m) != 0 {
		t.Fatalf("members after expiry: %v", m)
	}

	// Three live processes reap concurrently; each departure comes once.
	started := redisNow(t, rdb)
	var reapers []*Store
	for range 3 {
		reapers = append(reapers, startReaper(t, newStore(t, rdb, c)))
	}
	testkit.CheckFor(t, 2*time.Second, 10*time.Millisecond, func() error {
		return errors.Join(c.AtLeastOf(presence.Offline, "r1", "fay", 1), c.AtLeastOf(presence.Offline, "r2", "gus", 1))
	})
	waitSweeps(t, 3, reapers...) // the other reapers run their sweeps too
	for _, w := range []struct{ room, user string }{{"r1", "fay"}, {"r2", "gus"}} {
		off := c.Of(presence.Offline, w.room, w.user)
		if len(off) != 1 || off[0].Reason != presence.Expired {
			t.Fatalf("%s/%s offline: %v, want exactly one with reason expired", w.room, w.user, off)
		}
		if late := off[0].At.Sub(started); late > testTiming.ReapInterval+150*time.Millisecond {
			t.Fatalf("offline %v after the reapers started, want within one reap interval", late)
		}
	}
	if n, _ := rdb.Exists(context.Background(), "presence:{r1}", "presence:{r1}:s", "presence:{r1}:o", "presence:{r1}:st").Result(); n != 0 {
		t.Fatalf("room keys left after the reaper: %d", n)
	}
}

func TestConcurrentReapersAnnounceEachDepartureOnce(t *testing.T) {
	slow(t)
	rdb, _ := testredis.Client(t)
	c := &collector{}
	w := newStore(t, rdb, c)
	var refs []presence.SessionRef
	for i := range 60 {
		refs = append(refs, ref(fmt.Sprintf("room%d", i%7), fmt.Sprintf("u%d", i), "s1"))
	}
	touch(t, w, refs...)
	for _, r := range refs[:30] {
		release(t, w, r) // half leave cleanly; the rest just expire
	}
	var reapers []*Store
	for range 4 {
		reapers = append(reapers, startReaper(t, newStore(t, rdb, c)))
	}
	testkit.CheckFor(t, testTiming.SessionTTL+3*time.Second, 10*time.Millisecond, func() error {
		return testkit.AtLeast("offlines", offlines(c), 60)
	})
	waitSweeps(t, 3, reapers...)
	for i, r := range refs {
		off := c.Of(presence.Offline, r.Room, r.User)
		want := presence.Expired
		if i < 30 {
			want = presence.Left
		}
		if len(off) != 1 || off[0].Reason != want {
			t.Fatalf("%v: offlines %v, want one with reason %s", r, off, want)
		}
	}
	// Seqs per room are gapless and unique: every event id once.
	ids := map[string]bool{}
	for _, tr := range c.All() {
		if ids[tr.ID] {
			t.Fatalf("duplicate event id %s", tr.ID)
		}
		ids[tr.ID] = true
	}
}

// Only a reaper announces an expiry. A user whose session ran out and
// whose node refreshes it before any reaper announced the expiry (the
// reaper lags, or the region's Redis was out of reach) never left:
// nothing is announced, and reads showed them throughout (see read_cut).
// Once a reaper announced the expiry, a return is a join.
func TestOnlyAReaperAnnouncesAnExpiry(t *testing.T) {
	slow(t)
	rdb, _ := testredis.Client(t)
	c := &collector{}
	s := newStore(t, rdb, c) // no reaper runs
	tab := ref("r1", "hal", "tab")
	touch(t, s, tab)
	waitRedisPast(t, rdb, untilOf(t, s, "r1", "hal"))
	if m := members(t, s, "r1"); len(m) != 1 {
		t.Fatalf("members %v: hal, overdue but unannounced, is still a member for reads", m)
	}
	if _, err := s.Refresh(context.Background(), []presence.SessionRef{tab}); err != nil {
		t.Fatal(err)
	}
	if got := c.All(); len(got) != 1 {
		t.Fatalf("transitions %v, want only the first online", got)
	}
	waitRedisPast(t, rdb, untilOf(t, s, "r1", "hal"))
	reap(t, s)
	touch(t, s, tab) // back after the reaper announced the expiry
	var kinds []string
	for _, tr := range c.All() {
		kinds = append(kinds, string(tr.Kind)+"/"+string(tr.Reason))
	}
	if got := strings.Join(kinds, ","); got != "online/joined,offline/expired,online/joined" {
		t.Fatalf("transitions: %s", got)
	}
}

func TestUndeliveredEventsAreRedeliveredBySomeReaper(t *testing.T) {
	slow(t)
	rdb, _ := testredis.Client(t)
	c := &collector{}
	c.down.Store(true)
	s := newStore(t, rdb, c)
	touch(t, s, ref("r1", "ivy", "tab")) // the online cannot be published
	if len(c.All()) != 0 {
		t.Fatal("sink is down but got events")
	}
	c.down.Store(false)
	reaper := startReaper(t, newStore(t, rdb, c))
	testkit.CheckFor(t, 3*time.Second, 10*time.Millisecond, func() error { return c.WantOf(presence.Online, "r1", "ivy", 1) })
	// Past another lease, and sweeps after it: acked, so not sent again.
	waitRedisPast(t, rdb, redisNow(t, rdb).Add(500*time.Millisecond+testTiming.ReapInterval))
	waitSweeps(t, 3, reaper)
	if n := len(c.All()); n != 1 {
		t.Fatalf("got %d events, want the online once: %v", n, c.All())
	}
	if n, _ := rdb.LLen(context.Background(), "presence:{r1}:o").Result(); n != 0 {
		t.Fatalf("outbox holds %d entries after ack", n)
	}
}

func TestScriptCacheFlushIsSurvived(t *testing.T) {
	rdb, _ := testredis.Client(t)
	c := &collector{}
	s := newStore(t, rdb, c)
	touch(t, s, ref("r1", "jo", "tab"))
	if err := rdb.ScriptFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	touch(t, s, ref("r1", "kim", "tab"))
	if len(c.Of(presence.Online, "r1", "kim")) != 1 {
		t.Fatalf("no online after script flush: %v", c.All())
	}
}

func TestLastSeenIsWrittenOnTransitionsAndRarelyWhileActive(t *testing.T) {
	slow(t)
	rdb, _ := testredis.Client(t)
	c := &collector{}
	s := newStore(t, rdb, c)
	ctx := context.Background()
	if _, ok, err := s.LastSeen(ctx, "liz"); ok || err != nil {
		t.Fatalf("last seen before any activity: %v %v", ok, err)
	}
	touch(t, s, ref("r1", "liz", "tab"))
	if got := s.Stats().LastSeenWrites.Load(); got != 1 {
		t.Fatalf("writes after join: %d, want 1", got)
	}
	// 3 s of heartbeats every 100 ms: 30 refreshes, one write per second.
	start := time.Now()
	touches := 0
	for time.Since(start) < 3*time.Second {
		touch(t, s, ref("r1", "liz", "tab"))
		touches++
		time.Sleep(100 * time.Millisecond)
	}
	active := s.Stats().LastSeenWrites.Load() - 1
	if active < 2 || active > 4 {
		t.Fatalf("%d last-seen writes over %d heartbeats in 3s with a 1s interval, want 2..4", active, touches)
	}
	release(t, s, ref("r1", "liz", "tab"))
	before := s.Stats().LastSeenWrites.Load()
	startReaper(t, s)
	testkit.CheckFor(t, 3*time.Second, 10*time.Millisecond, func() error { return c.WantOf(presence.Offline, "r1", "liz", 1) })
	testkit.CheckFor(t, time.Second, 10*time.Millisecond, func() error {
		return testkit.Want("last-seen writes, with the departure's", s.Stats().LastSeenWrites.Load(), before+1)
	})
	seen, ok, err := s.LastSeen(ctx, "liz")
	if err != nil || !ok || !seen.Equal(c.Of(presence.Offline, "r1", "liz")[0].At.Truncate(time.Second)) {
		t.Fatalf("last seen %v %v %v, want the departure time", seen, ok, err)
	}
}

func TestSweepVisitsOnlyDueRooms(t *testing.T) {
	slow(t)
	rdb, _ := testredis.Client(t)
	c := &collector{}
	s := newStore(t, rdb, c)
	var refs []presence.SessionRef
	for i := range 500 {
		refs = append(refs, ref(fmt.Sprintf("busy%d", i), "u", "s"))
	}
	touch(t, s, refs...)
	touch(t, s, ref("quiet", "v", "s"))
	release(t, s, ref("quiet", "v", "s"))
	reap(t, s)
	if n := s.Stats().ReapedRooms.Load(); n != 0 {
		t.Fatalf("sweep with nothing due ran %d room scripts", n)
	}
	waitRedisPast(t, rdb, redisNow(t, rdb).Add(testTiming.OfflineGrace+10*time.Millisecond))
	touch(t, s, refs...) // the busy rooms stay live
	reap(t, s)
	if n := s.Stats().ReapedRooms.Load(); n != 1 {
		t.Fatalf("sweep with one due room among 501 ran %d room scripts", n)
	}
	if len(c.Of(presence.Offline, "quiet", "v")) != 1 {
		t.Fatal("quiet room's departure not announced")
	}
}

func TestBadInputWritesNothing(t *testing.T) {
	rdb, _ := testredis.Client(t)
	s := newStore(t, rdb, &collector{}, func(o *Options) { o.MaxBatch = 5 })
	ctx := context.Background()
	cases := []struct {
		name string
		refs []presence.SessionRef
		want error
	}{
		{"empty", nil, ErrEmptyBatch},
		{"oversized", make([]presence.SessionRef, 6), ErrBatchTooLarge},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.Claim(ctx, tc.refs)
			var op *OpError
			if !errors.Is(err, tc.want) || !errors.As(err, &op) || op.Op != "claim" {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
	for _, bad := range []presence.SessionRef{
		ref("r.1", "u", "s"), ref("r1", "u*", "s"), ref("r1", "u", "s>"), ref("r 1", "u", "s"),
		ref("{r1}", "u", "s"), ref("r1", "", "s"), ref("r1", "u", strings.Repeat("s", 65)), ref("r1", "a:b", "s"),
	} {
		t.Run(fmt.Sprintf("%q/%q/%q", bad.Room, bad.User, bad.Session), func(t *testing.T) {
			_, err := s.Claim(ctx, []presence.SessionRef{ref("ok", "u", "s"), bad})
			var idErr *presence.IDError
			if !errors.As(err, &idErr) || !strings.Contains(err.Error(), "session 2 of 2") {
				t.Fatalf("%+v: got %v, want an id error naming the entry", bad, err)
			}
			if err := s.Release(ctx, bad); !errors.As(err, &idErr) {
				t.Fatalf("release %+v: got %v", bad, err)
			}
		})
	}
	if _, err := s.Snapshot(ctx, "a.b", 0, 10); err == nil {
		t.Fatal("snapshot accepted a bad room")
	}
	if _, err := s.Snapshot(ctx, "ok", -1, 10); err == nil {
		t.Fatal("snapshot accepted a negative offset")
	}
	if _, _, err := s.Sessions(ctx, "ok", "a b"); err == nil {
		t.Fatal("sessions accepted a bad user")
	}
	if _, err := s.SetState(ctx, ref("ok", "u", "s"), []byte("{bad")); err == nil {
		t.Fatal("set state accepted bad JSON")
	}
	if _, err := s.SetState(ctx, ref("ok", "u", "s"), []byte(`"`+strings.Repeat("x", 1100)+`"`)); err == nil {
		t.Fatal("set state accepted 1 KiB+")
	}
	if n, _ := rdb.DBSize(ctx).Result(); n != 0 {
		t.Fatalf("bad input wrote %d keys", n)
	}
}

// A Redis failure is an error, not a panic. (Slow: the client retries.)
func TestRedisDownIsAnError(t *testing.T) {
	slow(t)
	rdb, srv := testredis.Client(t)
	s := newStore(t, rdb, &collector{})
	ctx := context.Background()
	srv.Stop()
	_, err := s.Claim(ctx, []presence.SessionRef{ref("r1", "u", "s")})
	var op *OpError
	if !errors.As(err, &op) {
		t.Fatalf("touch with redis down: %v", err)
	}
	if _, err := s.reap(ctx, 0); err == nil {
		t.Fatal("reap with redis down: no error")
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	rdb, _ := testredis.Client(t)
	for _, tc := range []struct {
		name  string
		o     Options
		field string
	}{
		{"no region", Options{Sink: &collector{}}, "region"},
		{"no sink", Options{Region: "eu"}, "sink"},
		{"bad timing", Options{Region: "eu", Sink: &collector{}, Timing: presence.Timing{Heartbeat: time.Minute}}, "heartbeat"},
		{"long lease", Options{Region: "eu", Sink: &collector{}, PublishLease: 2 * time.Minute}, "publish lease"},
		{"brace in prefix", Options{Region: "eu", Sink: &collector{}, Prefix: "a{b"}, "prefix"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(rdb, tc.o)
			var ce *presence.ConfigError
			if !errors.As(err, &ce) || ce.Field != tc.field || !strings.Contains(err.Error(), "config: "+tc.field) {
				t.Fatalf("New(%+v): %v, want a config error about %s", tc.o, err, tc.field)
			}
		})
	}
	if _, err := New(nil, Options{Region: "eu", Sink: &collector{}}); err == nil {
		t.Fatal("New accepted a nil client")
	}
}

func TestConcurrentTouchAndRelease(t *testing.T) {
	rdb, _ := testredis.Client(t)
	c := &collector{}
	s := newStore(t, rdb, c)
	startReaper(t, s)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				r := ref("hot", fmt.Sprintf("u%d", i%10), fmt.Sprintf("s%d", g))
				if _, err := s.Claim(context.Background(), []presence.SessionRef{r}); err != nil {
					t.Error(err)
					return
				}
				if i%3 == 0 {
					if err := s.Release(context.Background(), r); err != nil {
						t.Error(err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	// Every user touched is online exactly once, however the tabs raced.
	for i := range 10 {
		if n := len(c.Of(presence.Online, "hot", fmt.Sprintf("u%d", i))); n != 1 {
			t.Fatalf("u%d: %d onlines", i, n)
		}
	}
}

func TestStateUpdateIsNotALeaveAndJoin(t *testing.T) {
	rdb, _ := testredis.Client(t)
	c := &collector{}
	s := newStore(t, rdb, c)
	ctx := context.Background()
	if ok, err := s.SetState(ctx, ref("r1", "mo", "tab"), []byte(`{"status":"away"}`)); ok || err != nil {
		t.Fatalf("state of an unknown session: %v %v", ok, err)
	}
	touch(t, s, ref("r1", "mo", "tab"), ref("r1", "mo", "tab2"))
	if ok, err := s.SetState(ctx, ref("r1", "mo", "tab"), []byte(`{ "status" : "away" }`)); !ok || err != nil {
		t.Fatalf("SetState: %v %v", ok, err)
	}
	if ok, _ := s.SetState(ctx, ref("r1", "mo", "tab"), []byte(`{"status":"away"}`)); !ok {
		t.Fatal("same state again: not found")
	}
	ts := c.All()[1:] // after the online and tab2's update (joined)
	if len(ts) != 2 || ts[1].Kind != presence.Update || ts[1].Reason != presence.State || ts[1].Session != "tab" ||
		string(ts[1].State) != `{"status":"away"}` || ts[1].Sessions != 2 {
		t.Fatalf("transitions: %+v, want online then one update (an unchanged state is silent)", ts)
	}
	m, ok, err := s.Sessions(ctx, "r1", "mo")
	if err != nil || !ok || len(m.Sessions) != 2 {
		t.Fatalf("sessions: %+v %v %v", m, ok, err)
	}
	for _, si := range m.Sessions {
		if si.ID == "tab" && string(si.State) != `{"status":"away"}` {
			t.Fatalf("state not stored: %+v", si)
		}
	}
	if ok, _ := s.SetState(ctx, ref("r1", "mo", "tab"), nil); !ok {
		t.Fatal("clear state: not found")
	}
	if ts := c.All(); len(ts) != 4 || ts[3].Kind != presence.Update || ts[3].State != nil {
		t.Fatalf("clear: %+v", ts)
	}
	// A released session keeps its state through the grace.
	if ok, _ := s.SetState(ctx, ref("r1", "mo", "tab"), []byte(`"away"`)); !ok {
		t.Fatal("state again: not found")
	}
	release(t, s, ref("r1", "mo", "tab"))
	if n, _ := rdb.HLen(ctx, "presence:{r1}:st").Result(); n != 1 {
		t.Fatalf("the released session's state: %d fields, want 1", n)
	}
	m, _, _ = s.Sessions(ctx, "r1", "mo")
	i := slices.IndexFunc(m.Sessions, func(si presence.SessionInfo) bool { return si.ID == "tab" })
	if len(m.Sessions) != 2 || i < 0 || string(m.Sessions[i].State) != `"away"` {
		t.Fatalf("inside the grace: %+v, want tab listed with its state", m.Sessions)
	}
}

func TestSnapshotPagesAndStreamSeq(t *testing.T) {
	rdb, _ := testredis.Client(t)
	c := &collector{}
	s := newStore(t, rdb, c)
	ctx := context.Background()
	var refs []presence.SessionRef
	for i := range 25 {
		refs = append(refs, ref("big", fmt.Sprintf("u%02d", i), "a"))
	}
	refs = append(refs, ref("big", "u03", "b"))
	touch(t, s, refs...)
	if _, err := s.SetState(ctx, ref("big", "u03", "b"), []byte(`{"typing":true}`)); err != nil {
		t.Fatal(err)
	}
	var users []string
	for off := 0; off < 25; off += 10 {
		snap, err := s.Snapshot(ctx, "big", off, 10)
		if err != nil {
			t.Fatal(err)
		}
		// 25 onlines, u03's second session (update, joined), its state
		if snap.Total != 25 || snap.RoomSeq != 27 || snap.StreamSeq != 27 {
			t.Fatalf("snapshot total/seqs: %d %d %d, want 25 27 27", snap.Total, snap.RoomSeq, snap.StreamSeq)
		}
		for _, m := range snap.Members {
			users = append(users, m.User)
			if m.User == "u03" && (len(m.Sessions) != 2 || string(m.Sessions[1].State) != `{"typing":true}`) {
				t.Fatalf("u03: %+v", m)
			}
		}
	}
	if len(users) != 25 || users[0] != "u00" || users[24] != "u24" {
		t.Fatalf("paged users: %v", users)
	}
}

func TestRoomsListsEveryNonEmptyRoom(t *testing.T) {
	rdb, _ := testredis.Client(t)
	s := newStore(t, rdb, &collector{})
	ctx := context.Background()
	touch(t, s, ref("b", "u", "1"), ref("a", "u", "1"), ref("c", "v", "1"))
	release(t, s, ref("c", "v", "1")) // in grace: still a room
	rooms, err := s.Rooms(ctx)
	if err != nil || strings.Join(rooms, ",") != "a,b,c" {
		t.Fatalf("Rooms: %v %v", rooms, err)
	}
	if testing.Short() {
		t.Skip("the cluster half is slow")
	}
	cc, _ := testredis.Cluster(t, 3)
	cs := newStore(t, cc, &collector{})
	var refs []presence.SessionRef
	for i := range 40 {
		refs = append(refs, ref(fmt.Sprintf("r%02d", i), "u", "1"))
	}
	touch(t, cs, refs...)
	rooms, err = cs.Rooms(ctx)
	if err != nil || len(rooms) != 40 || rooms[0] != "r00" || rooms[39] != "r39" {
		t.Fatalf("cluster Rooms: %d %v", len(rooms), err)
	}
}

// Rosters reads whole rooms in bulk and agrees with Snapshot on every
// member, session, state and sequence, on a single server and on a
// cluster (rooms on every master, one pipeline split per node).
func TestRostersAgreeWithSnapshots(t *testing.T) {
	for name, start := range map[string]func(*testing.T) redis.UniversalClient{
		"single": func(t *testing.T) redis.UniversalClient { c, _ := testredis.Client(t); return c },
		"cluster": func(t *testing.T) redis.UniversalClient {
			slow(t)
			c, _ := testredis.Cluster(t, 3)
			return c
		},
	} {
		t.Run(name, func(t *testing.T) {
			s := newStore(t, start(t), &collector{})
			ctx := context.Background()
			var refs []presence.SessionRef
			var rooms []string
			for r := range 150 { // more than one batch
				room := fmt.Sprintf("r%03d", r)
				rooms = append(rooms, room)
				for u := range r%4 + 1 {
					refs = append(refs, ref(room, fmt.Sprintf("u%d", u), "a"), ref(room, fmt.Sprintf("u%d", u), "b"))
				}
			}
			touch(t, s, refs...)
			if _, err := s.SetState(ctx, ref("r003", "u2", "b"), []byte(`{"x":"a|b:c"}`)); err != nil {
				t.Fatal(err)
			}
			release(t, s, ref("r001", "u1", "a"))
			release(t, s, ref("r001", "u1", "b")) // in grace: listed with both released sessions
			rooms = append(rooms, "empty")
			got, err := s.Rosters(ctx, rooms)
			if err != nil || len(got) != len(rooms) {
				t.Fatalf("Rosters: %d %v", len(got), err)
			}
			for i, room := range rooms {
				want, err := s.Snapshot(ctx, room, 0, 1000)
				if err != nil {
					t.Fatal(err)
				}
				for j := range want.Members {
					slices.SortFunc(want.Members[j].Sessions, func(a, b presence.SessionInfo) int { return strings.Compare(a.ID, b.ID) })
				}
				g := got[i]
				g.At, want.At = time.Time{}, time.Time{}
				if !reflect.DeepEqual(g, want) {
					t.Fatalf("room %s:\nroster   %+v\nsnapshot %+v", room, g, want)
				}
			}
			if m := got[1].Members[1]; m.User != "u1" || len(m.Sessions) != 2 {
				t.Fatalf("member in grace: %+v", m)
			}
			if st := got[3].Members[2].Sessions[1].State; string(st) != `{"x":"a|b:c"}` {
				t.Fatalf("state %s", st)
			}
			if _, err := s.Rosters(ctx, []string{"ok", "a.b"}); err == nil {
				t.Fatal("an invalid room was accepted")
			}
		})
	}
}

// Start runs the reaper once however often it is called; Close stops it
// for good and may be called again.
func TestStartAndCloseOwnTheReaper(t *testing.T) {
	rdb, _ := testredis.Client(t)
	s := newStore(t, rdb, &collector{})
	s.Start()
	s.Start()
	waitSweeps(t, 2, s)
	s.Close()
	s.Close()
	s.Start() // after Close: nothing
	sweeps := s.Stats().Sweeps.Load()
	// Three reap intervals with no sweep: a reaper still running sweeps
	// every interval.
	testkit.Holds(t, 3*testTiming.ReapInterval, testTiming.ReapInterval/4, func() error {
		return testkit.Want("sweeps after Close", s.Stats().Sweeps.Load(), sweeps)
	})
}

// With the reaper late, reads leave out a user whose grace ended more than
// the read slack ago, and a session whose grace did. A join then settles
// them first, so the stream agrees with what readers saw: offline then
// online for the user, update (left) then update (joined) for the session.
func TestAJoinAfterAnUnreapedGraceFollowsTheReads(t *testing.T) {
	rdb, _ := testredis.Client(t)
	c := &collector{}
	s := newStore(t, rdb, c) // no reaper runs
	touch(t, s, ref("r1", "ann", "tab"), ref("r1", "bo", "a"), ref("r1", "bo", "b"))
	release(t, s, ref("r1", "ann", "tab"))
	release(t, s, ref("r1", "bo", "a"))
	waitRedisPast(t, rdb, redisNow(t, rdb).Add(testTiming.OfflineGrace+time.Second+s.readSlack()+100*time.Millisecond))
	// The heartbeat of bo's other tab settles nothing.
	if _, err := s.Refresh(context.Background(), []presence.SessionRef{ref("r1", "bo", "b")}); err != nil {
		t.Fatal(err)
	}
	if m := members(t, s, "r1"); m["ann"] != 0 || m["bo"] != 1 {
		t.Fatalf("reads: %v, want ann gone and bo with tab b only", m)
	}
	before := len(c.All())
	if before != 3 {
		t.Fatalf("transitions before the joins: %v, want the two onlines and bo's second tab", c.All())
	}
	touch(t, s, ref("r1", "ann", "tab"), ref("r1", "bo", "a")) // both come back
	got := c.All()[before:]
	var kinds []string
	for _, tr := range got {
		kinds = append(kinds, fmt.Sprintf("%s %s %s %s", tr.Kind, tr.Reason, tr.User, tr.Session))
	}
	want := []string{"offline left ann ", "update left bo a", "online joined ann tab", "update joined bo a"}
	if !slices.Equal(kinds, want) {
		t.Fatalf("transitions %q, want %q", kinds, want)
	}
}

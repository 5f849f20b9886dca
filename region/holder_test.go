package region

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
)

// refresher refreshes refs every half heartbeat, as a node's scheduler
// would, until stopped.
func refresher(tb testing.TB, s *Store, refs ...presence.SessionRef) (stop func()) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tk := time.NewTicker(testTiming.Heartbeat / 2)
		defer tk.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
				_, _ = s.Refresh(ctx, refs)
			}
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	tb.Cleanup(stop)
	return stop
}

// expiryOf is the expiry of a session entry held by s, from Redis.
func expiryOf(tb testing.TB, s *Store, r presence.SessionRef) time.Time {
	tb.Helper()
	sc, err := s.rdb.ZScore(context.Background(), s.roomKeys(r.Room).s, r.User+":"+r.Session+s.code()).Result()
	if err != nil {
		tb.Fatalf("expiry of %+v: %v", r, err)
	}
	return time.Unix(int64(sc), 0)
}

// A late release from the node the session moved away from must not end
// it: the new holder keeps the user, and nothing is announced.
func TestLateReleaseOfAMovedSessionChangesNothing(t *testing.T) {
	slow(t)
	rdb, _ := testredis.Client(t)
	c := &collector{}
	a, b := newStore(t, rdb, c), newStore(t, rdb, c)
	startReaper(t, a)
	tab := ref("r1", "dave", "tab")

	touch(t, a, tab)
	res, err := b.Claim(context.Background(), []presence.SessionRef{tab})
	if err != nil || len(res.Taken) != 1 || res.Taken[0] != tab || len(res.Transitions) != 0 {
		t.Fatalf("b's claim: %+v %v, want the session taken over silently", res, err)
	}
	refresher(t, b, tab)
	release(t, a, tab) // a's release reaches Redis after b's claim
	released := redisNow(t, rdb)
	waitRedisPast(t, rdb, released.Add(testTiming.OfflineGrace+3*testTiming.ReapInterval))
	reap(t, a)
	if got := c.All(); len(got) != 1 || got[0].Kind != presence.Online {
		t.Fatalf("transitions %v, want only the first online", got)
	}
	if m := members(t, a, "r1"); m["dave"] != 1 {
		t.Fatalf("members %v, want dave with b's session", m)
	}
}

// A refresh never takes a session back from the node it moved to, even
// after that node released it: the old node is told it lost the session,
// and the departure goes ahead.
func TestRefreshOfAMovedSessionIsLost(t *testing.T) {
	slow(t)
	rdb, _ := testredis.Client(t)
	c := &collector{}
	a, b := newStore(t, rdb, c), newStore(t, rdb, c)
	startReaper(t, b)
	tab := ref("r1", "erin", "tab")
	touch(t, a, tab)
	touch(t, b, tab)
	res, err := a.Refresh(context.Background(), []presence.SessionRef{tab})
	if err != nil || len(res.Lost) != 1 || res.Lost[0] != tab || len(res.Orphaned) != 0 {
		t.Fatalf("a's refresh while b holds it: %+v %v, want the session lost", res, err)
	}
	release(t, b, tab)
	// Released: nobody holds it. Not refreshed, and reported orphaned:
	// a node with a live connection for it may claim it back; a's has none.
	res, err = a.Refresh(context.Background(), []presence.SessionRef{tab})
	if err != nil || len(res.Orphaned) != 1 || res.Orphaned[0] != tab || len(res.Lost) != 0 {
		t.Fatalf("a's refresh after b released it: %+v %v, want the session orphaned", res, err)
	}
	testkit.CheckFor(t, testTiming.OfflineGrace+2*time.Second, 10*time.Millisecond, func() error {
		return c.WantOf(presence.Offline, "r1", "erin", 1)
	})
	if off := c.Of(presence.Offline, "r1", "erin"); off[0].Reason != presence.Left {
		t.Fatalf("offline %v, want reason left", off)
	}
	if m := members(t, a, "r1"); len(m) != 0 {
		t.Fatalf("members %v, want none: a's refresh must not bring erin back", m)
	}
}

// A state write from the node the session moved away from is refused and
// changes nothing; the new holder's writes apply.
func TestStateWriteOfAMovedSessionIsRefused(t *testing.T) {
	rdb, _ := testredis.Client(t)
	c := &collector{}
	a, b := newStore(t, rdb, c), newStore(t, rdb, c)
	ctx := context.Background()
	tab := ref("r1", "fay", "tab")
	touch(t, a, tab)
	touch(t, b, tab)
	if ok, err := b.SetState(ctx, tab, []byte(`"new"`)); !ok || err != nil {
		t.Fatalf("b's state: %v %v", ok, err)
	}
	ok, err := a.SetState(ctx, tab, []byte(`"old"`))
	if ok || !errors.Is(err, presence.ErrMoved) {
		t.Fatalf("a's late state: %v %v, want ErrMoved", ok, err)
	}
	m, _, _ := b.Sessions(ctx, "r1", "fay")
	if len(m.Sessions) != 1 || string(m.Sessions[0].State) != `"new"` {
		t.Fatalf("sessions %+v, want b's state", m.Sessions)
	}
	if n := len(c.Of(presence.Update, "r1", "fay")); n != 1 {
		t.Fatalf("%d updates, want b's only", n)
	}
}

// waitUnrefreshed waits until the session entry of r held by s no longer
// counts as fresh: its last refresh is more than Unrefreshed ago, by
// Redis's clock (expiry is rounded up to a second, so the wait includes
// that second).
func waitUnrefreshed(tb testing.TB, s *Store, r presence.SessionRef) {
	tb.Helper()
	exp := expiryOf(tb, s, r)
	waitRedisPast(tb, s.rdb, exp.Add(-testTiming.SessionTTL+testTiming.Unrefreshed()))
}

// A session whose node died (it is no longer refreshed) does not hold
// its user against a clean close of the user's last live session: the
// departure comes after the grace, reason left, not at the dead
// session's expiry.
func TestDeadHoldersSessionDoesNotDelayADeparture(t *testing.T) {
	slow(t)
	rdb, _ := testredis.Client(t)
	c := &collector{}
	dead, live := newStore(t, rdb, c), newStore(t, rdb, c)
	startReaper(t, live)
	onDead, onLive := ref("r1", "gus", "laptop"), ref("r1", "gus", "phone")
	touch(t, dead, onDead) // then its node dies: no more refreshes
	touch(t, live, onLive)
	stop := refresher(t, live, onLive)
	waitUnrefreshed(t, dead, onDead)
	deadExpiry := expiryOf(t, dead, onDead)
	stop()
	release(t, live, onLive)
	released := redisNow(t, rdb)
	testkit.CheckFor(t, testTiming.OfflineGrace+2*time.Second, 10*time.Millisecond, func() error {
		return c.AtLeastOf(presence.Offline, "r1", "gus", 1)
	})
	off := c.Of(presence.Offline, "r1", "gus")
	if len(off) != 1 || off[0].Reason != presence.Left {
		t.Fatalf("offline %v, want one with reason left", off)
	}
	if lag := off[0].At.Sub(released); lag < testTiming.OfflineGrace || lag > testTiming.OfflineGrace+testTiming.ReapInterval+150*time.Millisecond {
		t.Fatalf("offline %v after the close, want within the grace and a reap interval", lag)
	}
	if !off[0].At.Before(deadExpiry) {
		t.Fatalf("offline at %v, not before the dead session's expiry %v", off[0].At, deadExpiry)
	}
	// The dead session went with the departure: nothing is left to expire.
	waitRedisPast(t, rdb, deadExpiry.Add(time.Second))
	reap(t, live)
	if n := len(c.All()); n != 3 {
		t.Fatalf("transitions %v, want one online, the phone's update (joined) and one offline", c.All())
	}
}

// If the holder of an unrefreshed session was only slow and refreshes it
// during the grace, the user never left: only the released session ends.
func TestSlowHolderRefreshingDuringTheGraceCancelsIt(t *testing.T) {
	slow(t)
	rdb, _ := testredis.Client(t)
	c := &collector{}
	slow, live := newStore(t, rdb, c), newStore(t, rdb, c)
	startReaper(t, live)
	onSlow, onLive := ref("r1", "hal", "laptop"), ref("r1", "hal", "phone")
	touch(t, slow, onSlow)
	touch(t, live, onLive)
	stop := refresher(t, live, onLive)
	waitUnrefreshed(t, slow, onSlow)
	stop()
	release(t, live, onLive) // the grace starts: the laptop's session does not count
	released := redisNow(t, rdb)
	if res, err := slow.Refresh(context.Background(), []presence.SessionRef{onSlow}); err != nil || len(res.Lost) != 0 {
		t.Fatalf("slow refresh: %+v %v", res, err)
	}
	refresher(t, slow, onSlow)
	waitRedisPast(t, rdb, released.Add(testTiming.OfflineGrace+3*testTiming.ReapInterval))
	reap(t, live)
	if got := c.All(); len(got) != 3 || got[2].Kind != presence.Update || got[2].Reason != presence.Left || got[2].Session != "phone" {
		t.Fatalf("transitions %v, want the online, the phone's update (joined), then its update (left)", got)
	}
	if m := members(t, live, "r1"); m["hal"] != 1 {
		t.Fatalf("members %v, want hal with the laptop's session", m)
	}
}

// Stores in use at once get distinct one-byte holder codes, and record
// their names (Options.Holder, checked) in the registry.
func TestHolderIDs(t *testing.T) {
	rdb, _ := testredis.Client(t)
	seen := map[string]bool{}
	for i := range 100 {
		s := newStore(t, rdb, &collector{})
		touch(t, s, ref("r", "u"+strconv.Itoa(i), "a"))
		c := s.code()
		if seen[c] || len(c) != 1 || isIDByte(c[0]) || checkHolder(s.opt.Holder) != nil {
			t.Fatalf("store %d: code %q (name %q): repeated, long or an id byte", i, c, s.opt.Holder)
		}
		seen[c] = true
	}
	for _, bad := range []string{"a:b", "a b", "{x}", "0123456789abcdefX"} {
		t.Run(bad, func(t *testing.T) {
			_, err := New(rdb, Options{Region: "eu", Sink: &collector{}, Holder: bad})
			var ce *presence.ConfigError
			if !errors.As(err, &ce) || ce.Field != "holder" {
				t.Fatalf("holder %q: %v, want a config error about the holder", bad, err)
			}
		})
	}
	s := newStore(t, rdb, &collector{}, func(o *Options) { o.Holder = "n" + strconv.Itoa(7) })
	touch(t, s, ref("r", "v", "a"))
	if v, _ := rdb.HGet(context.Background(), "presence:holders", s.code()).Result(); !strings.HasSuffix(v, "|n7|"+FormatVersion) {
		t.Fatalf("registry entry of %q: %q, want it to name n7 and the format it reads", s.code(), v)
	}
}

// A refresh that was under way when its node decided to release lands
// after the release: it must not bring the session back. A later claim
// of the same node (the client is back) lifts the tombstone.
func TestRefreshLandingAfterItsOwnReleaseIsLost(t *testing.T) {
	rdb, _ := testredis.Client(t)
	c := &collector{}
	a := newStore(t, rdb, c)
	startReaper(t, a)
	tab := ref("r1", "ida", "tab")
	touch(t, a, tab)
	release(t, a, tab)
	if res, err := a.Refresh(context.Background(), []presence.SessionRef{tab}); err != nil || len(res.Lost)+len(res.Orphaned) != 1 {
		t.Fatalf("late refresh: %+v %v, want the session not refreshed (orphaned: a no longer holds it)", res, err)
	}
	if m := members(t, a, "r1"); m["ida"] != 1 {
		t.Fatalf("members %v: the late refresh changed the released session", m)
	}
	testkit.CheckFor(t, testTiming.OfflineGrace+2*time.Second, 10*time.Millisecond, func() error {
		return c.WantOf(presence.Offline, "r1", "ida", 1)
	})
	touch(t, a, tab) // back: a join
	if res, err := a.Refresh(context.Background(), []presence.SessionRef{tab}); err != nil || len(res.Lost) != 0 {
		t.Fatalf("refresh after the claim: %+v %v", res, err)
	}
	if on := c.Of(presence.Online, "r1", "ida"); len(on) != 2 {
		t.Fatalf("onlines %v, want two", on)
	}
}

// A claim finds the session's entries of other holders, held or released,
// whether the slot has few holder codes (touch looks the entries up by
// name) or more than FEW_CODES in lib.lua (it scans s): the claim takes a
// held session over, takes a released one silently, and leaves one entry.
func TestAClaimFindsTheSessionsOtherEntriesByNameOrByScan(t *testing.T) {
	for _, codes := range []int{0, 17} {
		t.Run(strconv.Itoa(codes)+" more codes", func(t *testing.T) {
			rdb, _ := testredis.Client(t)
			ctx := context.Background()
			c := &collector{}
			// Long timing: nothing falls due between the release and the
			// claim, so the claim settles nothing (a settle scans s).
			a, b := newStore(t, rdb, c, longTiming), newStore(t, rdb, c, longTiming)
			room := "r1"
			w := writesKey(a.indexKey(room))
			for i := range codes { // codes of stores long gone, as w keeps them
				if err := rdb.HSet(ctx, w, "\xf0"+strconv.Itoa(i), 1).Err(); err != nil {
					t.Fatal(err)
				}
			}
			held, released := ref(room, "dave", "tab"), ref(room, "erin", "tab")
			touch(t, a, held, released)
			release(t, a, released)
			if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			res, err := b.Claim(ctx, []presence.SessionRef{held, released})
			if err != nil || len(res.Taken) != 1 || res.Taken[0] != held || len(res.Transitions) != 0 {
				t.Fatalf("b's claim: %+v %v, want dave's session taken over, erin's released one taken silently", res, err)
			}
			if scans := zscans(t, rdb); (codes == 0) != (scans == 0) {
				t.Fatalf("%d ZSCANs with %d more codes: want the scan only past FEW_CODES", scans, codes)
			}
			entries, err := rdb.ZRange(ctx, a.roomKeys(room).s, 0, -1).Result()
			if err != nil {
				t.Fatal(err)
			}
			want := []string{"dave:tab" + b.code(), "erin:tab" + b.code()}
			slices.Sort(entries)
			if !slices.Equal(entries, want) {
				t.Fatalf("entries of s %q, want only b's %q", entries, want)
			}
			if m := members(t, a, room); m["dave"] != 1 || m["erin"] != 1 {
				t.Fatalf("members %v, want dave and erin with one session each", m)
			}
		})
	}
}

// zscans is how many ZSCANs Redis ran since its stats were reset.
func zscans(tb testing.TB, rdb *redis.Client) int {
	tb.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_zscan:calls="); ok {
			n, _ := strconv.Atoi(strings.SplitN(rest, ",", 2)[0])
			return n
		}
	}
	return 0
}

package region

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
)

// A user's last live session closes cleanly while another session of
// theirs, on a node that has stopped writing, is still fresh: refreshed
// less than Unrefreshed before the close, more than Unrefreshed before
// the grace's end, and not expired by then. The user leaves at the
// grace's end in one transition, offline (left), never through a member
// with no session and never at the dead session's expiry.

// staleTiming goes stale (Unrefreshed 1.5s) well inside the TTL (3s),
// with a grace of 1.5s: the oracle's timing A, with a faster reaper.
var staleTiming = presence.Timing{SessionTTL: 3 * time.Second, Heartbeat: time.Second,
	OfflineGrace: 1500 * time.Millisecond, ReapInterval: 100 * time.Millisecond, LastSeenInterval: time.Second}

func withTiming(t presence.Timing) func(*Options) { return func(o *Options) { o.Timing = t } }

// staleCase is one run of the interleaving: the stores, the user's two
// sessions and when things happened by Redis's clock.
type staleCase struct {
	live             *Store // whose reaper runs
	c                *collector
	refreshed, close time.Time // the dead session's last write; the release
	deadExpiry       time.Time
	room, user       string
}

func TestCleanCloseBesideAStaleSessionLeavesAtTheGrace(t *testing.T) {
	slow(t)
	for _, order := range []string{"holder silent before the close", "holder silent after the close"} {
		t.Run(order, func(t *testing.T) {
			sc := runStaleCase(t, staleTiming, order == "holder silent after the close")
			after := sc.waitDeparture(t, 10*time.Second)
			if len(after) != 1 {
				t.Fatalf("transitions of ida since the close: %v, want one offline (left)", after)
			}
			off := after[0]
			if lag := off.At.Sub(sc.close); lag < staleTiming.OfflineGrace-50*time.Millisecond ||
				lag > staleTiming.OfflineGrace+staleTiming.ReapInterval+400*time.Millisecond {
				t.Fatalf("offline %v after the close, want at the grace's end (%v) within a reap interval", lag, staleTiming.OfflineGrace)
			}
			sc.nothingAfter(t)
		})
	}
}

// The freshness rule is exact: a session whose holder last wrote at w stops
// holding its user at w + Unrefreshed, to the reaper's interval, although
// its expiry (whole seconds, rounded up) reads up to a second later. Timing
// B of the oracle: the heartbeat longer than the grace, so the departure
// comes when the session goes stale, after the grace's end (the closed
// session ends at the grace's end, the stale one still listed).
func TestAStaleSessionStopsHoldingItsUserToTheMillisecond(t *testing.T) {
	slow(t)
	tm := presence.Timing{SessionTTL: 4500 * time.Millisecond, Heartbeat: 1500 * time.Millisecond,
		OfflineGrace: 1200 * time.Millisecond, ReapInterval: 100 * time.Millisecond, LastSeenInterval: 2 * time.Second}
	tt := newTwoTabs(t, tm, "kim")
	rdb, c, dead, live, onDead, onLive := tt.rdb, tt.c, tt.dead, tt.live, tt.onDead, tt.onLive
	// Written half a second into a Redis second, the entry's expiry
	// (refresh + 4.5s, rounded up) reads almost a second late.
	waitRedisFraction(t, live, 500*time.Millisecond, 650*time.Millisecond)
	touch(t, dead, onDead)
	refreshed := redisNow(t, rdb)
	release(t, live, onLive)
	sc := staleCase{live: live, c: c, refreshed: refreshed, close: redisNow(t, rdb),
		deadExpiry: expiryOf(t, dead, onDead), room: "r1", user: "kim"}
	after := sc.waitDeparture(t, 10*time.Second)
	if len(after) != 2 || after[0].Kind != presence.Update || after[0].Reason != presence.Left || after[0].Session != "phone" {
		t.Fatalf("transitions of kim since the close: %v, want the phone's update (left), then the offline (left)", after)
	}
	off := after[1]
	if d := off.At.Sub(refreshed.Add(tm.Unrefreshed())); d < -50*time.Millisecond || d > tm.ReapInterval+400*time.Millisecond {
		t.Fatalf("offline %v after the laptop's session went stale (%v after its last write), want within a reap interval",
			d, tm.Unrefreshed())
	}
	sc.nothingAfter(t)
}

// twoTabs is a user's two sessions in room r1, each held by its own
// store: the phone's (live, whose reaper runs) is claimed; the laptop's
// holder (dead) is about to go silent, and its caller claims it.
type twoTabs struct {
	rdb            redis.UniversalClient
	c              *collector
	dead, live     *Store
	onDead, onLive presence.SessionRef
}

func newTwoTabs(t *testing.T, tm presence.Timing, user string) twoTabs {
	t.Helper()
	rdb, _ := testredis.Client(t)
	c := &collector{}
	tt := twoTabs{rdb: rdb, c: c, dead: newStore(t, rdb, c, withTiming(tm)), live: newStore(t, rdb, c, withTiming(tm)),
		onDead: ref("r1", user, "laptop"), onLive: ref("r1", user, "phone")}
	startReaper(t, tt.live)
	touch(t, tt.live, tt.onLive)
	return tt
}

// runStaleCase sets the interleaving up with timing tm. With silentAfter,
// the dead session's holder still writes (another room) after the close,
// and only then stops.
func runStaleCase(t *testing.T, tm presence.Timing, silentAfter bool) staleCase {
	t.Helper()
	tt := newTwoTabs(t, tm, "ida")
	rdb, c, dead, live, onDead, onLive := tt.rdb, tt.c, tt.dead, tt.live, tt.onDead, tt.onLive
	touch(t, dead, onDead)
	refreshed := redisNow(t, rdb)
	// The phone's node refreshes it a second later (the user's until is
	// now past the laptop's expiry), and the phone closes: the laptop's
	// session, written a second ago, is fresh at the close, and stale
	// at the grace's end.
	waitRedisPast(t, rdb, refreshed.Add(tm.Heartbeat+50*time.Millisecond))
	if _, err := live.Refresh(context.Background(), []presence.SessionRef{onLive}); err != nil {
		t.Fatal(err)
	}
	release(t, live, onLive)
	closed := redisNow(t, rdb)
	if silentAfter {
		touch(t, dead, ref("r2", "jo", "tab"))
	}
	if age := closed.Sub(refreshed); age >= tm.Unrefreshed() {
		t.Fatalf("the close came %v after the laptop's last refresh, not within %v: the machine is too slow for this test", age, tm.Unrefreshed())
	}
	return staleCase{live: live, c: c, refreshed: refreshed, close: closed, deadExpiry: expiryOf(t, dead, onDead), room: "r1", user: "ida"}
}

// waitDeparture waits for the user's offline, checking every snapshot
// meanwhile for a member with no session, and returns the user's
// transitions since the close, the offline (reason left) last.
func (sc staleCase) waitDeparture(t *testing.T, timeout time.Duration) []presence.Transition {
	t.Helper()
	before := len(sc.c.Of("", sc.room, sc.user))
	testkit.CheckFor(t, timeout, 10*time.Millisecond, func() error {
		if n, ok := members(t, sc.live, sc.room)[sc.user]; ok && n == 0 {
			t.Fatalf("a snapshot lists %s as a member with no session; transitions: %v", sc.user, sc.c.Of("", sc.room, sc.user))
		}
		return sc.c.AtLeastOf(presence.Offline, sc.room, sc.user, 1)
	})
	after := sc.c.Of("", sc.room, sc.user)[before:]
	if last := after[len(after)-1]; last.Kind != presence.Offline || last.Reason != presence.Left {
		t.Fatalf("transitions of %s since the close: %v, want the offline (left) last", sc.user, after)
	}
	return after
}

// nothingAfter checks that nothing more comes for the user once the dead
// session's expiry has passed, and that no update ever left a member with
// no session.
func (sc staleCase) nothingAfter(t *testing.T) {
	t.Helper()
	n := len(sc.c.Of("", sc.room, sc.user))
	waitRedisPast(t, sc.live.rdb, sc.deadExpiry.Add(sc.live.readSlack()))
	reap(t, sc.live)
	if got := sc.c.Of("", sc.room, sc.user); len(got) != n {
		t.Fatalf("transitions of %s after the departure: %v", sc.user, got[n:])
	}
	for _, tr := range sc.c.All() {
		if tr.Kind == presence.Update && tr.Sessions == 0 {
			t.Fatalf("update %v leaves a member with no session", tr)
		}
	}
}

// waitRedisFraction waits until Redis's clock is between lo and hi into a
// second.
func waitRedisFraction(t *testing.T, s *Store, lo, hi time.Duration) {
	t.Helper()
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if f := time.Duration(redisNow(t, s.rdb).Nanosecond()); f < lo || f >= hi {
			return fmt.Errorf("the redis clock %v into its second, want between %v and %v", f, lo, hi)
		}
		return nil
	})
}

// A session whose holder died but whose client waits to be admitted
// elsewhere (Extend, a reconnect storm) is not stale: it holds its user
// against a clean close of their other session for as long as the client
// keeps waiting, and the user leaves (left) once it gives up.
func TestAnExtendedSessionHoldsItsUserAgainstAClose(t *testing.T) {
	slow(t)
	tt := newTwoTabs(t, testTiming, "lee")
	rdb, c, live, waiting, onLive := tt.rdb, tt.c, tt.live, tt.onDead, tt.onLive
	touch(t, tt.dead, waiting) // then its node dies; the laptop waits to get in elsewhere
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			_, _ = live.Extend(ctx, []presence.SessionRef{waiting})
			time.Sleep(testTiming.Heartbeat / 2)
		}
	}()
	defer func() { cancel(); <-done }()
	release(t, live, onLive)
	// Longer than the TTL: only the extensions keep the user.
	waitRedisPast(t, rdb, redisNow(t, rdb).Add(testTiming.SessionTTL+testTiming.OfflineGrace))
	if off := c.Of(presence.Offline, "r1", "lee"); len(off) != 0 {
		t.Fatalf("offline %v while the laptop's client waits", off)
	}
	cancel()
	<-done
	gaveUp := redisNow(t, rdb)
	testkit.CheckFor(t, testTiming.SessionTTL+testTiming.OfflineGrace+3*time.Second, 10*time.Millisecond, func() error {
		return c.AtLeastOf(presence.Offline, "r1", "lee", 1)
	})
	off := c.Of(presence.Offline, "r1", "lee")
	if len(off) != 1 || off[0].Reason != presence.Left {
		t.Fatalf("offline %v, want one, reason left", off)
	}
	if d := off[0].At.Sub(gaveUp); d > testTiming.SessionTTL+time.Second+testTiming.ReapInterval+400*time.Millisecond {
		t.Fatalf("offline %v after the client gave up, want within its last extension (a TTL, rounded up)", d)
	}
	for _, tr := range c.All() {
		if tr.Kind == presence.Update && tr.Sessions == 0 {
			t.Fatalf("update %v leaves a member with no session", tr)
		}
	}
}

// A live node whose refresh of one session comes late (its heartbeat slot
// ran behind) while it keeps writing others in the slot does not lose
// that session's user: the session stays fresh while its node writes, and
// the late refresh cancels the departure a clean close elsewhere started.
func TestALateRefreshOfALiveNodeKeepsItsUser(t *testing.T) {
	slow(t)
	tt := newTwoTabs(t, staleTiming, "max")
	other := ref("r2", "ned", "tab") // the slow node's other session
	touch(t, tt.dead, tt.onDead, other)
	written := redisNow(t, tt.rdb)
	stop := refresher(t, tt.dead, other)
	release(t, tt.live, tt.onLive)
	// The laptop's own refresh comes 2.5s after the last, a heartbeat and
	// a half late, inside its TTL.
	waitRedisPast(t, tt.rdb, written.Add(staleTiming.Unrefreshed()+staleTiming.Heartbeat))
	if res, err := tt.dead.Refresh(context.Background(), []presence.SessionRef{tt.onDead}); err != nil || len(res.Lost) != 0 {
		t.Fatalf("late refresh: %+v %v", res, err)
	}
	stop()
	refresher(t, tt.dead, tt.onDead)
	waitRedisPast(t, tt.rdb, redisNow(t, tt.rdb).Add(staleTiming.OfflineGrace+3*staleTiming.ReapInterval))
	reap(t, tt.live)
	got := tt.c.Of("", "r1", "max")
	if len(got) != 3 || got[2].Kind != presence.Update || got[2].Reason != presence.Left || got[2].Session != "phone" {
		t.Fatalf("transitions %v, want the online, the second tab's update (joined), then the phone's update (left)", got)
	}
	if m := members(t, tt.live, "r1"); m["max"] != 1 {
		t.Fatalf("members %v, want max with the laptop's session", m)
	}
}

// A node that keeps writing (its other sessions' refreshes go through)
// while its refreshes of one session fail leaves that session to expire:
// a clean close of the user's other session then ends the user (offline,
// left) when that session expires, after the closed one's grace, never
// through a member with no session.
func TestASessionWhoseRefreshesFailEndsWithItsUser(t *testing.T) {
	slow(t)
	tt := newTwoTabs(t, staleTiming, "oli")
	other := ref("r2", "ned", "tab") // the node's session that it does refresh
	touch(t, tt.dead, tt.onDead, other)
	refresher(t, tt.dead, other)
	release(t, tt.live, tt.onLive)
	sc := staleCase{live: tt.live, c: tt.c, close: redisNow(t, tt.rdb), deadExpiry: expiryOf(t, tt.dead, tt.onDead), room: "r1", user: "oli"}
	after := sc.waitDeparture(t, 10*time.Second)
	if len(after) != 2 || after[0].Reason != presence.Left || after[0].Session != "phone" {
		t.Fatalf("transitions of oli since the close: %v, want the phone's update (left), then the offline (left)", after)
	}
	if d := after[1].At.Sub(sc.deadExpiry); d < -50*time.Millisecond || d > staleTiming.ReapInterval+400*time.Millisecond {
		t.Fatalf("offline %v after the laptop's expiry, want at it, within a reap interval", d)
	}
	sc.nothingAfter(t)
}

package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/presence"
)

// fakeStore records calls. delay(n) is how long the nth Claim or
// Refresh (from 0) takes; gate, when set, holds every one until closed,
// and refreshGate every Refresh; lost, when set, is what a Refresh
// reports lost.
type fakeStore struct {
	mu          sync.Mutex
	touches     []touchCall
	log         []string
	delay       func(n int) time.Duration
	gate        chan struct{}
	refreshGate chan struct{}
	fail        error
	releaseFail error
	lost        []presence.SessionRef
	orphaned    []presence.SessionRef
}

type touchCall struct {
	at    time.Time
	claim bool
	refs  []presence.SessionRef
}

func (f *fakeStore) Claim(ctx context.Context, refs []presence.SessionRef) (presence.TouchResult, error) {
	return f.touch(true, refs)
}

func (f *fakeStore) Refresh(ctx context.Context, refs []presence.SessionRef) (presence.TouchResult, error) {
	return f.touch(false, refs)
}

func (f *fakeStore) touch(claim bool, refs []presence.SessionRef) (presence.TouchResult, error) {
	f.mu.Lock()
	n := len(f.touches)
	f.touches = append(f.touches, touchCall{at: time.Now(), claim: claim, refs: append([]presence.SessionRef(nil), refs...)})
	kind := "refresh"
	if claim {
		kind = "claim"
	}
	f.log = append(f.log, fmt.Sprintf("%s-start %d", kind, n))
	gate := f.gate
	if !claim && f.refreshGate != nil {
		gate = f.refreshGate
	}
	f.mu.Unlock()
	if f.delay != nil {
		time.Sleep(f.delay(n)) // set only by tests in a synctest bubble: virtual time
	}
	if gate != nil {
		<-gate
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log = append(f.log, fmt.Sprintf("%s-end %d", kind, n))
	var res presence.TouchResult
	if !claim {
		res.Lost, res.Orphaned = f.lost, f.orphaned
	}
	return res, f.fail
}

func (f *fakeStore) Release(_ context.Context, r presence.SessionRef) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.releaseFail != nil {
		f.log = append(f.log, "release-failed "+r.Session)
		return f.releaseFail
	}
	f.log = append(f.log, "release "+r.Session)
	return nil
}

func (f *fakeStore) setReleaseFail(err error) {
	f.mu.Lock()
	f.releaseFail = err
	f.mu.Unlock()
}

func (f *fakeStore) calledLog() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fmt.Sprint(f.log)
}

func (f *fakeStore) SetState(context.Context, presence.SessionRef, json.RawMessage) (bool, error) {
	return true, nil
}

func (f *fakeStore) Snapshot(context.Context, string, int, int) (presence.Snapshot, error) {
	return presence.Snapshot{}, nil
}

func (f *fakeStore) Timing() presence.Timing { return testTiming }

func (f *fakeStore) Extend(context.Context, []presence.SessionRef) (int, error) { return 0, nil }

// calls returns the refreshes made (claims are left out).
func (f *fakeStore) calls() []touchCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []touchCall
	for _, c := range f.touches {
		if !c.claim {
			out = append(out, c)
		}
	}
	return out
}

// testOwner is a connection holding sessions; it counts its moves.
type testOwner struct{ moves atomic.Int32 }

func (o *testOwner) sessionMoved() { o.moves.Add(1) }

// holdAll holds refs for one owner, failing the test on error.
func holdAll(tb testing.TB, s *sessionKeeper, refs ...presence.SessionRef) *testOwner {
	tb.Helper()
	o := &testOwner{}
	for _, r := range refs {
		if err := s.hold(context.Background(), r, o); err != nil {
			tb.Fatalf("hold %v: %v", r, err)
		}
	}
	return o
}

func refsN(n int) []presence.SessionRef {
	out := make([]presence.SessionRef, n)
	for i := range out {
		out[i] = refN(i)
	}
	return out
}

func refN(i int) presence.SessionRef {
	return presence.SessionRef{Room: "r", User: "u", Session: fmt.Sprintf("s%03d", i)}
}

func newTestKeeper(st Store, period time.Duration, slots, batch int) *sessionKeeper {
	return newSessionKeeper(st, period, slots, batch, 5*time.Second, quiet, func(time.Duration, int, error) {})
}

// Every session is refreshed once per period, by one batch per slot, the
// slots a period/N apart: no burst.
func TestKeeperSpreadsTouchesOverThePeriod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := &fakeStore{}
		s := newTestKeeper(fs, time.Second, 10, 1000)
		refs := refsN(100)
		for i := range refs {
			refs[i].Room = fmt.Sprintf("r%03d", i) // a room each: slots fill round robin
		}
		holdAll(t, s, refs...)
		start := time.Now()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { s.run(ctx); close(done) }()
		// Virtual time: in the bubble the sleep returns once every
		// goroutine is blocked and the clock has moved 3s, so the
		// keeper's ticks are exact and the test takes no real time.
		time.Sleep(3*time.Second + time.Millisecond)
		cancel()
		<-done

		calls := fs.calls()
		if len(calls) != 30 {
			t.Fatalf("%d touches in 3 periods, want 30 (10 slots x 3)", len(calls))
		}
		last := map[presence.SessionRef]time.Time{}
		count := map[presence.SessionRef]int{}
		for i, c := range calls {
			if want := start.Add(time.Duration(i+1) * 100 * time.Millisecond); !c.at.Equal(want) {
				t.Fatalf("touch %d at %v, want %v", i, c.at.Sub(start), want.Sub(start))
			}
			if len(c.refs) != 10 {
				t.Fatalf("touch %d has %d sessions, want 10", i, len(c.refs))
			}
			for _, r := range c.refs {
				if l, ok := last[r]; ok && c.at.Sub(l) != time.Second {
					t.Fatalf("%v refreshed %v after its previous refresh, want exactly the period", r, c.at.Sub(l))
				}
				last[r] = c.at
				count[r]++
			}
		}
		for _, r := range refs {
			if count[r] != 3 {
				t.Fatalf("%v touched %d times, want 3", r, count[r])
			}
		}
	})
}

// A touch slower than a tick delays the following slots, which are
// caught up at once instead of waiting a whole extra period.
func TestKeeperCatchesUpAfterASlowTouch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := &fakeStore{delay: func(n int) time.Duration {
			if n == 50 { // the first refresh, after the 50 claims
				return 350 * time.Millisecond
			}
			return 0
		}}
		s := newTestKeeper(fs, time.Second, 10, 1000)
		holdAll(t, s, refsN(50)...)
		start := time.Now()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { s.run(ctx); close(done) }()
		time.Sleep(3 * time.Second) // virtual time, as above
		cancel()
		<-done

		last := map[presence.SessionRef]time.Time{}
		for _, c := range fs.calls() {
			for _, r := range c.refs {
				prev, ok := last[r]
				if !ok {
					prev = start
				}
				if gap := c.at.Sub(prev); gap > time.Second+350*time.Millisecond {
					t.Fatalf("%v went %v without a refresh", r, gap)
				}
				last[r] = c.at
			}
		}
		for i := range 50 {
			if l := last[refN(i)]; start.Add(3*time.Second).Sub(l) > time.Second {
				t.Fatalf("%v last refreshed %v before the end", refN(i), start.Add(3*time.Second).Sub(l))
			}
		}
	})
}

// The sessions of one room fill its slot until it holds a batch more
// than the least loaded; slots stay within a batch of each other, and a
// slot is refreshed in batches of at most TouchBatch.
func TestKeeperBatchesAndBalances(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := &fakeStore{}
		s := newTestKeeper(fs, time.Second, 4, 7)
		holdAll(t, s, refsN(40)...)
		lo, hi := len(s.slots[0]), len(s.slots[0])
		for _, sl := range s.slots {
			lo, hi = min(lo, len(sl)), max(hi, len(sl))
		}
		if hi-lo > 7 {
			t.Fatalf("slots hold %d to %d sessions: more than a batch apart", lo, hi)
		}
		n := len(s.slots[0])
		s.touchSlot(context.Background(), 0)
		c := fs.calls()
		if len(c) != (n+6)/7 || len(c[0].refs) != 7 {
			t.Fatalf("slot of %d sessions: %d calls, the first of %d; want batches of 7", n, len(c), len(c[0].refs))
		}
	})
}

// Sessions of many rooms joining in any order: each room's sessions
// share a slot, and a slot's batches are runs of whole rooms, so a batch
// spans few rooms (on a Redis Cluster, few script calls).
func TestKeeperGroupsRooms(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := &fakeStore{}
		s := newTestKeeper(fs, time.Second, 4, 1000)
		var refs []presence.SessionRef
		for i := range 200 {
			refs = append(refs, presence.SessionRef{Room: fmt.Sprintf("room%02d", i%20), User: fmt.Sprintf("u%03d", i), Session: "s"})
		}
		holdAll(t, s, refs...)
		slotOf := map[string]int{}
		for i, sl := range s.slots {
			if len(sl) != 50 {
				t.Fatalf("slot %d holds %d sessions, want 50 (5 rooms of 10)", i, len(sl))
			}
			for _, r := range sl {
				if j, ok := slotOf[r.Room]; ok && j != i {
					t.Fatalf("room %s in slots %d and %d", r.Room, j, i)
				}
				slotOf[r.Room] = i
			}
		}
		for i := range s.slots {
			s.touchSlot(context.Background(), i)
		}
		for _, c := range fs.calls() {
			if !slices.IsSortedFunc(c.refs, func(a, b presence.SessionRef) int { return strings.Compare(a.Room, b.Room) }) {
				t.Fatalf("a batch not in room order: %v", c.refs)
			}
		}
	})
}

func TestKeeperHoldersShareASession(t *testing.T) {
	fs := &fakeStore{}
	s := newTestKeeper(fs, time.Second, 4, 100)
	ctx := context.Background()
	r := refN(1)
	a, b := &testOwner{}, &testOwner{}
	if err := s.hold(ctx, r, a); err != nil {
		t.Fatal(err)
	}
	if err := s.hold(ctx, r, b); err != nil { // a second connection, same session
		t.Fatal(err)
	}
	if s.held() != 1 {
		t.Fatalf("two holds: %d held; want 1", s.held())
	}
	if released, err := s.unhold(ctx, r, a, true); released || err != nil {
		t.Fatalf("first unhold released: %v %v", released, err)
	}
	if released, err := s.unhold(ctx, r, a, true); released || err != nil {
		t.Fatalf("unhold by a connection that no longer holds: %v %v", released, err)
	}
	if released, err := s.unhold(ctx, r, b, true); !released || err != nil {
		t.Fatalf("last unhold: %v %v", released, err)
	}
	if s.held() != 0 || len(s.slots[0])+len(s.slots[1])+len(s.slots[2])+len(s.slots[3]) != 0 {
		t.Fatal("session still held")
	}
	// Drain: the last holder leaves without a release.
	_ = s.hold(ctx, r, a)
	if released, _ := s.unhold(ctx, r, a, false); released {
		t.Fatal("kept session released")
	}
	// A failed first claim holds nothing.
	fs.fail = errors.New("redis down")
	if err := s.hold(ctx, refN(2), a); err == nil || s.held() != 0 {
		t.Fatalf("failed hold: %v, %d held", err, s.held())
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	// Every join claims, so a connection back on this node takes the
	// session back from any other node that holds it.
	if fmt.Sprint(fs.log) != "[claim-start 0 claim-end 0 claim-start 1 claim-end 1 release s001 claim-start 2 claim-end 2 claim-start 3 claim-end 3]" {
		t.Fatalf("store calls: %v", fs.log)
	}
}

// A refresh that finds a session taken over by another node tells the
// connections holding it here, once a second look confirms it.
func TestRefreshTellsOwnersOfAMovedSession(t *testing.T) {
	fs := &fakeStore{lost: []presence.SessionRef{refN(1)}}
	s := newTestKeeper(fs, time.Second, 1, 100)
	var moved []owner
	s.moved = func(os []owner) { moved = append(moved, os...) }
	a := holdAll(t, s, refN(1))
	b := holdAll(t, s, refN(1), refN(2))
	s.moveConfirm = 0
	s.touchSlot(context.Background(), 0)
	if len(moved) != 0 {
		t.Fatalf("moved %v on the first verdict, before the second look", moved)
	}
	s.confirmMoves(context.Background())
	if len(moved) != 2 || !slices.Contains(moved, owner(a)) || !slices.Contains(moved, owner(b)) {
		t.Fatalf("moved %v, want both holders of the lost session", moved)
	}
}

// A connection's claim can reach the store after its client has left it
// for this node: the other node takes the session, then releases it as
// its connection is gone. The second look finds it held by no one, and
// the keeper claims it back instead of closing the live connection here.
func TestASessionTakenByAGoneConnectionIsClaimedBack(t *testing.T) {
	fs := &fakeStore{orphaned: []presence.SessionRef{refN(1)}}
	s := newTestKeeper(fs, time.Second, 1, 100)
	var moved []owner
	s.moved = func(os []owner) { moved = append(moved, os...) }
	holdAll(t, s, refN(1))
	s.moveConfirm = 0
	s.touchSlot(context.Background(), 0)
	s.confirmMoves(context.Background())
	fs.mu.Lock()
	log := fmt.Sprint(fs.log)
	fs.mu.Unlock()
	if len(moved) != 0 || log != "[claim-start 0 claim-end 0 refresh-start 1 refresh-end 1 refresh-start 2 refresh-end 2 claim-start 3 claim-end 3]" {
		t.Fatalf("moved %v, store calls %s: want the session claimed back and nobody told", moved, log)
	}
	if !s.holds(refN(1)) || len(s.suspects) != 0 {
		t.Fatal("the session is not held, or still suspect")
	}
}

// A refresh's verdict that a session moved is stale once a claim of this
// node went out after the refresh did (a client came back here): the new
// connection must not be closed.
func TestAClaimAfterARefreshOverridesItsVerdict(t *testing.T) {
	fs := &fakeStore{lost: []presence.SessionRef{refN(1)}}
	s := newTestKeeper(fs, time.Second, 1, 100)
	var moved []owner
	s.moved = func(os []owner) { moved = append(moved, os...) }
	holdAll(t, s, refN(1))
	gate := make(chan struct{})
	fs.mu.Lock()
	fs.gate = gate
	fs.mu.Unlock()
	refreshed := make(chan struct{})
	go func() { s.touchSlot(context.Background(), 0); close(refreshed) }()
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.Want("store calls, the refresh started", len(fs.calls()), 1) })
	claimed := make(chan struct{})
	go func() { holdAll(t, s, refN(1)); close(claimed) }() // the client is back
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		fs.mu.Lock()
		defer fs.mu.Unlock()
		return testkit.Want("store calls, the claim started", len(fs.touches), 3)
	})
	close(gate)
	<-refreshed
	<-claimed
	if len(moved) != 0 {
		t.Fatalf("moved %v, want none: the claim came after the refresh", moved)
	}
}

// A release does not wait for a heartbeat refresh under way, and joins
// do not either: a connection's cost does not depend on the heartbeat's.
// (The store's release leaves a tombstone, so the refresh landing after
// it cannot bring the session back; see region.)
func TestReleaseAndJoinDoNotWaitForTheHeartbeat(t *testing.T) {
	fs := &fakeStore{}
	s := newTestKeeper(fs, time.Second, 1, 100)
	r := refN(7)
	o := holdAll(t, s, r)
	gate := make(chan struct{})
	fs.mu.Lock()
	fs.refreshGate = gate
	fs.mu.Unlock()
	touched := make(chan struct{})
	go func() { s.touchSlot(context.Background(), 0); close(touched) }()
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.Want("store calls, the refresh started", len(fs.calls()), 1) })
	if released, err := s.unhold(context.Background(), r, o, true); !released || err != nil {
		t.Fatalf("unhold: %v %v", released, err)
	}
	holdAll(t, s, refN(8))
	select {
	case <-touched:
		t.Fatal("the refresh ended early")
	default:
	}
	close(gate)
	<-touched
}

// A release that fails (the store is out of reach) is not dropped: it is
// retried until the store answers, so the departure is announced.
func TestAFailedReleaseIsRetried(t *testing.T) {
	fs := &fakeStore{}
	s := newTestKeeper(fs, time.Second, 1, 100)
	ctx := context.Background()
	o := holdAll(t, s, refN(1))
	fs.setReleaseFail(errors.New("redis down"))
	if _, err := s.unhold(ctx, refN(1), o, true); err == nil {
		t.Fatal("the release did not fail")
	}
	s.retryReleases(ctx)
	if s.pendingReleases() != 1 {
		t.Fatal("a release still failing was dropped")
	}
	fs.setReleaseFail(nil)
	s.retryReleases(ctx)
	if s.pendingReleases() != 0 {
		t.Fatal("the retried release is still pending")
	}
	if got := fs.calledLog(); got != "[claim-start 0 claim-end 0 release-failed s001 release-failed s001 release s001]" {
		t.Fatalf("store calls: %s", got)
	}
}

// A join of a session whose release failed sends that release first: a
// release that reached the store after the new claim would end it.
func TestAClaimSendsAFailedReleaseFirst(t *testing.T) {
	fs := &fakeStore{}
	s := newTestKeeper(fs, time.Second, 1, 100)
	ctx := context.Background()
	o := holdAll(t, s, refN(1))
	fs.setReleaseFail(errors.New("redis down"))
	_, _ = s.unhold(ctx, refN(1), o, true)
	if err := s.hold(ctx, refN(1), o); err == nil {
		t.Fatal("a join went ahead of a release that still fails")
	}
	fs.setReleaseFail(nil)
	if err := s.hold(ctx, refN(1), o); err != nil {
		t.Fatal(err)
	}
	if got := fs.calledLog(); got != "[claim-start 0 claim-end 0 release-failed s001 release-failed s001 release s001 claim-start 1 claim-end 1]" {
		t.Fatalf("store calls: %s", got)
	}
}

// Slots whose refresh failed are refreshed again at once when the store
// answers: after an outage every session is refreshed within a tick,
// not in its slot's next turn.
func TestFailedSlotsCatchUpWhenTheStoreAnswers(t *testing.T) {
	fs := &fakeStore{}
	s := newTestKeeper(fs, time.Second, 4, 100)
	holdAll(t, s, refsN(8)...)
	ctx := context.Background()
	fs.mu.Lock()
	fs.fail = errors.New("redis down")
	fs.mu.Unlock()
	for i := range 4 {
		s.touchSlot(ctx, i)
	}
	fs.mu.Lock()
	fs.fail = nil
	fs.mu.Unlock()
	before := len(fs.calls())
	s.touchSlot(ctx, 0)
	s.catchUp(ctx)
	refreshed := map[presence.SessionRef]bool{}
	for _, c := range fs.calls()[before:] {
		for _, r := range c.refs {
			refreshed[r] = true
		}
	}
	if len(refreshed) != 8 {
		t.Fatalf("%d of 8 sessions refreshed after the outage, want all", len(refreshed))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.behind) != 0 {
		t.Fatalf("slots still behind: %v", s.behind)
	}
}

// A client leaves a connection on another node while its join there is
// still on its way to the store, and comes back here: the late claim
// takes the session from the live connection, and that node releases it
// at once as its connection is gone. The live connection here is not
// closed: the keeper finds the session held by no one and claims it back,
// and nothing is announced.
func TestALateClaimOfAGoneConnectionDoesNotCloseTheLiveOne(t *testing.T) {
	e := newEnv(t)
	n := e.newNode()
	c := n.dial(t, token(t, "lia", []string{"*"}, time.Hour), "tab")
	c.join("room")
	ref := presence.SessionRef{Room: "room", User: "lia", Session: "tab"}
	ctx := context.Background()
	res, err := e.store.Claim(ctx, []presence.SessionRef{ref}) // the late claim of the other node
	if err != nil || len(res.Taken) != 1 {
		t.Fatalf("late claim: %+v %v, want the session taken from the node", res, err)
	}
	if err := e.store.Release(ctx, ref); err != nil { // its connection is gone
		t.Fatal(err)
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		return errors.Join(testkit.WantSlice("lia's live sessions", e.live("room", "lia"), []string{"tab"}), testkit.Want("suspect sessions", n.keeper.suspectCount(), 0))
	})
	e.waitRedisPast(e.redisNow().Add(testTiming.OfflineGrace + time.Second + 2*testTiming.ReapInterval))
	c.ping() // still open: no 4001 came before the pong
	e.quiesce("room")
	if ts := e.rec.Of("", "room", "lia"); len(ts) != 1 || ts[0].Kind != presence.Online {
		t.Fatalf("lia's transitions: %v, want only her online", ts)
	}
}

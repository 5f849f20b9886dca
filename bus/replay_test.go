package bus_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/region"
)

// publishRaw stores an event without a Nats-Msg-Id, as a redelivery after
// the duplicate window would.
func publishRaw(tb testing.TB, e *env, t presence.Transition) {
	tb.Helper()
	if _, err := e.js.Publish(context.Background(), bus.IngestSubject(t), []byte(mustEncode(tb, t))); err != nil {
		tb.Fatal(err)
	}
}

func publish(tb testing.TB, e *env, ts ...presence.Transition) uint64 {
	tb.Helper()
	seq, err := e.pub.Publish(context.Background(), ts)
	if err != nil {
		tb.Fatal(err)
	}
	return seq
}

func TestReplayOrdersAndDedupes(t *testing.T) {
	e := newEnv(t, "eu")
	sseq := publish(t, e, tr("eu", "room42", "u1", presence.Online, 1), tr("eu", "room42", "u2", presence.Online, 2))
	snap := presence.Snapshot{Region: "eu", Room: "room42", RoomSeq: 2, StreamSeq: sseq}
	before := bus.MalformedEvents()

	var got collected
	r, err := bus.Replay(t.Context(), e.js, "eu", "room42", snap, got.add, bus.WithGapTimeout(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()

	publishRaw(t, e, tr("eu", "room42", "u1", presence.Online, 1)) // in the snapshot
	publish(t, e, tr("eu", "room7", "u1", presence.Online, 3))     // another room
	publish(t, e, tr("eu", "room42", "u3", presence.Online, 4))    // ahead of 3: held
	if err := e.nc.Publish("presence-in.eu.room42.online.u9", []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	publish(t, e, tr("eu", "room42", "u2", presence.Offline, 3))
	publishRaw(t, e, tr("eu", "room42", "u2", presence.Offline, 3)) // duplicate
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return nSeqs(got.seqs(), 2) })
	if s := got.seqs(); !slices.Equal(s, []uint64{3, 4}) || r.Seq() != 4 {
		t.Fatalf("delivered %v, Seq %d", s, r.Seq())
	}

	// 5 is missing: 6 waits for the gap timeout, then 5 is given up.
	start := time.Now()
	publish(t, e, tr("eu", "room42", "u3", presence.Offline, 6))
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return nSeqs(got.seqs(), 3) })
	if waited := time.Since(start); waited < 250*time.Millisecond {
		t.Fatalf("seq 6 delivered after %v, before the gap timeout", waited)
	}
	publish(t, e, tr("eu", "room42", "u4", presence.Online, 5)) // too late
	publish(t, e, tr("eu", "room42", "u4", presence.Online, 7))
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return nSeqs(got.seqs(), 4) })
	if s := got.seqs(); !slices.Equal(s, []uint64{3, 4, 6, 7}) || r.Seq() != 7 {
		t.Fatalf("delivered %v, Seq %d", s, r.Seq())
	}
	if n := bus.MalformedEvents() - before; n != 1 {
		t.Fatalf("malformed %d, want 1", n)
	}

	// Stop: fn is not called again.
	r.Stop()
	<-r.Done()
	publish(t, e, tr("eu", "room42", "u5", presence.Online, 8))
	// A second replayer sees 8; by then the stopped one would have too.
	var probe collected
	r2, err := bus.Replay(t.Context(), e.js, "eu", "room42", presence.Snapshot{Region: "eu", Room: "room42", RoomSeq: 7, StreamSeq: sseq}, probe.add)
	if err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return nSeqs(probe.seqs(), 1) })
	if len(got.seqs()) != 4 {
		t.Fatalf("called after Stop: %v", got.seqs())
	}
	// Cancelling the context stops it too.
	c, cancel := context.WithCancel(t.Context())
	r3, err := bus.Replay(c, e.js, "eu", "room42", presence.Snapshot{Region: "eu", Room: "room42"}, probe.add)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case <-r3.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("context cancel did not stop the replay")
	}
	r2.Stop()
}

func TestReplayNumbering(t *testing.T) {
	e := newEnv(t, "eu")
	old := func(seq uint64) presence.Transition {
		x := tr("eu", "room42", "u1", presence.Online, seq)
		x.ID = fmt.Sprintf("eu/room42/1000/%d", seq)
		x.Epoch = 1000
		x.At = time.UnixMilli(1000 + int64(seq))
		return x
	}
	now := time.Now()
	cur := func(seq uint64, user string, kind presence.Kind) presence.Transition {
		x := tr("eu", "room42", user, kind, seq)
		x.ID = fmt.Sprintf("eu/room42/%d/%d", now.UnixMilli(), seq)
		x.Epoch = now.UnixMilli()
		x.At = now.Add(time.Duration(seq) * time.Millisecond)
		return x
	}
	// An earlier numbering of the room, then the current one's first event
	// still in the store's outbox when the snapshot is taken: RoomSeq 1,
	// StreamSeq 0.
	publish(t, e, old(1), old(2), old(3))
	snap := presence.Snapshot{Region: "eu", Room: "room42", At: now, RoomSeq: 1, Epoch: now.UnixMilli()}
	var got collected
	r, err := bus.Replay(t.Context(), e.js, "eu", "room42", snap, got.add)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	publish(t, e, cur(1, "u1", presence.Online), cur(2, "u2", presence.Online), cur(3, "u1", presence.Offline))
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return nSeqs(got.seqs(), 2) })
	if ids := got.all(); ids[0].ID != cur(2, "", "").ID || ids[1].ID != cur(3, "", "").ID {
		t.Fatalf("delivered %v", ids)
	}

	// A later numbering (the room was empty long enough for the store to
	// forget it) restarts at 1 and is followed.
	later := now.Add(11 * time.Minute)
	next := func(seq uint64) presence.Transition {
		x := tr("eu", "room42", "u7", presence.Online, seq)
		x.ID = fmt.Sprintf("eu/room42/%d/%d", later.UnixMilli(), seq)
		x.Epoch = later.UnixMilli()
		x.At = later.Add(time.Duration(seq) * time.Millisecond)
		return x
	}
	publish(t, e, next(1))
	publish(t, e, cur(4, "u2", presence.Offline)) // a stray of the older numbering
	publish(t, e, next(2))
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return nSeqs(got.seqs(), 4) })
	if s := got.seqs(); !slices.Equal(s, []uint64{2, 3, 1, 2}) || r.Seq() != 2 {
		t.Fatalf("delivered %v, Seq %d", s, r.Seq())
	}
}

func TestReplayRejects(t *testing.T) {
	e := newEnv(t, "eu")
	noop := func(presence.Transition) {}
	for name, c := range map[string]struct {
		region, room string
		snap         presence.Snapshot
	}{
		"snapshot of another room":   {"eu", "room42", presence.Snapshot{Region: "eu", Room: "room7"}},
		"snapshot of another region": {"eu", "room42", presence.Snapshot{Region: "us", Room: "room42"}},
		"bad room":                   {"eu", "a>", presence.Snapshot{Region: "eu", Room: "a>"}},
		"no stream":                  {"ap", "room42", presence.Snapshot{Region: "ap", Room: "room42"}},
	} {
		if _, err := bus.Replay(t.Context(), e.js, c.region, c.room, c.snap, noop); err == nil || !strings.HasPrefix(err.Error(), "bus: replay") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// follower keeps a room's membership from a snapshot and the transitions
// after it, as a late subscriber does.
type follower struct {
	mu      sync.Mutex
	ready   bool
	base    uint64 // the snapshot's RoomSeq
	early   []presence.Transition
	members map[string]bool
	last    map[string]uint64 // user -> Seq of the last applied transition
	seqs    []uint64          // applied, in order
	dups    int
}

func newFollower() *follower {
	return &follower{members: map[string]bool{}, last: map[string]uint64{}}
}

func (f *follower) snapshot(s presence.Snapshot) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ready, f.base = true, s.RoomSeq
	for _, m := range s.Members {
		f.members[m.User] = true
	}
	for _, t := range f.early {
		f.apply(t)
	}
	f.early = nil
}

func (f *follower) on(t presence.Transition) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.ready {
		f.early = append(f.early, t)
		return
	}
	f.apply(t)
}

// apply is idempotent and tolerates any order: a user's state is that of
// their highest Seq.
func (f *follower) apply(t presence.Transition) {
	if t.Seq <= f.base {
		return
	}
	if slices.Contains(f.seqs, t.Seq) {
		f.dups++
		return
	}
	f.seqs = append(f.seqs, t.Seq)
	if t.Seq < f.last[t.User] {
		return
	}
	f.last[t.User] = t.Seq
	switch t.Kind {
	case presence.Online:
		f.members[t.User] = true
	case presence.Offline:
		delete(f.members, t.User)
	}
}

func (f *follower) state() (members []string, seqs []uint64, dups int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(maps.Keys(f.members)), slices.Clone(f.seqs), f.dups
}

func users(s presence.Snapshot) []string {
	out := make([]string, 0, len(s.Members))
	for _, m := range s.Members {
		out = append(out, m.User)
	}
	sort.Strings(out)
	return out
}

// heartbeat refreshes sessions as live nodes do. Holding mu across the
// touch means a removed session is never refreshed after remove returns.
type heartbeat struct {
	mu   sync.Mutex
	refs map[presence.SessionRef]bool
}

func (h *heartbeat) run(ctx context.Context, st *region.Store, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		h.mu.Lock()
		refs := slices.Collect(maps.Keys(h.refs))
		if len(refs) > 0 {
			_, _ = st.Refresh(ctx, refs)
		}
		h.mu.Unlock()
	}
}

func TestSnapshotThenReplayMatchesStore(t *testing.T) {
	e := newEnv(t, "eu")
	st := newStore(t, e.pub)
	startReaper(t, st)
	startService(t, e, st)
	const room = "room42"
	c, cancel := context.WithCancel(context.Background())
	defer cancel()

	hb := &heartbeat{refs: map[presence.SessionRef]bool{}}
	hbDone := make(chan struct{})
	go func() { defer close(hbDone); hb.run(c, st, 300*time.Millisecond) }()
	defer func() { cancel(); <-hbDone }()

	join := func(user string, sessions ...string) {
		t.Helper()
		refs := make([]presence.SessionRef, len(sessions))
		for i, s := range sessions {
			refs[i] = ref(room, user, s)
		}
		hb.mu.Lock()
		defer hb.mu.Unlock()
		if _, err := st.Claim(c, refs); err != nil {
			t.Fatal(err)
		}
		for _, r := range refs {
			hb.refs[r] = true
		}
	}
	unbeat := func(user string) []presence.SessionRef {
		hb.mu.Lock()
		defer hb.mu.Unlock()
		var out []presence.SessionRef
		for r := range hb.refs {
			if r.User == user {
				out = append(out, r)
				delete(hb.refs, r)
			}
		}
		return out
	}
	leave := func(user string) { // a clean close of every session
		t.Helper()
		for _, r := range unbeat(user) {
			if err := st.Release(c, r); err != nil {
				t.Fatal(err)
			}
		}
	}
	crash := func(user string) { unbeat(user) } // sessions expire

	// Before the late subscriber: members, departures after the grace and
	// an expiry.
	for i := range 15 {
		if i%3 == 0 {
			join(fmt.Sprintf("u%02d", i), "a", "b")
		} else {
			join(fmt.Sprintf("u%02d", i), "a")
		}
	}
	leave("u10")
	leave("u11")
	leave("u12")
	crash("u13")
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		n, err := st.Count(c, room)
		if err != nil {
			return err
		}
		if n > 12 {
			return fmt.Errorf("%d members, want at most 12 once u10-u12 are offline", n)
		}
		return nil
	})

	// Churn in the background: short-lived users join and leave while the
	// late subscriber subscribes and takes its snapshot, so transitions race
	// the snapshot and concurrent publishers interleave in the stream.
	churnStop := make(chan struct{})
	var churners sync.WaitGroup
	for g := range 3 {
		churners.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(g), 42))
			for {
				select {
				case <-churnStop:
					return
				default:
				}
				r := ref(room, fmt.Sprintf("c%d", rnd.IntN(12)), fmt.Sprintf("s%d", rnd.IntN(2)))
				switch rnd.IntN(3) {
				case 0:
					_, _ = st.Claim(c, []presence.SessionRef{r})
				case 1:
					_ = st.Release(c, r)
				case 2:
					_, _ = st.SetState(c, r, fmt.Appendf(nil, `{"n":%d}`, rnd.IntN(100)))
				}
				time.Sleep(time.Millisecond) // pacing, not waiting
			}
		})
	}
	churnDone := make(chan struct{})
	go func() { churners.Wait(); close(churnDone) }()
	defer func() {
		select {
		case <-churnStop:
		default:
			close(churnStop)
		}
		<-churnDone
	}()
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		n, err := st.Count(c, room)
		if err != nil {
			return err
		}
		return testkit.AtLeast("members with the churn", n, 12)
	})

	// The late subscriber: a core watch first, then the snapshot through the
	// service, then a replay from it.
	live, rep := newFollower(), newFollower()
	sub, err := bus.WatchRoom(e.nc, "eu", room, live.on)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	var snap presence.Snapshot
	query(t, e.nc, "members", `{"room":"room42","limit":1000}`, &snap)
	if snap.StreamSeq == 0 || snap.RoomSeq == 0 || snap.Total != len(snap.Members) {
		t.Fatalf("snapshot: %+v", snap)
	}
	live.snapshot(snap)
	rep.snapshot(snap)
	var order []uint64 // what Replay delivered, in order
	var orderMu sync.Mutex
	r, err := bus.Replay(c, e.js, "eu", room, snap, func(t presence.Transition) {
		orderMu.Lock()
		order = append(order, t.Seq)
		orderMu.Unlock()
		rep.on(t)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()

	// After the snapshot: joins, rejoins, clean leaves, a crash, a state change.
	for i := 15; i < 20; i++ {
		join(fmt.Sprintf("u%02d", i), "a")
	}
	for i := range 5 {
		leave(fmt.Sprintf("u%02d", i))
	}
	crash("u05")
	join("u10", "a")
	join("u13", "x")
	if ok, err := st.SetState(c, ref(room, "u06", "a"), []byte(`{"status":"away"}`)); !ok || err != nil {
		t.Fatalf("SetState: %v %v", ok, err)
	}
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		s, err := st.Snapshot(c, room, 0, 1)
		if err != nil {
			return err
		}
		return testkit.AtLeast("room seq, churning after the snapshot", s.RoomSeq, snap.RoomSeq+101)
	})
	close(churnStop)
	<-churnDone

	// Settle: churn users leave after their grace or expire; every
	// departure is announced by the reaper.
	want := []string{"u06", "u07", "u08", "u09", "u10", "u13", "u14", "u15", "u16", "u17", "u18", "u19"}
	var fresh presence.Snapshot
	testkit.CheckFor(t, 15*time.Second, 10*time.Millisecond, func() error {
		query(t, e.nc, "members", `{"room":"room42","limit":1000}`, &fresh)
		rm, _, _ := rep.state()
		lm, _, _ := live.state()
		return errors.Join(testkit.WantSlice("the store's members", users(fresh), want),
			testkit.Want("the replay's seq (the store's room seq)", r.Seq(), fresh.RoomSeq),
			testkit.WantSlice("the replay's members", rm, want), testkit.WantSlice("the watch's members", lm, want))
	})

	// Replay delivered exactly the transitions after the snapshot, once
	// each, in Seq order.
	orderMu.Lock()
	defer orderMu.Unlock()
	if len(order) == 0 || uint64(len(order)) != fresh.RoomSeq-snap.RoomSeq {
		t.Fatalf("replayed %d transitions, want %d (room seq %d -> %d)", len(order), fresh.RoomSeq-snap.RoomSeq, snap.RoomSeq, fresh.RoomSeq)
	}
	for i, s := range order {
		if s != snap.RoomSeq+1+uint64(i) {
			t.Fatalf("replay order: position %d has seq %d, want %d: %v", i, s, snap.RoomSeq+1+uint64(i), order)
		}
	}
	if _, _, dups := rep.state(); dups != 0 {
		t.Fatalf("replay delivered %d duplicates", dups)
	}
	// The core watch missed nothing either (it may see a retried publish
	// twice; the follower dedupes on Seq).
	_, ls, _ := live.state()
	if uint64(len(ls)) != fresh.RoomSeq-snap.RoomSeq {
		t.Fatalf("watch applied %d transitions, want %d", len(ls), fresh.RoomSeq-snap.RoomSeq)
	}
	// The stream holds each of the room's transitions exactly once.
	info, err := e.stream.Info(c, jetstream.WithSubjectFilter(bus.RoomFilter("eu", room)))
	if err != nil {
		t.Fatal(err)
	}
	stored := uint64(0)
	for _, n := range info.State.Subjects {
		stored += n
	}
	if stored != fresh.RoomSeq {
		t.Fatalf("stream holds %d transitions of %s, room seq is %d", stored, room, fresh.RoomSeq)
	}
	t.Logf("snapshot at room seq %d (stream %d), %d transitions replayed, final room seq %d, %d stored out of Seq order",
		snap.RoomSeq, snap.StreamSeq, len(order), fresh.RoomSeq, inversions(t, e, room))
}

// inversions counts the room's transitions stored after one with a higher
// Seq: the reordering Replay undoes.
func inversions(tb testing.TB, e *env, room string) int {
	tb.Helper()
	cons, err := e.js.OrderedConsumer(context.Background(), bus.StreamName("eu"), jetstream.OrderedConsumerConfig{FilterSubjects: []string{bus.RoomFilter("eu", room)}})
	if err != nil {
		tb.Fatal(err)
	}
	n, high := 0, uint64(0)
	for {
		batch, err := cons.FetchNoWait(100)
		if err != nil {
			tb.Fatal(err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			t, err := bus.DecodeEvent(m.Data())
			if err != nil {
				tb.Fatal(err)
			}
			if t.Seq < high {
				n++
			}
			high = max(high, t.Seq)
		}
		if got == 0 {
			return n
		}
	}
}

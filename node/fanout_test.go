package node

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
)

// The tick's fan-out, driven by hand on a hub with no I/O: connections
// whose writer is marked running keep their frames queued for the test to
// read.

func fanoutHub(t *testing.T, batchFrom int) (*hub, *room) {
	t.Helper()
	m, err := newMetrics(prometheus.NewRegistry(), gauges{func() int { return 0 }, func() int { return 0 }, func() int { return 0 }, func() int { return 0 }, func() int { return 0 }, func() float64 { return 0 }})
	if err != nil {
		t.Fatal(err)
	}
	h := &hub{log: quiet, metrics: m, rooms: map[string]*room{}, gappy: map[*room]struct{}{},
		out:     newFanout(0, batchFrom, 0, m, nil, nil),
		watches: &watches{log: quiet, metrics: m, watched: map[string]*wroom{}, reorder: map[*wuser]*wroom{}}}
	r := &room{name: "r", view: "eu", members: map[*conn]*member{}, resyncing: true, // no resync goroutine: the test looks at who waits
		seq: bus.NewSequencer[event](bus.SeqLimits{GapTimeout: time.Second, MaxAhead: maxHeld})}
	h.rooms["r"] = r
	return h, r
}

func queuedConn(user string) *conn {
	return &conn{d: &connDeps{lim: Limits{SendQueue: 1000}, log: quiet}, user: user, writing: true}
}

func (c *conn) takeQueue() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, f := range c.queue {
		out = append(out, string(f.b))
	}
	c.queue = nil
	return out
}

// fanEvent is transition seq of the room, as the hub gets it from NATS.
func fanEvent(seq uint64, kind presence.Kind, reason presence.Reason) event {
	t := presence.Transition{ID: fmt.Sprintf("eu/r/7/%d", seq), Region: "eu", Room: "r", User: fmt.Sprintf("u%d", seq), Kind: kind, Reason: reason,
		Sessions: 1, Seq: seq, Epoch: 7, Session: "s"}
	frame, err := encodeEvent(t)
	if err != nil {
		panic(err)
	}
	return event{epoch: 7, seq: seq, frame: frame, entry: encodeEntry(t), sessionsOnly: sessionsOnly(t)}
}

func entrySeqs(t *testing.T, f string) []uint64 {
	t.Helper()
	var fr struct {
		Type   string
		Epoch  int64
		Events [][]json.RawMessage
	}
	if err := json.Unmarshal([]byte(f), &fr); err != nil || fr.Type != "events" || fr.Epoch != 7 {
		t.Fatalf("not an events frame of epoch 7: %s (%v)", f, err)
	}
	var seqs []uint64
	for _, e := range fr.Events {
		var s uint64
		if err := json.Unmarshal(e[0], &s); err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, s)
	}
	return seqs
}

func TestATicksEventsGoOutAsOneFramePerMember(t *testing.T) {
	h, r := fanoutHub(t, 2)
	batch, states, single := queuedConn("batch"), queuedConn("states"), queuedConn("single")
	r.members[batch] = &member{in: interest{detail: detailSessions, batch: true}}
	r.members[states] = &member{in: interest{detail: detailStates, batch: true}}
	r.members[single] = &member{in: interest{detail: detailSessions}}
	h.mu.Lock()
	if !h.readyLocked(r, presence.Snapshot{Room: "r", Epoch: 7, RoomSeq: 10}, "j", protocol.ReasonJoin, r.members) {
		t.Fatal("snapshot refused")
	}
	h.mu.Unlock()
	for _, c := range []*conn{batch, states, single} {
		c.takeQueue()
	}

	h.mu.Lock()
	h.eventLocked(r, fanEvent(11, presence.Online, presence.Joined))
	h.eventLocked(r, fanEvent(12, presence.Update, presence.Joined)) // a second tab: sessions only
	h.eventLocked(r, fanEvent(13, presence.Offline, presence.Left))
	h.mu.Unlock()
	if got := single.takeQueue(); len(got) != 3 || !strings.HasPrefix(got[0], `{"type":"event"`) {
		t.Fatalf("a member without batch got %q, want three event frames at once", got)
	}
	if got := batch.takeQueue(); len(got) != 0 {
		t.Fatalf("a batch member got %q before the tick", got)
	}
	h.fanOut()
	if got := batch.takeQueue(); len(got) != 1 || fmt.Sprint(entrySeqs(t, got[0])) != "[11 12 13]" {
		t.Fatalf("batch member at the tick: %q, want one frame of 11..13", got)
	}
	if got := states.takeQueue(); len(got) != 1 || fmt.Sprint(entrySeqs(t, got[0])) != "[11 13]" {
		t.Fatalf("states member at the tick: %q, want 11 and 13 (12 is sessions only)", got)
	}
	h.fanOut()
	if got := batch.takeQueue(); len(got) != 0 {
		t.Fatalf("a tick with nothing new sent %q", got)
	}

	// A member that joins in the middle of a tick gets the rest of it
	// once: its buffered events with its snapshot, the others at the tick.
	late := queuedConn("late")
	h.mu.Lock()
	r.members[late] = &member{in: interest{detail: detailSessions, batch: true}}
	r.noteLocked(late, r.members[late]) // as add does
	h.eventLocked(r, fanEvent(14, presence.Online, presence.Joined))
	h.eventLocked(r, fanEvent(15, presence.Online, presence.Joined))
	if !h.readyLocked(r, presence.Snapshot{Room: "r", Epoch: 7, RoomSeq: 14}, "j", protocol.ReasonJoin, map[*conn]*member{late: r.members[late]}) {
		t.Fatal("late snapshot refused")
	}
	h.eventLocked(r, fanEvent(16, presence.Online, presence.Joined))
	h.mu.Unlock()
	h.fanOut()
	got := late.takeQueue()
	if len(got) != 3 || !strings.Contains(got[0], `"room_seq":14`) || fmt.Sprint(entrySeqs(t, got[1])) != "[15]" || fmt.Sprint(entrySeqs(t, got[2])) != "[16]" {
		t.Fatalf("late member: %q, want its snapshot at 14, a batch of 15 with it, then a batch of 16", got)
	}
	if got := batch.takeQueue(); len(got) != 1 || fmt.Sprint(entrySeqs(t, got[0])) != "[14 15 16]" {
		t.Fatalf("batch member: %q, want 14..16", got)
	}
}

func TestAMemberThatFallsBehindIsResyncedNotQueued(t *testing.T) {
	h, r := fanoutHub(t, 1)
	slow := queuedConn("slow")
	r.members[slow] = &member{in: interest{batch: true}}
	h.mu.Lock()
	h.readyLocked(r, presence.Snapshot{Room: "r", Epoch: 7, RoomSeq: 0}, "j", protocol.ReasonJoin, r.members)
	h.mu.Unlock()
	seq := uint64(0)
	for range behindFrames + 20 { // the client reads nothing
		seq++
		h.mu.Lock()
		h.eventLocked(r, fanEvent(seq, presence.Online, presence.Joined))
		h.mu.Unlock()
		h.fanOut()
	}
	if n := slow.queued(); n != behindFrames {
		t.Fatalf("a member that reads nothing has %d frames queued, want the bound %d", n, behindFrames)
	}
	h.mu.Lock()
	m := r.members[slow]
	if !m.behind || m.live || m.resync {
		t.Fatalf("member behind %v live %v resync %v, want behind only", m.behind, m.live, m.resync)
	}
	h.mu.Unlock()
	slow.takeQueue() // the client reads its queue
	h.fanOut()
	h.mu.Lock()
	if m.behind || !m.resync {
		t.Fatalf("a drained member: behind %v resync %v, want a resync", m.behind, m.resync)
	}
	if !h.readyLocked(r, presence.Snapshot{Room: "r", Epoch: 7, RoomSeq: seq}, "", protocol.ReasonResync, map[*conn]*member{slow: m}) {
		t.Fatal("resync snapshot refused")
	}
	h.eventLocked(r, fanEvent(seq+1, presence.Online, presence.Joined))
	h.mu.Unlock()
	h.fanOut()
	got := slow.takeQueue()
	if len(got) != 2 || !strings.Contains(got[0], `"reason":"resync"`) || fmt.Sprint(entrySeqs(t, got[1])) != fmt.Sprintf("[%d]", seq+1) {
		t.Fatalf("after the resync: %q", got)
	}
}

// usersAt answers every watch read with no members at a fixed room_seq.
type usersAt struct{ seq uint64 }

func (u usersAt) Snapshot(context.Context, string, int, int) (presence.Snapshot, error) {
	return presence.Snapshot{}, nil
}
func (u usersAt) Users(_ context.Context, room string, _ []string) (presence.Snapshot, error) {
	return presence.Snapshot{Region: "eu", Room: room, Epoch: 7, RoomSeq: u.seq, Members: []presence.Member{}}, nil
}

// A watched user's events wait out the reorder window and go out in seq
// order; one that comes later than that, below a seq already sent, reads
// the watcher again instead of being lost or sent out of order.
func TestWatchedEventsAreReorderedOrTheWatcherIsReadAgain(t *testing.T) {
	h, _ := fanoutHub(t, 100)
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); wg.Wait() }()
	ws := h.watches
	ws.ctx, ws.wg, ws.timeout, ws.reader = ctx, &wg, time.Second, usersAt{seq: 20}
	c := queuedConn("w")
	wt := &watcher{users: []string{"u"}, epoch: 7, after: 10, live: true, last: map[string]uint64{}}
	wu := &wuser{user: "u", ready: make(chan struct{}), watchers: map[*conn]*watcher{c: wt}}
	w := &wroom{name: "r", users: map[string]*wuser{"u": wu}, watchers: map[*conn]*watcher{c: wt}}
	ws.watched["r"] = w
	ev := func(seq uint64) event {
		e := fanEvent(seq, presence.Update, presence.State)
		e.user, e.frame = "u", watchFrame(e.frame)
		return e
	}
	t0 := time.Now()
	ws.mu.Lock()
	ws.holdWatchEventLocked(w, ev(12), t0)
	ws.holdWatchEventLocked(w, ev(11), t0.Add(50*time.Millisecond))
	ws.releaseWatchEventsLocked(t0.Add(watchReorder)) // 12 is due, 11 not: 12 waits for it
	ws.mu.Unlock()
	if got := c.takeQueue(); len(got) != 0 {
		t.Fatalf("sent %q before the lower seq's window ended", got)
	}
	ws.mu.Lock()
	ws.releaseWatchEventsLocked(t0.Add(50*time.Millisecond + watchReorder))
	ws.holdWatchEventLocked(w, ev(14), t0.Add(time.Second))
	ws.releaseWatchEventsLocked(t0.Add(time.Second + watchReorder))
	ws.holdWatchEventLocked(w, ev(13), t0.Add(2*time.Second)) // far too late
	ws.releaseWatchEventsLocked(t0.Add(2*time.Second + watchReorder))
	ws.mu.Unlock()
	// 13 came past its window: the watcher is read again, in a goroutine
	// of its own, so the resync frame may be queued before this reads the
	// queue or after; either way it comes after 11, 12 and 14, and last.
	var got []string
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		got = append(got, c.takeQueue()...)
		if len(got) > 0 && strings.Contains(got[len(got)-1], `"reason":"resync"`) {
			return nil
		}
		return fmt.Errorf("the watcher's frames %q, want the resync last", got)
	})
	if len(got) != 4 || !strings.Contains(got[0], `"seq":11`) || !strings.Contains(got[1], `"seq":12`) || !strings.Contains(got[2], `"seq":14`) {
		t.Fatalf("watcher got %q, want 11, 12, 14, then the resync", got)
	}
}

// Past the budget a busy room goes out less often, its frames carrying
// more events; every event still arrives, in order, once.
func TestTheBudgetSpacesABusyRoomsFrames(t *testing.T) {
	h, r := fanoutHub(t, 1)
	h.out.tick, h.out.budget = 100*time.Millisecond, 20 // 4 members at 20 frames/s: a frame each 200 ms
	clock := time.Unix(1000, 0)
	h.out.clock = func() time.Time { return clock }
	var cs []*conn
	for i := range 4 {
		c := queuedConn(fmt.Sprint(i))
		r.members[c] = &member{in: interest{batch: true}}
		cs = append(cs, c)
	}
	h.mu.Lock()
	h.readyLocked(r, presence.Snapshot{Room: "r", Epoch: 7}, "j", protocol.ReasonJoin, r.members)
	h.mu.Unlock()
	for _, c := range cs {
		c.takeQueue()
	}
	var got []uint64
	frames := 0
	for seq := uint64(1); seq <= 10; seq++ { // ten ticks, an event in each
		h.mu.Lock()
		h.eventLocked(r, fanEvent(seq, presence.Online, presence.Joined))
		clock = clock.Add(h.out.tick) // a tick's time passes
		h.mu.Unlock()
		h.fanOut()
		for _, f := range cs[0].takeQueue() {
			frames++
			got = append(got, entrySeqs(t, f)...)
		}
	}
	if frames != 5 {
		t.Fatalf("%d frames in ten ticks, want one every other tick", frames)
	}
	if fmt.Sprint(got) != "[1 2 3 4 5 6 7 8 9]" && fmt.Sprint(got) != "[1 2 3 4 5 6 7 8 9 10]" {
		t.Fatalf("events %v, want 1..9 or 1..10 in order (10 may wait a tick)", got)
	}
}

// Members waiting for their snapshots share one buffer of the room's
// events. Full, it drops what no waiting member needs, else everything;
// a snapshot older than what was dropped is refused (read again), a newer
// one takes the rest of the buffer.
func TestWaitingMembersShareOneBoundedBuffer(t *testing.T) {
	h, r := fanoutHub(t, 0)
	a, w := queuedConn("a"), queuedConn("w")
	a.d = &connDeps{lim: Limits{SendQueue: 1 << 20}, log: quiet} // it reads nothing here
	r.members[a] = &member{in: interest{detail: detailSessions}}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.readyLocked(r, presence.Snapshot{Room: "r", Epoch: 7}, "j", protocol.ReasonJoin, r.members) {
		t.Fatal("first snapshot refused")
	}
	r.members[w] = &member{in: interest{detail: detailSessions}}
	r.noteLocked(w, r.members[w]) // as add does: w waits, from seq 0
	last := uint64(maxBuffered + 10)
	for seq := uint64(1); seq <= last; seq++ {
		h.eventLocked(r, fanEvent(seq, presence.Online, presence.Joined))
	}
	if len(r.buffered) > maxBuffered || r.dropped == 0 {
		t.Fatalf("buffer of %d events, dropped up to %d: want it bounded", len(r.buffered), r.dropped)
	}
	if h.readyLocked(r, presence.Snapshot{Room: "r", Epoch: 7, RoomSeq: 5}, "j", protocol.ReasonJoin, map[*conn]*member{w: r.members[w]}) {
		t.Fatal("a snapshot older than the dropped events served")
	}
	w.takeQueue()
	if !h.readyLocked(r, presence.Snapshot{Room: "r", Epoch: 7, RoomSeq: last - 3}, "j", protocol.ReasonJoin, map[*conn]*member{w: r.members[w]}) {
		t.Fatal("a snapshot newer than the dropped events refused")
	}
	got := w.takeQueue()
	if len(got) != 4 || !strings.Contains(got[1], fmt.Sprintf(`"seq":%d`, last-2)) || !strings.Contains(got[3], fmt.Sprintf(`"seq":%d`, last)) {
		t.Fatalf("w got %d frames, want its snapshot then the last three events", len(got))
	}
	if r.buffered != nil || len(r.waiting) != 0 {
		t.Fatalf("the last waiting member went live and %d events stay buffered", len(r.buffered))
	}
	if n := len(a.takeQueue()); n != int(last)+1 {
		t.Fatalf("the live member got %d frames, want its snapshot and %d events", n, last)
	}
}

// A storm: the events that arrive while joiners' snapshot is read follow
// it as one events frame for each joiner taking them, however many there
// are, and one frame each for a joiner that does not.
func TestEventsDuringASnapshotReadFollowItAsOneFrame(t *testing.T) {
	h, r := fanoutHub(t, 1000) // not batching: the room is small
	batch, single, old := queuedConn("batch"), queuedConn("single"), queuedConn("old")
	h.mu.Lock()
	r.members[old] = &member{in: interest{detail: detailSessions}}
	if !h.readyLocked(r, presence.Snapshot{Room: "r", Epoch: 7, RoomSeq: 10}, "j", protocol.ReasonJoin, r.members) {
		t.Fatal("the room's first snapshot was refused")
	}
	joiners := map[*conn]*member{}
	for _, c := range []*conn{batch, single} {
		r.members[c] = &member{in: interest{detail: detailSessions, batch: c == batch}}
		r.noteLocked(c, r.members[c])
		joiners[c] = r.members[c]
	}
	for seq := uint64(11); seq <= 400; seq++ {
		h.eventLocked(r, fanEvent(seq, presence.Online, presence.Joined))
	}
	if !h.readyLocked(r, presence.Snapshot{Room: "r", Epoch: 7, RoomSeq: 10}, "j", protocol.ReasonJoin, joiners) {
		t.Fatal("snapshot refused")
	}
	h.eventLocked(r, fanEvent(401, presence.Online, presence.Joined))
	h.mu.Unlock()
	got := batch.takeQueue()
	if len(got) != 3 || !strings.Contains(got[0], `"room_seq":10`) || len(entrySeqs(t, got[1])) != 390 || !strings.Contains(got[2], `"seq":401`) {
		t.Fatalf("batch joiner got %d frames, want its snapshot, one frame of 11..400, then event 401", len(got))
	}
	if seqs := entrySeqs(t, got[1]); seqs[0] != 11 || seqs[389] != 400 {
		t.Fatalf("the frame holds %d..%d, want 11..400", seqs[0], seqs[389])
	}
	if got := single.takeQueue(); len(got) != 392 {
		t.Fatalf("a joiner without batch got %d frames, want its snapshot and 391 events", len(got))
	}
}

// TestABusyRoomsMembersTakeTurns: when the budget sends a room every
// third tick, a third of its members (by slot) get their frame at each
// tick instead of all at once: each still gets every event once and in
// order, in at most one frame per three ticks; pending keeps what the
// other turns still need and empties once every member has it.
func TestABusyRoomsMembersTakeTurns(t *testing.T) {
	h, r := fanoutHub(t, 1)
	h.out.tick, h.out.budget = 100*time.Millisecond, 30 // 9 members at 30 frames/s: every 300 ms, 3 turns
	clock := time.Unix(1000, 0)
	h.out.clock = func() time.Time { return clock }
	var conns []*conn
	h.mu.Lock()
	for i := range 9 {
		c := queuedConn(fmt.Sprint("u", i))
		r.members[c] = &member{in: interest{detail: detailSessions, batch: true}, slot: uint32(i)}
		conns = append(conns, c)
	}
	if !h.readyLocked(r, presence.Snapshot{Room: "r", Epoch: 7, RoomSeq: 10}, "j", protocol.ReasonJoin, r.members) {
		t.Fatal("snapshot refused")
	}
	h.mu.Unlock()
	got := map[*conn][]uint64{}
	frames := map[*conn]int{}
	take := func() {
		for _, c := range conns {
			for _, f := range c.takeQueue() {
				if strings.HasPrefix(f, `{"type":"snapshot"`) {
					continue
				}
				got[c] = append(got[c], entrySeqs(t, f)...)
				frames[c]++
			}
		}
	}
	take()
	tick := func(seqs ...uint64) {
		h.mu.Lock()
		for _, s := range seqs {
			h.eventLocked(r, fanEvent(s, presence.Online, presence.Joined))
		}
		clock = clock.Add(h.out.tick) // the next tick is due
		h.mu.Unlock()
		h.fanOut()
		take()
	}
	tick(11, 12)
	if n := len(got); n != 3 {
		t.Fatalf("after the first turn %d members have events, want 3 of 9", n)
	}
	// Nine more members join: the room's interval doubles (6 turns), but
	// the round under way keeps its 3, so every member gets its turn.
	h.mu.Lock()
	late := map[*conn]*member{}
	for i := 9; i < 18; i++ {
		c := queuedConn(fmt.Sprint("u", i))
		r.members[c] = &member{in: interest{detail: detailSessions, batch: true}, slot: uint32(i)}
		late[c] = r.members[c]
	}
	if !h.readyLocked(r, presence.Snapshot{Room: "r", Epoch: 7, RoomSeq: 12}, "j", protocol.ReasonJoin, late) {
		t.Fatal("snapshot refused")
	}
	h.mu.Unlock()
	for c := range late {
		c.takeQueue()
	}
	tick(13) // the second turn gets 11..13, the first waits for its next turn
	tick()   // the third turn
	for i, c := range conns {
		if len(got[c]) < 2 {
			t.Errorf("member %d had no turn in the first round: %v", i, got[c])
		}
	}
	for range 6 { // a round of 6 turns: everyone gets 13
		tick()
	}
	for i, c := range conns {
		if fmt.Sprint(got[c]) != "[11 12 13]" {
			t.Errorf("member %d got %v, want 11 12 13 once each, in order", i, got[c])
		}
		if frames[c] > 2 {
			t.Errorf("member %d got %d frames in two rounds, want at most 2", i, frames[c])
		}
	}
	for c := range late {
		if q := c.takeQueue(); len(q) != 1 || fmt.Sprint(entrySeqs(t, q[0])) != "[13]" {
			t.Errorf("a late member got %q, want one frame of 13", q)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(r.pending) != 0 {
		t.Errorf("pending still holds %d events every member has", len(r.pending))
	}
	if _, dirty := h.out.dirty[r]; dirty {
		t.Error("the room stays dirty with nothing to send")
	}
}

func TestTurnsGoEveryGrainAndOtherRoomsAtTheTick(t *testing.T) {
	// 12 members at 40 frames/s: every 300 ms, 12 turns of 25 ms.
	h, r, conns, clock := grainHub(t, 40)
	got := func() (who []int) {
		for i, c := range conns {
			for _, f := range c.takeQueue() {
				if s := fmt.Sprint(entrySeqs(t, f)); s != "[11]" {
					t.Errorf("member %d got %s, want [11]", i, s)
				}
				who = append(who, i)
			}
		}
		return who
	}
	grain := func(full bool) {
		*clock = clock.Add(h.out.tick / 4) // the next grain is due
		h.fan(full)
	}
	// Between ticks, the turns go on: one member a grain, each once.
	for i := range 12 {
		grain(i%4 == 0)
		if w := got(); fmt.Sprint(w) != fmt.Sprint([]int{i}) {
			t.Fatalf("grain %d sent to members %v, want [%d]", i, w, i)
		}
	}
	h.mu.Lock()
	if len(r.pending) != 0 {
		t.Fatalf("pending holds %d events after a whole round", len(r.pending))
	}
	// The budget no longer binds: the room goes at the tick, as one
	// frame to every member, and not between ticks.
	h.out.budget = 0
	h.eventLocked(r, fanEvent(12, presence.Online, presence.Joined))
	h.mu.Unlock()
	grain(false)
	for i, c := range conns {
		if q := c.takeQueue(); len(q) != 0 {
			t.Fatalf("a room not taking turns sent member %d %q between ticks", i, q)
		}
	}
	// Member 11 had its turn just now: not a second frame within a tick.
	grain(true)
	for i, c := range conns {
		if q := c.takeQueue(); len(q) != 0 {
			t.Fatalf("member %d got %q within a tick of the last turn", i, q)
		}
	}
	for range 3 {
		grain(false)
	}
	grain(true) // a tick after the last turn
	for i, c := range conns {
		if q := c.takeQueue(); len(q) != 1 || fmt.Sprint(entrySeqs(t, q[0])) != "[12]" {
			t.Fatalf("member %d got %q at the tick, want one frame of 12", i, q)
		}
	}
}

func TestAGrainIsAShareOfTheTick(t *testing.T) {
	for _, c := range []struct {
		tick  time.Duration
		split int
	}{{100 * time.Millisecond, 4}, {20 * time.Millisecond, 4}, {12 * time.Millisecond, 2}, {5 * time.Millisecond, 1}} {
		if got := splitOf(c.tick); got != c.split {
			t.Errorf("splitOf(%v) = %d, want %d", c.tick, got, c.split)
		}
	}
}

func TestNoTurnSendsAMemberTwoFramesWithinATick(t *testing.T) {
	// 12 members at 69 frames/s: every 174 ms, 7 turns of 25 ms; at 80
	// frames/s, every 150 ms, 6 turns. Slot 6 is the last of 7 turns and
	// the first of 6.
	h, r, conns, clock := grainHub(t, 69)
	last := map[int]time.Time{}
	grain := func() {
		*clock = clock.Add(h.out.tick / 4)
		h.fan(false)
		for i, c := range conns {
			for range c.takeQueue() {
				if at, ok := last[i]; ok && clock.Sub(at) < h.out.tick {
					t.Fatalf("member %d got a frame %v after its last", i, clock.Sub(at))
				}
				last[i] = *clock
			}
		}
	}
	for range 7 { // a round of 7
		grain()
	}
	if len(last) != 12 {
		t.Fatalf("a round of 7 turns sent to %d of 12 members", len(last))
	}
	h.mu.Lock()
	h.out.budget = 80
	h.eventLocked(r, fanEvent(12, presence.Online, presence.Joined))
	h.mu.Unlock()
	first := *clock
	for range 12 { // two rounds of 6: slot 6 waits one
		grain()
	}
	for i := range conns {
		if !last[i].After(first) {
			t.Errorf("member %d never got 12", i)
		}
	}
}

// grainHub is a hub of 100 ms ticks in grains of 25 ms, on a scripted
// clock (*clock), at budget frames/s, with a room of 12 live members in
// slots 0..11 and event 11 pending.
func grainHub(t *testing.T, budget int) (*hub, *room, []*conn, *time.Time) {
	t.Helper()
	h, r := fanoutHub(t, 1)
	h.out.tick, h.out.split, h.out.budget = 100*time.Millisecond, 4, budget
	clock := new(time.Time)
	*clock = time.Unix(1000, 0)
	h.out.clock = func() time.Time { return *clock }
	conns := liveTurnMembers(t, h, r, 12)
	h.mu.Lock()
	h.eventLocked(r, fanEvent(11, presence.Online, presence.Joined))
	h.mu.Unlock()
	return h, r, conns, clock
}

// liveTurnMembers adds n live members taking events frames to r, in slots
// 0..n-1, after a snapshot at room_seq 10 (taken off their queues).
func liveTurnMembers(t *testing.T, h *hub, r *room, n int) []*conn {
	t.Helper()
	var conns []*conn
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := range n {
		c := queuedConn(fmt.Sprint("u", i))
		r.members[c] = &member{in: interest{detail: detailSessions, batch: true}, slot: uint32(i)}
		conns = append(conns, c)
	}
	if !h.readyLocked(r, presence.Snapshot{Room: "r", Epoch: 7, RoomSeq: 10}, "j", protocol.ReasonJoin, r.members) {
		t.Fatal("snapshot refused")
	}
	for _, c := range conns {
		c.takeQueue()
	}
	return conns
}

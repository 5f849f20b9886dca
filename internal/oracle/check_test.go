package oracle

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// s is a time in seconds since the run's start.
func s(x float64) time.Duration { return time.Duration(x * float64(time.Second)) }

// trace builds a synthetic run: what a harness would record.
type trace struct {
	r   *Run
	seq map[string]uint64
}

func newTrace() *trace {
	return &trace{r: &Run{Seed: 1, Timing: TimingA, End: s(60), Ops: map[string]int{},
		Nodes: []Node{{ID: 0, Slot: 0, Died: None}, {ID: 1, Slot: 1, Died: None}}}, seq: map[string]uint64{}}
}

func (t *trace) conn(user, session string, node int, at float64) int {
	id := len(t.r.Conns)
	t.r.Conns = append(t.r.Conns, Conn{ID: id, User: user, Session: session, Node: node, Dialed: s(at), Opened: s(at), End: None})
	return id
}

func (t *trace) join(c int, room string, sent, acked float64) {
	ack := s(acked)
	if acked < 0 {
		ack = None
	}
	t.r.Conns[c].Holds = append(t.r.Conns[c].Holds, Hold{Room: room, JoinSent: s(sent), JoinAcked: ack, LeaveSent: None})
}

func (t *trace) leave(c int, room string, at float64) {
	hs := t.r.Conns[c].Holds
	for i := range hs {
		if hs[i].Room == room && hs[i].LeaveSent == None {
			hs[i].LeaveSent = s(at)
		}
	}
}

func (t *trace) end(c int, how ConnEnd, at float64, code int) {
	t.r.Conns[c].End, t.r.Conns[c].How, t.r.Conns[c].Code = s(at), how, code
}

func (t *trace) kill(node int, at float64) {
	t.r.Nodes[node].Died, t.r.Nodes[node].Killed = s(at), true
}

// ev records an event in the stream and at the core subscriber 5ms later;
// an online or an update leaves the user one session.
func (t *trace) ev(kind, reason, room, user string, at float64) Event {
	n := 1
	if kind == "offline" {
		n = 0
	}
	return t.evN(kind, reason, room, user, at, n)
}

// evN is ev with the event's count of the user's sessions.
func (t *trace) evN(kind, reason, room, user string, at float64, sessions int) Event {
	t.seq[room]++
	e := Event{ID: fmt.Sprintf("eu/%s/1/%d", room, t.seq[room]), Kind: kind, Reason: reason, Room: room, User: user,
		Sessions: sessions, Seq: t.seq[room], Epoch: 1, At: s(at), Arrived: None, Stored: s(at + 0.002)}
	t.r.Stream = append(t.r.Stream, e)
	e.Arrived, e.Stored = s(at+0.005), None
	t.r.Core = append(t.r.Core, e)
	return e
}

// final records a quiet end: the query service, the fresh snapshot and the
// given views all show want.
func (t *trace) final(want map[string]Members, views ...View) {
	t.r.Final = Final{At: s(59), Query: want, Fresh: want, Observer: "obs", Views: views}
}

func (t *trace) check(tb testing.TB) *Report {
	tb.Helper()
	rep := Check(t.r)
	tb.Logf("\n%s%s", rep, rep.Details(t.r, 20))
	return rep
}

// correct is a trace of a correct service covering the main cases.
func correct() *trace {
	t := newTrace()
	// a: clean close, left one grace later.
	a := t.conn("a", "a1", 0, 1)
	t.join(a, "r", 1, 1.01)
	t.ev("online", "joined", "r", "a", 1.005)
	t.end(a, Closed, 5, 0)
	// b: its node is killed at 10s: expired about a TTL later.
	b := t.conn("b", "b1", 1, 1.1)
	t.join(b, "r", 1.1, 1.12)
	t.ev("online", "joined", "r", "b", 1.11)
	// c: reset at 3s, back at 3.3s (inside): nothing.
	c := t.conn("c", "c1", 0, 1.2)
	t.join(c, "r", 1.2, 1.22)
	t.ev("online", "joined", "r", "c", 1.21)
	t.end(c, Reset, 3, 0)
	c2 := t.conn("c", "c1", 0, 3.3)
	t.join(c2, "r", 3.3, 3.35)
	// d: closes at 4s, back at 7s (beyond): offline, online.
	d := t.conn("d", "d1", 0, 1.3)
	t.join(d, "r", 1.3, 1.32)
	t.ev("online", "joined", "r", "d", 1.31)
	t.end(d, Closed, 4, 0)
	t.ev("offline", "left", "r", "d", 5.6)
	t.ev("offline", "left", "r", "a", 6.6)
	d2 := t.conn("d", "d1", 0, 7)
	t.join(d2, "r", 7, 7.05)
	t.ev("online", "joined", "r", "d", 7.02)
	// e: two tabs; one closes: nothing.
	e1 := t.conn("e", "e1", 0, 1.4)
	t.join(e1, "r", 1.4, 1.42)
	t.ev("online", "joined", "r", "e", 1.41)
	e2 := t.conn("e", "e2", 0, 1.5)
	t.join(e2, "r", 1.5, 1.52)
	t.end(e1, Closed, 8, 0)
	// f: handover at 5s: the new connection on node 1 takes the session,
	// node 0 closes the old one with 4001: nothing (until node 1 dies).
	f1 := t.conn("f", "f1", 0, 1.6)
	t.join(f1, "r", 1.6, 1.62)
	t.ev("online", "joined", "r", "f", 1.61)
	f2 := t.conn("f", "f1", 1, 4.9)
	t.end(f1, ServerClosed, 4.91, CodeSessionMoved)
	t.join(f2, "r", 4.92, 4.95)
	// g: leaves r2 at 9s while staying in r.
	g := t.conn("g", "g1", 0, 1.7)
	t.join(g, "r", 1.7, 1.72)
	t.ev("online", "joined", "r", "g", 1.71)
	t.join(g, "r2", 2, 2.02)
	t.ev("online", "joined", "r2", "g", 2.01)
	t.leave(g, "r2", 9)
	t.ev("offline", "left", "r2", "g", 10.6)
	t.r.Conns[g].States = append(t.r.Conns[g].States, StateSet{Room: "r", Sent: s(3), Acked: s(3.01), State: `{"s":"away"}`})
	t.ev("update", "state", "r", "g", 3.005)
	// b's departure; f2 on node 1 dies with it, and f too.
	t.kill(1, 10)
	t.ev("offline", "expired", "r", "b", 12.4)
	t.ev("offline", "expired", "r", "f", 12.5)
	t.final(map[string]Members{"r": {
		"c": {"c1": ""}, "d": {"d1": ""}, "e": {"e2": ""}, "g": {"g1": `{"s":"away"}`}}},
		View{Conn: g, Room: "r", Members: Members{"c": {"c1": ""}, "d": {"d1": ""}, "e": {"e2": ""}, "g": {"g1": `{"s":"away"}`}, "obs": {}}})
	return t
}

func TestCorrectTraceHasNoViolation(t *testing.T) {
	rep := correct().check(t)
	if len(rep.Violations) != 0 {
		t.Fatalf("violations on a correct trace: %v", rep.Violations)
	}
	if len(rep.LatencyLeft) != 3 || len(rep.LatencyKilled) != 2 {
		t.Fatalf("latencies: %v %v", rep.LatencyLeft, rep.LatencyKilled)
	}
	for _, c := range Classes {
		if !strings.Contains(rep.String(), string(c)) {
			t.Fatalf("report does not print class %q", c)
		}
	}
}

// expect asserts that the report counts exactly n violations of class c
// and fails the run.
func expect(t *testing.T, rep *Report, c Class, n int) {
	t.Helper()
	if rep.Counts[c] != n {
		t.Fatalf("%d violations of %q, want %d: %v", rep.Counts[c], c, n, rep.Violations)
	}
	if n > 0 && !c.Informational() && !rep.Failed() {
		t.Fatalf("class %q does not fail the run", c)
	}
}

func TestAlternation(t *testing.T) {
	tr := newTrace()
	a := tr.conn("a", "a1", 0, 1)
	tr.join(a, "r", 1, 1.01)
	tr.ev("offline", "left", "r", "a", 1.002) // before any online
	tr.ev("online", "joined", "r", "a", 1.005)
	tr.ev("online", "joined", "r", "a", 1.006) // repeated
	rep := tr.check(t)
	expect(t, rep, C1Alternation, 1)
	expect(t, rep, C1Repeated, 1)
}

func TestOfflineWhileLive(t *testing.T) {
	tr := newTrace()
	a := tr.conn("a", "a1", 0, 1)
	tr.join(a, "r", 1, 1.01)
	tr.ev("online", "joined", "r", "a", 1.005)
	// A second tab moves to node 1; a late release of the first announces
	// a departure while the second holds the session.
	b := tr.conn("a", "a1", 1, 5)
	tr.join(b, "r", 5, 5.02)
	tr.end(a, Closed, 5.03, 0)
	tr.ev("offline", "left", "r", "a", 6.6)
	tr.ev("online", "joined", "r", "a", 7.0)
	rep := tr.check(t)
	expect(t, rep, C2LiveOffline, 1)
}

func TestFlickerInsideGrace(t *testing.T) {
	tr := newTrace()
	a := tr.conn("a", "a1", 0, 1)
	tr.join(a, "r", 1, 1.01)
	tr.ev("online", "joined", "r", "a", 1.005)
	tr.end(a, Reset, 3, 0)
	b := tr.conn("a", "a1", 1, 3.2)
	tr.join(b, "r", 3.2, 3.25)
	// A node with a grace shorter than promised: offline, online.
	tr.ev("offline", "left", "r", "a", 3.15)
	tr.ev("online", "joined", "r", "a", 3.22)
	rep := tr.check(t)
	expect(t, rep, C3Flicker, 1)
}

func TestDepartures(t *testing.T) {
	for _, tc := range []struct {
		name string
		evs  func(tr *trace)
		want Class
	}{
		{"missing", func(tr *trace) {}, C4Missing},
		{"twice", func(tr *trace) {
			tr.ev("offline", "left", "r", "a", 6.6)
			tr.ev("offline", "left", "r", "a", 6.7)
		}, C4Duplicate},
		{"early", func(tr *trace) { tr.ev("offline", "left", "r", "a", 5.2) }, C4Early},
		{"late", func(tr *trace) { tr.ev("offline", "left", "r", "a", 8.5) }, C4Late},
		{"reason", func(tr *trace) { tr.ev("offline", "expired", "r", "a", 6.6) }, C4Reason},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTrace()
			a := tr.conn("a", "a1", 0, 1)
			tr.join(a, "r", 1, 1.01)
			tr.ev("online", "joined", "r", "a", 1.005)
			tr.end(a, Closed, 5, 0)
			tc.evs(tr)
			expect(t, tr.check(t), tc.want, 1)
		})
	}
	t.Run("producer-killed", func(t *testing.T) {
		// Settled in time by a node killed before it published: published
		// by a reaper after the lease, which is judged leniently.
		tr := newTrace()
		a := tr.conn("a", "a1", 0, 1)
		tr.join(a, "r", 1, 1.01)
		tr.ev("online", "joined", "r", "a", 1.005)
		tr.end(a, Closed, 5, 0)
		tr.kill(1, 6.55)
		tr.ev("offline", "left", "r", "a", 6.5)
		tr.r.Stream[1].Stored, tr.r.Core[1].Arrived = s(11.6), s(11.61)
		rep := tr.check(t)
		if rep.Failed() || rep.Ambiguous["offline published after the lease, its producer killed"] != 1 {
			t.Fatalf("late publish after a kill: %v %v", rep.Violations, rep.Ambiguous)
		}
	})
	t.Run("online-missing", func(t *testing.T) {
		tr := newTrace()
		a := tr.conn("a", "a1", 0, 1)
		tr.join(a, "r", 1, 1.01)
		expect(t, tr.check(t), C4Online, 1)
	})
	t.Run("killed-node-missing", func(t *testing.T) {
		tr := newTrace()
		a := tr.conn("a", "a1", 1, 1)
		tr.join(a, "r", 1, 1.01)
		tr.ev("online", "joined", "r", "a", 1.005)
		tr.kill(1, 10)
		expect(t, tr.check(t), C4Missing, 1)
	})
}

// A session of a killed node does not hold its user against a clean close
// once stale (1.5 heartbeats after the kill): the departure is left, at
// the grace's end or when the dead session goes stale, whichever is later,
// never a member with no session, never at the dead session's expiry.
func TestDeadSessionDoesNotHoldUser(t *testing.T) {
	// a's laptop (node 1, killed at 10s) and phone (node 0, closed at
	// closeAt).
	build := func(closeAt float64) *trace {
		tr := newTrace()
		a := tr.conn("a", "a1", 1, 1)
		tr.join(a, "r", 1, 1.01)
		tr.ev("online", "joined", "r", "a", 1.005)
		b := tr.conn("a", "a2", 0, 2)
		tr.join(b, "r", 2, 2.01)
		tr.evN("update", "joined", "r", "a", 2.005, 2)
		tr.kill(1, 10)
		tr.end(b, Closed, closeAt, 0)
		return tr
	}
	t.Run("fresh-at-the-close", func(t *testing.T) {
		// Closed 0.4s after the kill: the laptop's session may still be
		// fresh then, and is stale at the grace's end (11.9s).
		tr := build(10.4)
		tr.ev("offline", "left", "r", "a", 11.95)
		rep := tr.check(t)
		if rep.Failed() || len(rep.Ambiguous) > 0 {
			t.Fatalf("the interleaving judged %v, ambiguous %v", rep.Violations, rep.Ambiguous)
		}
	})
	t.Run("fresh-at-the-close-broken", func(t *testing.T) {
		// The store of old: no grace at the close, the sessions end one by
		// one, the user expires with the phone's last until.
		tr := build(10.4)
		tr.evN("update", "left", "r", "a", 12.0, 1)
		tr.evN("update", "expired", "r", "a", 13.0, 0)
		tr.ev("offline", "expired", "r", "a", 14.0)
		rep := tr.check(t)
		expect(t, rep, C1Empty, 1)
		expect(t, rep, C4Reason, 1)
		expect(t, rep, C4Late, 1)
	})
	t.Run("stale-later-than-the-grace", func(t *testing.T) {
		// Timing B: closed 0.3s after the kill, the grace ends at 11.5s,
		// the laptop's session goes stale at 12.25s.
		tr := build(10.3)
		tr.r.Timing = TimingB
		tr.ev("offline", "left", "r", "a", 12.3)
		if rep := tr.check(t); rep.Failed() {
			t.Fatalf("left when stale judged %v", rep.Violations)
		}
		tr = build(10.3)
		tr.r.Timing = TimingB
		tr.ev("offline", "left", "r", "a", 13.1)
		expect(t, tr.check(t), C4Late, 1)
	})
	t.Run("certain-left", func(t *testing.T) {
		tr := build(13.5)
		tr.ev("offline", "left", "r", "a", 15.1)
		expect(t, tr.check(t), C4Reason, 0)
	})
	t.Run("expired-instead", func(t *testing.T) {
		tr := build(13.5)
		tr.ev("offline", "expired", "r", "a", 13.8)
		rep := tr.check(t)
		expect(t, rep, C4Reason, 1)
		expect(t, rep, C4Early, 1)
	})
	t.Run("closed-just-before-the-kill", func(t *testing.T) {
		// The laptop's node may not have refreshed it since the close:
		// left or expired.
		tr := build(9.5)
		tr.ev("offline", "left", "r", "a", 11.05)
		rep := tr.check(t)
		if rep.Failed() || rep.Ambiguous["kill soon after a clean close of another of the user's sessions"] != 1 {
			t.Fatalf("ambiguous case: %v %v", rep.Violations, rep.Ambiguous)
		}
	})
	t.Run("empty-snapshot", func(t *testing.T) {
		tr := build(13.5)
		tr.ev("offline", "left", "r", "a", 15.1)
		tr.r.Empty = []Empty{{Conn: 0, Room: "r", User: "a", At: s(14)}}
		expect(t, tr.check(t), C1Empty, 1)
	})
}

func TestStreamClasses(t *testing.T) {
	t.Run("duplicate-id", func(t *testing.T) {
		tr := correct()
		tr.r.Stream = append(tr.r.Stream, tr.r.Stream[0])
		expect(t, tr.check(t), C5DupID, 1)
	})
	t.Run("core-redelivery", func(t *testing.T) {
		tr := correct()
		tr.r.Core = append(tr.r.Core, tr.r.Core[0])
		rep := tr.check(t)
		expect(t, rep, C5Redelivered, 1)
		if rep.Failed() {
			t.Fatal("core redelivery fails the run")
		}
	})
	t.Run("seq-gap", func(t *testing.T) {
		tr := correct()
		tr.seq["r"]++ // seq skipped
		a := tr.conn("z", "z1", 0, 30)
		tr.join(a, "r", 30, 30.01)
		tr.ev("online", "joined", "r", "z", 30.005)
		tr.r.Final.Query["r"]["z"] = map[string]string{"z1": ""}
		expect(t, tr.check(t), C6Seq, 1)
	})
	t.Run("stream-not-core", func(t *testing.T) {
		tr := correct()
		tr.r.Core = tr.r.Core[1:]
		expect(t, tr.check(t), C7StreamCore, 1)
	})
}

func TestFinalClasses(t *testing.T) {
	t.Run("query", func(t *testing.T) {
		tr := correct()
		q := map[string]Members{"r": {"c": {"c1": ""}, "d": {"d1": ""}, "e": {"e2": ""}, "g": {"g1": ""}, "b": {"b1": ""}}}
		tr.r.Final.Query = q
		expect(t, tr.check(t), C8Final, 2) // b is a ghost, g lost its state
	})
	t.Run("view", func(t *testing.T) {
		tr := correct()
		tr.r.Final.Views[0].Members = Members{"c": {"c1": ""}, "e": {"e2": ""}, "g": {"g1": ""}}
		expect(t, tr.check(t), C9View, 2) // d missing, g's state
	})
	t.Run("spurious-resync", func(t *testing.T) {
		tr := correct()
		tr.r.Resyncs = []Resync{
			{Conn: 0, Room: "r", At: s(30), Base: 5, Epoch: 1, Contiguous: true, SnapSeq: 6, SnapEpoch: 1},    // seq 6 long delivered
			{Conn: 0, Room: "r", At: s(3.5), Base: 10, Epoch: 1, Contiguous: true, SnapSeq: 11, SnapEpoch: 1}, // seq 11 had just arrived
			{Conn: 0, Room: "r", At: s(30), Base: 3, Epoch: 1, Contiguous: false, SnapSeq: 8, SnapEpoch: 1},   // the client missed one
		}
		rep := tr.check(t)
		expect(t, rep, C9Spurious, 1)
		if rep.Resyncs != 3 || rep.Failed() {
			t.Fatalf("resyncs %d, failed %v", rep.Resyncs, rep.Failed())
		}
	})
	t.Run("note", func(t *testing.T) {
		tr := correct()
		tr.r.Notes = []Note{{At: s(3), Conn: 0, What: "closed by the node with 4000 (slow consumer)"}}
		rep := tr.check(t)
		expect(t, rep, CUClose, 1)
		if rep.Failed() {
			t.Fatal("a note fails the run")
		}
	})
	t.Run("crash", func(t *testing.T) {
		tr := correct()
		tr.r.Nodes = append(tr.r.Nodes, Node{ID: 2, Slot: 1, Started: s(12), Died: s(30), Exit: "panic"})
		expect(t, tr.check(t), C0Crash, 1)
	})
}

// An unacknowledged join makes its departure ambiguous, never a failure.
func TestUnacknowledgedJoinIsLenient(t *testing.T) {
	tr := newTrace()
	a := tr.conn("a", "a1", 1, 1)
	tr.join(a, "r", 1, 1.01)
	tr.ev("online", "joined", "r", "a", 1.005)
	tr.join(a, "r2", 9.99, -1) // the node dies under it
	tr.kill(1, 10)
	tr.ev("online", "joined", "r2", "a", 9.995)
	tr.ev("offline", "expired", "r", "a", 12.5)
	tr.ev("offline", "expired", "r2", "a", 12.6)
	rep := tr.check(t)
	if rep.Failed() {
		t.Fatalf("unacknowledged join judged strictly: %v", rep.Violations)
	}
}

func TestWindows(t *testing.T) {
	tm := TimingA
	w := tm.ReleaseWindow(s(10))
	if w.Lo != s(11) || w.Hi != s(12.25) || w.Reasons != Left || !w.Certain {
		t.Fatalf("release window %v", w)
	}
	w = tm.ExpiryWindow(s(10))
	if w.Lo != s(11.5) || w.Hi != s(14.75) || w.Reasons != Expired {
		t.Fatalf("expiry window %v", w)
	}
	if got := w.Return(s(11), s(11.2)); got != Silent {
		t.Fatalf("return acked at 11.2 against %v: %v", w, got)
	}
	if got := w.Return(s(15), s(15.1)); got != Flicker {
		t.Fatalf("return sent at 15 against %v: %v", w, got)
	}
	if got := w.Return(s(12), s(12.1)); got != EitherReturn {
		t.Fatalf("return at 12 against %v: %v", w, got)
	}
	// A close after a kill of another session: left, by the grace's end
	// or when the dead session goes stale (1.5s after the kill; up to its
	// expiry when its holder lived on, as after a 4001).
	killed := []Tail{{At: s(10), Killed: true}}
	for _, tc := range []struct {
		tm     Timing
		close  float64
		tails  []Tail
		lo, hi float64
	}{
		{TimingA, 10.5, killed, 11.5, 12.75},
		{TimingA, 14, killed, 15, 16.25},
		{TimingB, 10.3, killed, 11, 13},
		{TimingB, 10.3, []Tail{{At: s(10)}}, 11, 16.25},
	} {
		w := tc.tm.Departure(s(tc.close), Release, None, tc.tails, None)
		if !w.Certain || w.Reasons != Left || w.Lo != s(tc.lo) || w.Hi != s(tc.hi) {
			t.Errorf("close at %v after tails %v (%v): %v, want [%v, %v] left", tc.close, tc.tails, tc.tm, w, tc.lo, tc.hi)
		}
	}
	// A kill soon after a close of another session: left or expired; a
	// kill long after it: expired.
	if w := tm.Departure(s(10), Abandon, s(10), nil, s(9.2)); w.Certain || w.Reasons != Left|Expired || w.Lo != s(10.2) {
		t.Fatalf("kill soon after a close: %v", w)
	}
	if w := tm.Departure(s(10), Abandon, s(10), nil, s(8)); !w.Certain || w.Reasons != Expired {
		t.Fatalf("kill long after a close: %v", w)
	}
}

func TestReportCountsFailuresByMinute(t *testing.T) {
	vs := []Violation{
		{Class: C4Late, At: 10 * time.Second},
		{Class: C4Late, At: 59 * time.Second},
		{Class: C9Spurious, At: 61 * time.Second},
		{Class: C2LiveOffline, At: 185 * time.Second},
	}
	rep := &Report{Counts: map[Class]int{}}
	for _, v := range vs {
		rep.add(v)
	}
	if got, want := byMinute(rep.Failures()), "0:2 3:1"; got != want {
		t.Fatalf("byMinute = %q, want %q (informational classes left out)", got, want)
	}
	if !strings.Contains(rep.String(), "failing violations by minute of the run: 0:2 3:1") {
		t.Fatalf("the report does not say when its failures fell:\n%s", rep)
	}
	if byMinute(nil) != "" {
		t.Fatal("no failures should print no line")
	}
}

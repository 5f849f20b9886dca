package bus_test

import (
	"slices"
	"testing"
	"time"

	"github.com/presence-dev/presence/bus"
)

// ev is the event a test Sequencer carries: its own (epoch, seq), so a
// delivery shows which event it was.
type ev struct {
	epoch int64
	seq   uint64
}

// t0 is the test clock's origin; steps give their time as an offset.
var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// seqStep is one step of a sequencer spec: an action at a time on the
// test clock, and what must come of it.
type seqStep struct {
	op    string // offer, reset, forget, skip, overdue, snapshot, position, deadline
	at    time.Duration
	epoch int64
	seq   uint64
	want  bus.Verdict
	due   bool   // overdue: the answer wanted
	out   []ev   // offer, skip: the events delivered, in order
	when  string // deadline: the wanted deadline, as an offset ("" for none)
}

func offer(at time.Duration, epoch int64, seq uint64, want bus.Verdict, out ...ev) seqStep {
	return seqStep{op: "offer", at: at, epoch: epoch, seq: seq, want: want, out: out}
}
func reset(epoch int64, seq uint64) seqStep { return seqStep{op: "reset", epoch: epoch, seq: seq} }
func forget() seqStep                       { return seqStep{op: "forget"} }
func skip(at time.Duration, out ...ev) seqStep {
	return seqStep{op: "skip", at: at, out: out}
}
func overdue(at time.Duration, due bool) seqStep { return seqStep{op: "overdue", at: at, due: due} }
func snapshot(epoch int64, want bus.Verdict) seqStep {
	return seqStep{op: "snapshot", epoch: epoch, want: want}
}
func position(epoch int64, seq uint64) seqStep {
	return seqStep{op: "position", epoch: epoch, seq: seq}
}

// deadline wants the open gap's deadline at offset at, or none when at < 0.
func deadline(at time.Duration) seqStep {
	if at < 0 {
		return seqStep{op: "deadline"}
	}
	return seqStep{op: "deadline", when: at.String()}
}

func seqs(epoch int64, s ...uint64) []ev {
	out := make([]ev, len(s))
	for i, x := range s {
		out[i] = ev{epoch, x}
	}
	return out
}

// TestSequencer is the Sequencer's spec: each case is a room's events as
// they arrive, with the verdicts and deliveries wanted.
func TestSequencer(t *testing.T) {
	const s = time.Second
	hub := bus.SeqLimits{GapTimeout: 10 * s, MaxAhead: 4}
	replay := bus.SeqLimits{GapTimeout: 10 * s, MaxHeld: 2}
	for _, c := range []struct {
		name  string
		lim   bus.SeqLimits
		steps []seqStep
	}{
		{"no baseline yet", hub, []seqStep{
			offer(0, 7, 1, bus.NoBaseline),
			snapshot(7, bus.NoBaseline),
			reset(7, 0),
			offer(0, 7, 1, bus.Deliver, seqs(7, 1)...),
			forget(),
			offer(0, 7, 2, bus.NoBaseline),
		}},
		{"in order", hub, []seqStep{
			reset(7, 0),
			offer(0, 7, 1, bus.Deliver, seqs(7, 1)...),
			offer(0, 7, 2, bus.Deliver, seqs(7, 2)...),
			offer(0, 7, 3, bus.Deliver, seqs(7, 3)...),
			position(7, 3), deadline(-1),
		}},
		{"duplicate", hub, []seqStep{
			reset(7, 3),
			offer(0, 7, 3, bus.Duplicate),
			offer(0, 7, 1, bus.Duplicate),
			offer(0, 7, 5, bus.Held),
			offer(0, 7, 5, bus.Duplicate), // held already
			offer(0, 7, 4, bus.Deliver, seqs(7, 4, 5)...),
			offer(0, 7, 5, bus.Duplicate),
			position(7, 5),
		}},
		{"old epoch", hub, []seqStep{
			reset(7, 3),
			offer(0, 6, 4, bus.Stale),
			offer(0, 6, 9, bus.Stale),
			offer(0, 7, 4, bus.Deliver, seqs(7, 4)...),
		}},
		{"gap then fill", hub, []seqStep{
			reset(7, 0),
			offer(0, 7, 1, bus.Deliver, seqs(7, 1)...),
			offer(1*s, 7, 3, bus.Held),
			deadline(11 * s),
			offer(2*s, 7, 4, bus.Held),
			deadline(11 * s), // the gap's clock started with its first held event
			offer(3*s, 7, 2, bus.Deliver, seqs(7, 2, 3, 4)...),
			deadline(-1), position(7, 4),
		}},
		{"gap partly filled keeps its deadline", hub, []seqStep{
			reset(7, 0),
			offer(0, 7, 2, bus.Held),
			offer(0, 7, 4, bus.Held),
			offer(4*s, 7, 1, bus.Deliver, seqs(7, 1, 2)...),
			deadline(10 * s),
			overdue(9*s, false),
			overdue(10*s, true),
		}},
		{"gap past its deadline: resync", hub, []seqStep{
			reset(7, 0),
			offer(0, 7, 2, bus.Held),
			overdue(9999*time.Millisecond, false),
			overdue(10*s, true),
			forget(), // the hub starts the room over from a new snapshot
			overdue(20*s, false), deadline(-1),
			reset(7, 5),
			offer(21*s, 7, 6, bus.Deliver, seqs(7, 6)...),
		}},
		{"gap past its deadline: skip", replay, []seqStep{
			reset(7, 0),
			offer(0, 7, 2, bus.Held),
			offer(5*s, 7, 4, bus.Held),
			overdue(10*s, true),
			skip(10*s, seqs(7, 2)...),
			position(7, 2),
			deadline(20 * s), // what remains waits a full timeout from the skip
			overdue(19*s, false),
			offer(19*s, 7, 1, bus.Duplicate), // given up: too late
			skip(20*s, seqs(7, 4)...),
			deadline(-1), overdue(99*s, false),
			skip(99 * s), // nothing held: nothing happens
			position(7, 4),
		}},
		{"too far ahead to hold", hub, []seqStep{
			reset(7, 10),
			offer(0, 7, 14, bus.Held), // MaxAhead above the position: held
			offer(0, 7, 15, bus.TooFar),
			position(7, 10),
		}},
		{"too many held: the lowest gap is given up", replay, []seqStep{
			reset(7, 0),
			offer(0, 7, 3, bus.Held),
			offer(1*s, 7, 5, bus.Held),
			offer(2*s, 7, 7, bus.GaveUp, seqs(7, 3)...),
			position(7, 3),
			deadline(10 * s), // the gap's clock runs on
			offer(3*s, 7, 4, bus.Deliver, seqs(7, 4, 5)...),
		}},
		{"new epoch: restart", hub, []seqStep{
			reset(7, 5),
			offer(0, 7, 7, bus.Held),
			offer(0, 8, 1, bus.NewEpoch),
			position(7, 5), // nothing changed: the caller decides
			reset(8, 0),
			deadline(-1), // held events of the old epoch were dropped
			offer(0, 8, 1, bus.Deliver, seqs(8, 1)...),
			offer(0, 7, 6, bus.Stale),
		}},
		{"snapshot baseline: events before, at and after it", hub, []seqStep{
			reset(7, 10),
			offer(0, 7, 9, bus.Duplicate),
			offer(0, 7, 10, bus.Duplicate),
			offer(0, 7, 12, bus.Held),
			offer(0, 7, 11, bus.Deliver, seqs(7, 11, 12)...),
		}},
		{"snapshot baseline of a later epoch than the events", hub, []seqStep{
			reset(9, 2),
			offer(0, 8, 3, bus.Stale),
			offer(0, 9, 3, bus.Deliver, seqs(9, 3)...),
		}},
		{"epoch going backwards", hub, []seqStep{
			reset(8, 2),
			offer(0, 8, 3, bus.Deliver, seqs(8, 3)...),
			offer(0, 7, 4, bus.Stale),
			snapshot(7, bus.Stale),
			position(8, 3),
		}},
		{"snapshot checks", hub, []seqStep{
			reset(7, 3),
			snapshot(7, bus.Current),
			snapshot(6, bus.Stale),
			snapshot(8, bus.NewEpoch),
			snapshot(0, bus.NewEpoch), // the store lost the numbering
			reset(0, 3),
			snapshot(5, bus.Current), // the numbering is not known yet
		}},
		{"baseline without numbering takes the first epoch", replay, []seqStep{
			reset(0, 3),
			offer(0, 0, 4, bus.Deliver, seqs(0, 4)...),
			position(0, 4),
			offer(0, 9, 4, bus.Duplicate),
			position(9, 4),
			offer(0, 8, 5, bus.Stale),
			offer(0, 9, 5, bus.Deliver, seqs(9, 5)...),
		}},
		{"an event without epoch is ordered in the current one", hub, []seqStep{
			reset(7, 3),
			offer(0, 0, 3, bus.Duplicate),
			offer(0, 0, 4, bus.Deliver, seqs(0, 4)...),
			position(7, 4),
		}},
		{"no gap timeout: never overdue", bus.SeqLimits{}, []seqStep{
			reset(7, 0),
			offer(0, 7, 2, bus.Held),
			deadline(-1),
			overdue(1000*time.Hour, false),
			offer(0, 7, 1, bus.Deliver, seqs(7, 1, 2)...),
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			sq := bus.NewSequencer[ev](c.lim)
			for i, st := range c.steps {
				runStep(t, sq, i, st)
			}
		})
	}
}

func runStep(t *testing.T, sq *bus.Sequencer[ev], i int, st seqStep) {
	t.Helper()
	now := t0.Add(st.at)
	var out []ev
	drain := func() {
		for e, ok := sq.Next(); ok; e, ok = sq.Next() {
			out = append(out, e)
		}
	}
	switch st.op {
	case "offer":
		e := ev{st.epoch, st.seq}
		v := sq.Offer(st.epoch, st.seq, e, now)
		if v != st.want {
			t.Fatalf("step %d: offer (%d, %d) at %v: %v, want %v", i, st.epoch, st.seq, st.at, v, st.want)
		}
		if v == bus.Deliver {
			out = append(out, e)
		}
		drain()
	case "reset":
		sq.Reset(st.epoch, st.seq)
	case "forget":
		sq.Forget()
	case "skip":
		sq.SkipGap(now)
		drain()
	case "overdue":
		if got := sq.Overdue(now); got != st.due {
			t.Fatalf("step %d: overdue at %v: %v, want %v", i, st.at, got, st.due)
		}
	case "snapshot":
		if v := sq.CheckSnapshot(st.epoch); v != st.want {
			t.Fatalf("step %d: snapshot of epoch %d: %v, want %v", i, st.epoch, v, st.want)
		}
	case "position":
		if e, s, _ := sq.Position(); e != st.epoch || s != st.seq {
			t.Fatalf("step %d: position (%d, %d), want (%d, %d)", i, e, s, st.epoch, st.seq)
		}
	case "deadline":
		got := ""
		if d := sq.Deadline(); !d.IsZero() {
			got = d.Sub(t0).String()
		}
		if got != st.when {
			t.Fatalf("step %d: deadline %q, want %q", i, got, st.when)
		}
	default:
		t.Fatalf("step %d: unknown op %q", i, st.op)
	}
	if !slices.Equal(out, st.out) {
		t.Fatalf("step %d (%s at %v): delivered %v, want %v", i, st.op, st.at, out, st.out)
	}
}

// FuzzSequencer offers random orders of a room's events, with duplicates,
// later and earlier epochs, clock jumps and given-up gaps, handled the way
// the Replayer and the hub handle them. Whatever the order, within an
// epoch no seq is delivered twice or out of order, each delivery is the
// position's next seq, and every held event is delivered unless a Reset
// dropped it.
func FuzzSequencer(f *testing.F) {
	f.Add([]byte{0, 0, 2, 1, 3, 3, 250, 4})
	f.Add([]byte{1, 2, 5, 9, 17, 33, 251, 1, 2, 252, 3})
	f.Add([]byte{2, 0, 0x13, 0x11, 0x12, 0x21, 0x02, 253, 0x22})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 1 {
			return
		}
		lim := bus.SeqLimits{GapTimeout: 10 * time.Second}
		switch data[0] % 3 {
		case 1:
			lim.MaxHeld = 3
		case 2:
			lim.MaxAhead = 6
		}
		sq := bus.NewSequencer[ev](lim)
		sq.Reset(1, 0)
		now := t0
		last := map[int64]uint64{} // per epoch: the last seq delivered
		held := map[ev]bool{}      // held and not yet delivered
		deliver := func(e ev, pos uint64) {
			epoch, _, _ := sq.Position()
			if e.seq != pos+1 {
				t.Fatalf("delivered seq %d at position %d", e.seq, pos)
			}
			if l, ok := last[epoch]; ok && e.seq <= l {
				t.Fatalf("epoch %d: delivered %d after %d", epoch, e.seq, l)
			}
			last[epoch] = e.seq
			delete(held, e)
		}
		drain := func() {
			for {
				_, pos, _ := sq.Position()
				e, ok := sq.Next()
				if !ok {
					return
				}
				deliver(e, pos)
			}
		}
		var offerOne func(e ev)
		offerOne = func(e ev) {
			_, pos, _ := sq.Position()
			switch sq.Offer(e.epoch, e.seq, e, now) {
			case bus.Deliver:
				deliver(e, pos)
				drain()
			case bus.Held:
				held[e] = true
			case bus.GaveUp:
				held[e] = true
				drain()
			case bus.TooFar: // the hub's way: a new snapshot just below it
				epoch, _, _ := sq.Position()
				sq.Reset(epoch, e.seq-1)
				clear(held)
				offerOne(e)
			case bus.NewEpoch: // the Replayer's way: follow it from seq 1
				sq.Reset(e.epoch, 0)
				clear(held)
				offerOne(e)
			}
		}
		for _, b := range data[1:] {
			switch b {
			case 250, 251: // the clock moves
				now = now.Add(time.Duration(b-249) * 6 * time.Second)
			case 252, 253: // the gap timer fires
				if sq.Overdue(now) {
					sq.SkipGap(now)
					drain()
				}
			default: // epoch 1..3, seq 1..16
				epoch := int64(b>>4)%3 + 1
				offerOne(ev{epoch, uint64(b&15) + 1})
			}
		}
		for sq.Held() > 0 {
			sq.SkipGap(now)
			drain()
		}
		if len(held) > 0 {
			t.Fatalf("held but never delivered: %v", held)
		}
	})
}

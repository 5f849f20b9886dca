package bus

import (
	"slices"
	"time"
)

// Verdict is what a Sequencer makes of an event (Offer) or of a snapshot
// (CheckSnapshot), and so what its caller does next.
type Verdict int

// Verdicts.
const (
	// NoBaseline: the sequencer has no position yet. Keep the event and
	// Offer it again after Reset. From CheckSnapshot: Reset to the
	// snapshot's position.
	NoBaseline Verdict = iota
	// Deliver: the event is the next one. Pass it on, then every event
	// Next returns.
	Deliver
	// Duplicate: at or below the position (delivered, given up, or in the
	// baseline), or held already. Drop it.
	Duplicate
	// Stale: of an earlier epoch than the sequencer's. Drop it. From
	// CheckSnapshot: the snapshot was read before the numbering
	// restarted; read a newer one.
	Stale
	// Held: above a gap. It is kept until the gap fills (Next returns it
	// after a later Deliver) or is given up (SkipGap).
	Held
	// GaveUp: held, but more than MaxHeld were, so the lowest gap was
	// given up at once. Pass on every event Next returns.
	GaveUp
	// TooFar: more than MaxAhead above the position. Not held: the caller
	// gives up the room's position (Forget, or Reset from a new snapshot).
	TooFar
	// NewEpoch: of a later epoch. Nothing changed; the caller starts the
	// room over: Reset (to a new snapshot's position, or to (epoch, 0) to
	// follow the new numbering from 1), then Offer the event again. From
	// CheckSnapshot: the snapshot is of a later numbering, or of none
	// while the sequencer has one (the store lost it).
	NewEpoch
	// Current: from CheckSnapshot only. The snapshot is of the
	// sequencer's numbering (or the sequencer does not know one yet): it
	// serves, and the position stands.
	Current
)

var verdictNames = [...]string{"NoBaseline", "Deliver", "Duplicate", "Stale", "Held", "GaveUp", "TooFar", "NewEpoch", "Current"}

func (v Verdict) String() string {
	if v >= 0 && int(v) < len(verdictNames) {
		return verdictNames[v]
	}
	return "Verdict(?)"
}

// SeqLimits bound what a Sequencer holds behind a gap. A zero field sets
// no bound.
type SeqLimits struct {
	GapTimeout time.Duration // a gap open this long is Overdue
	MaxAhead   uint64        // an event further above the position is TooFar
	MaxHeld    int           // holding more than this gives up the lowest gap
}

// Sequencer puts one room's events in (epoch, seq) order: every event of a
// room carries the room's epoch (the numbering) and a seq that grows by
// one per event within it, and a later epoch restarts seq at 1. It does no
// I/O and keeps no clock: the caller passes the time, and locks it.
//
// The caller passes on the event of a Deliver verdict, then, after
// Deliver, GaveUp or SkipGap, every event Next returns until it returns
// false. Invariants, for a caller that does:
//   - The position (epoch, seq) says every event of that epoch with a seq
//     at or below it was delivered, given up, or is in the baseline
//     snapshot. Its seq only grows; Reset and Forget set it anew. Its
//     epoch changes by Reset and Forget, and from 0 (a baseline read
//     before the room had a numbering) to the first known epoch offered.
//   - Events are delivered in strictly increasing seq, each once, and
//     each is the position's seq + 1 when delivered: missing seqs are
//     given up only by SkipGap, MaxHeld (GaveUp) or Reset.
//   - Once Next returns false, held events are all above the position's
//     seq + 1, none twice. A gap is open exactly while events are held;
//     its clock starts when the first is held (or anew at SkipGap) and
//     stops when none is.
//   - An event of epoch 0 (not known) is ordered within the sequencer's
//     epoch.
type Sequencer[E any] struct {
	lim    SeqLimits
	synced bool // a baseline was set (Reset)
	epoch  int64
	pos    uint64         // see the invariants
	held   []heldEvent[E] // sorted by seq, no two equal
	since  time.Time      // when the open gap's clock started; zero: no gap
}

type heldEvent[E any] struct {
	seq uint64
	e   E
}

// NewSequencer returns a Sequencer with no baseline.
func NewSequencer[E any](lim SeqLimits) *Sequencer[E] {
	return &Sequencer[E]{lim: lim}
}

// Reset sets the baseline: a snapshot at (epoch, seq), or (epoch, 0) to
// follow a numbering from its start. Held events are dropped.
func (s *Sequencer[E]) Reset(epoch int64, seq uint64) {
	s.synced, s.epoch, s.pos, s.held, s.since = true, epoch, seq, nil, time.Time{}
}

// Forget drops the baseline and every held event: Offer says NoBaseline
// until the next Reset.
func (s *Sequencer[E]) Forget() {
	s.synced, s.epoch, s.pos, s.held, s.since = false, 0, 0, nil, time.Time{}
}

// Position returns the sequencer's epoch and seq (see the invariants) and
// whether it has a baseline.
func (s *Sequencer[E]) Position() (epoch int64, seq uint64, synced bool) {
	return s.epoch, s.pos, s.synced
}

// Held returns the number of events held behind a gap.
func (s *Sequencer[E]) Held() int { return len(s.held) }

// Deadline returns when the open gap becomes Overdue; zero when no gap is
// open or GapTimeout is zero.
func (s *Sequencer[E]) Deadline() time.Time {
	if s.since.IsZero() || s.lim.GapTimeout <= 0 {
		return time.Time{}
	}
	return s.since.Add(s.lim.GapTimeout)
}

// Overdue reports whether a gap has been open for GapTimeout at now: the
// caller gives it up (SkipGap) or the room's position (Forget).
func (s *Sequencer[E]) Overdue(now time.Time) bool {
	d := s.Deadline()
	return !d.IsZero() && !now.Before(d)
}

// CheckSnapshot says how a snapshot of the given epoch fits the
// sequencer's numbering: NoBaseline, Current, Stale or NewEpoch. It
// changes nothing.
func (s *Sequencer[E]) CheckSnapshot(epoch int64) Verdict {
	switch {
	case !s.synced:
		return NoBaseline
	case s.epoch == 0 || epoch == s.epoch:
		return Current
	case epoch != 0 && epoch < s.epoch:
		return Stale
	default: // a later numbering, or none: the store restarted or lost it
		return NewEpoch
	}
}

// Offer takes one event e at (epoch, seq), arriving at now, and says what
// to do with it (see Verdict). After Deliver or GaveUp, pass on what Next
// returns until it returns false.
func (s *Sequencer[E]) Offer(epoch int64, seq uint64, e E, now time.Time) Verdict {
	if !s.synced {
		return NoBaseline
	}
	if epoch != s.epoch && epoch != 0 {
		switch {
		case s.epoch == 0:
			s.epoch = epoch // the baseline predates any numbering
		case epoch < s.epoch:
			return Stale
		default:
			return NewEpoch
		}
	}
	switch {
	case seq <= s.pos:
		return Duplicate
	case seq == s.pos+1:
		s.pos = seq
		return Deliver
	case s.lim.MaxAhead > 0 && seq-s.pos > s.lim.MaxAhead:
		return TooFar
	}
	i, found := slices.BinarySearchFunc(s.held, seq, func(h heldEvent[E], seq uint64) int {
		switch {
		case h.seq < seq:
			return -1
		case h.seq > seq:
			return 1
		}
		return 0
	})
	if found {
		return Duplicate
	}
	s.held = slices.Insert(s.held, i, heldEvent[E]{seq, e})
	if s.since.IsZero() {
		s.since = now
	}
	if s.lim.MaxHeld > 0 && len(s.held) > s.lim.MaxHeld {
		s.pos = s.held[0].seq - 1 // the gap's clock runs on for what remains
		return GaveUp
	}
	return Held
}

// Next returns the held event that is now next in order, if any, and
// moves the position to it.
func (s *Sequencer[E]) Next() (E, bool) {
	var zero E
	if len(s.held) == 0 || s.held[0].seq != s.pos+1 {
		return zero, false
	}
	h := s.held[0]
	s.held[0] = heldEvent[E]{} // let the event be collected
	s.held = s.held[1:]
	s.pos = h.seq
	if len(s.held) == 0 {
		s.held, s.since = nil, time.Time{}
	}
	return h.e, true
}

// SkipGap gives up the seqs missing below the lowest held event: Next
// then returns the held events above them. A gap that stays open after
// those starts its clock at now. Without held events it does nothing.
func (s *Sequencer[E]) SkipGap(now time.Time) {
	if len(s.held) > 0 {
		s.pos, s.since = s.held[0].seq-1, now
	}
}

package webhook

import (
	"time"

	"github.com/presence-dev/presence/bus"
)

// The lane's core: one endpoint's delivery order of one stream. It does
// no I/O and keeps no clock (the caller passes the time); the lane's
// goroutine owns it (lane.go is its I/O shell).
//
// Invariants:
//   - A room's items enter the ready queue in (epoch, seq) order, each
//     once, and the queue is delivered from its head: a room's later event
//     never leaves before an earlier one, and never while an earlier one
//     is being retried (one batch is out at a time).
//   - A stream message is acknowledged only once the batch that holds it
//     was answered 2xx (or dead-lettered) and its room's position was
//     written, or when it is at or below its room's position (delivered
//     before, a redelivery), or of an earlier epoch than the room's.
//   - A message the core holds (owned) is never acknowledged by a copy
//     of it that JetStream delivers again.
//   - The room's position, persisted, says every event of the room up to
//     it was answered 2xx, dead-lettered, given up behind a gap (with a
//     marker) or left out by the filter.

// position is a room's (epoch, seq).
type position struct {
	Epoch int64  `json:"epoch"`
	Seq   uint64 `json:"seq"`
}

// item is one entry of a lane's order: a stream message (sent, or silent
// when the endpoint's filter leaves it out) or a resync marker.
type item struct {
	id      string
	data    []byte // the JSON sent; nil: silent
	room    string
	pos     position  // of the event; of the room after the break for a marker
	sseq    uint64    // stream sequence; 0 for a marker
	stored  time.Time // when the stream stored it; when a marker was made
	at      time.Time // the event's time (the body's timestamp)
	marker  string    // resync reason; "" for a stream message
	readyAt time.Time
}

func (it *item) visible() bool { return it.data != nil }

// roomState is what the core knows of one room.
type roomState struct {
	seq     *bus.Sequencer[*item]
	loaded  bool      // the baseline is set
	pending int       // items of the room not yet settled
	touched time.Time // last activity, for eviction
	owed    bool      // a dead_letter marker of the room waits in the queue
	// refetched is when the open gap outlasted the gap timeout and the
	// lane was told to read again from its ack floor; zero: not yet.
	refetched time.Time
}

// batch is one delivery: fixed once formed, so every retry carries the
// same webhook-id and body.
type batch struct {
	items    []*item
	id       string
	body     []byte
	visible  int
	attempts int
	next     time.Time // when to attempt it (again)
	oldest   time.Time // the oldest stored message: the horizon counts from it; zero for markers only
	last     result
}

// settlement is what the shell persists before it acknowledges: the
// rooms' new positions, markers now owed (set) or delivered (paid).
type settlement struct {
	positions map[string]position
	owe       map[string]position
	paid      []string
	acks      []uint64
}

// coreLimits are the endpoint's settings the core applies.
type coreLimits struct {
	batchSize          int
	maxWait, horizon   time.Duration
	minBackoff, maxBkf time.Duration
	gapTimeout         time.Duration
	maxHeld            int
}

// core holds one lane's order. Not safe for concurrent use.
type core struct {
	region     string // the source: every event's region
	lim        coreLimits
	rooms      map[string]*roomState
	gaps       map[string]*roomState // rooms holding events behind a gap
	ready      []*item
	visible    int // visible items in ready
	owned      map[uint64]bool
	batch      *batch
	disabled   bool      // the endpoint answered 410 Gone
	resetSince time.Time // non-zero: the stream was made again; unknown rooms get a stream_reset marker
	rnd        func() float64
	// A dissolved batch's retry schedule, for the batch formed next.
	next     time.Time
	attempts int
}

func newCore(region string, lim coreLimits, rnd func() float64) *core {
	return &core{region: region, lim: lim, rooms: map[string]*roomState{}, gaps: map[string]*roomState{},
		owned: map[uint64]bool{}, rnd: rnd}
}

// needsPosition reports whether the shell must read room's persisted
// position before offering its next message.
func (c *core) needsPosition(room string) bool {
	rs := c.rooms[room]
	return rs == nil || !rs.loaded
}

func (c *core) room(name string, now time.Time) *roomState {
	rs := c.rooms[name]
	if rs == nil {
		rs = &roomState{seq: bus.NewSequencer[*item](bus.SeqLimits{GapTimeout: c.lim.gapTimeout, MaxHeld: c.lim.maxHeld})}
		c.rooms[name] = rs
	}
	rs.touched = now
	return rs
}

// baseline sets an unknown room's position from its persisted one, or,
// when none was persisted, just below the first event met (a room the
// endpoint has not been sent before), with a stream_reset marker first
// while the stream was made again.
func (c *core) baseline(rs *roomState, it *item, pos *position, now time.Time) {
	rs.loaded = true
	if pos != nil {
		rs.seq.Reset(pos.Epoch, pos.Seq)
		return
	}
	below := position{it.pos.Epoch, it.pos.Seq - min(it.pos.Seq, 1)}
	rs.seq.Reset(below.Epoch, below.Seq)
	if !c.resetSince.IsZero() {
		c.pushMarker(rs, it.room, below, ResyncStreamReset, now, false)
	}
}

// offer takes one stream message; pos is the room's persisted position
// when needsPosition said to read it (nil: none). It returns the stream
// sequences to acknowledge at once.
func (c *core) offer(it *item, pos *position, now time.Time) []uint64 {
	if c.owned[it.sseq] {
		return nil // JetStream sent again what the core holds
	}
	rs := c.room(it.room, now)
	if !rs.loaded {
		c.baseline(rs, it, pos, now)
	}
	switch rs.seq.Offer(it.pos.Epoch, it.pos.Seq, it, now) {
	case bus.Deliver:
		c.own(rs, it)
		c.push(rs, it, now)
		c.drain(rs, it.room, now)
	case bus.Held:
		c.own(rs, it)
		c.gaps[it.room] = rs
	case bus.GaveUp:
		c.own(rs, it)
		c.gaveUp(rs, it.room, now)
	case bus.NewEpoch:
		c.newEpoch(rs, it, now)
		return c.offer(it, nil, now)
	default: // Duplicate, Stale: delivered before, or of an epoch given up
		return []uint64{it.sseq}
	}
	return nil
}

func (c *core) own(rs *roomState, it *item) {
	c.owned[it.sseq] = true
	rs.pending++
}

// newEpoch closes the room's numbering: what it holds goes out with its
// gaps given up, then a new_epoch marker, and the room follows the new
// numbering from seq 1.
func (c *core) newEpoch(rs *roomState, it *item, now time.Time) {
	for rs.seq.Held() > 0 {
		rs.seq.SkipGap(now)
		c.gaveUp(rs, it.room, now)
	}
	c.pushMarker(rs, it.room, position{it.pos.Epoch, 0}, ResyncNewEpoch, now, false)
	rs.seq.Reset(it.pos.Epoch, 0)
}

// gaveUp follows a gap the sequencer gave up: a gap marker at the room's
// new position, then what is next.
func (c *core) gaveUp(rs *roomState, room string, now time.Time) {
	e, s, _ := rs.seq.Position()
	rs.refetched = time.Time{}
	c.pushMarker(rs, room, position{e, s}, ResyncGap, now, false)
	c.drain(rs, room, now)
}

func (c *core) drain(rs *roomState, room string, now time.Time) {
	for it, ok := rs.seq.Next(); ok; it, ok = rs.seq.Next() {
		c.push(rs, it, now)
	}
	if rs.seq.Held() == 0 {
		delete(c.gaps, room)
		rs.refetched = time.Time{}
	} else {
		c.gaps[room] = rs
	}
}

func (c *core) push(_ *roomState, it *item, now time.Time) {
	it.readyAt = now
	c.ready = append(c.ready, it)
	if it.visible() {
		c.visible++
	}
}

// pushMarker queues a resync marker of room: at the back (it precedes
// the room's items still to come) or, for dead_letter, at the front
// (before the room's items already queued).
func (c *core) pushMarker(rs *roomState, room string, p position, reason string, now time.Time, front bool) {
	id, data := newMarker(c.region, room, p.Epoch, p.Seq, reason, now)
	it := &item{id: id, data: data, room: room, pos: p, stored: now, at: now, marker: reason, readyAt: now}
	rs.pending++
	if front {
		c.ready = append([]*item{it}, c.ready...)
		c.visible++
		return
	}
	c.push(rs, it, now)
}

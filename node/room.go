package node

import (
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/presence-dev/presence/bus"
)

// room is a room with local members: its subscription, its members, the
// events it holds for them and its position in the room's numbering.
// Every field of a room and of its members is guarded by hub.mu.
type room struct {
	name    string
	view    string // region token of sub's subjects
	sub     *nats.Subscription
	ready   chan struct{} // closed once subscribed, or failed (err set)
	err     error
	members map[*conn]*member
	// special holds the members an event must visit one by one while the
	// room batches: the live ones that take no events frames. In a room of
	// 15,000 nearly all are batched: an event then costs the node one
	// append, not a pass over every member (noteLocked keeps it).
	special map[*conn]*member
	// waiting holds the members waiting for a snapshot (a join, a resync);
	// buffered the events passed on since the first of them began to wait,
	// once for all of them (not per member: a resync of 15,000 would hold
	// every event 15,000 times). A member's snapshot at S takes the
	// buffered events above S. dropped is the highest seq dropped from
	// buffered: a snapshot below it cannot serve.
	waiting    map[*conn]*member
	buffered   []event
	dropped    uint64
	roomCounts // count.go
	roomFan    // fanout.go
	// The frames of the room's latest snapshot, shared by its joiners
	// (joinframes.go).
	bodies     snapBodies
	joinFrames joinFrames

	seq       *bus.Sequencer[event] // (epoch, base): every Seq <= base is passed on or in a snapshot
	start     uint64                // the RoomSeq the room's position started from (the last Reset)
	early     []event               // received before the first snapshot
	lost      bool                  // early overflowed
	resyncing bool
	gone      bool // out of hub.rooms: a late tick or resync leaves it
}

// member is one connection in a room. Until its snapshot is sent it is
// not live and its transitions are buffered; after, it gets those with a
// Seq above its snapshot's.
//
// after is a high-water mark: every event at or below it was sent to the
// member or is in its snapshot, so nothing is ever sent twice, whether
// alone, batched or buffered.
type member struct {
	in     interest // what the member is kept up to date with
	after  uint64
	live   bool
	resync bool // waiting for the room's resync snapshot
	behind bool // its queue was full: nothing until it drains, then a resync
	// floor: the room's position when it began to wait. Its snapshot is
	// read later, so at or above it: buffered events at or below every
	// waiting member's floor serve no one.
	floor uint64
	slot  uint32 // its turn is slot mod the room's turns (turnsLocked)
	// framed: when its last turn's events frame was queued (the hub's
	// clock): no turn sends it a second frame within a tick.
	framed time.Time
	// View count: the count last sent and the read it came from.
	sent int
	gen  uint64
}

type event struct {
	epoch int64 // 0: not known
	seq   uint64
	frame []byte // the event frame
	entry []byte // the entry of an events frame
	delta int8   // +1 online, -1 offline
	user  string
	// sessionsOnly: a new session of a member (update, joined), sent only
	// to members kept at detailSessions.
	sessionsOnly bool
	at           time.Time // off NATS
}

// noteLocked files m in r.special and r.waiting, or out of them, after a
// change of its interest, liveness or lag.
func (r *room) noteLocked(c *conn, m *member) {
	if m.live && !m.in.batch && !m.in.count && !m.behind {
		if r.special == nil {
			r.special = map[*conn]*member{}
		}
		r.special[c] = m
	} else {
		delete(r.special, c)
	}
	if m.live || m.in.count || m.behind {
		r.unwaitLocked(c)
		return
	}
	if _, ok := r.waiting[c]; !ok {
		if r.waiting == nil {
			r.waiting = map[*conn]*member{}
		}
		_, base, synced := r.seq.Position()
		m.floor = 0
		if synced {
			m.floor = base
		}
		r.waiting[c] = m
	}
}

// unwaitLocked takes c off the members waiting for a snapshot; the last
// one off drops the buffer.
func (r *room) unwaitLocked(c *conn) {
	delete(r.waiting, c)
	if len(r.waiting) == 0 {
		r.buffered = nil
	}
}

func (r *room) memberOf(c *conn) *member {
	if r == nil {
		return nil
	}
	return r.members[c]
}

// bufferLocked keeps e for the members waiting for a snapshot. Full, the
// buffer first drops what no waiting member can need (at or below every
// floor), then, if that is not enough, everything: their snapshots are
// then read again (readyLocked refuses one below dropped).
func (r *room) bufferLocked(e event) {
	if len(r.waiting) == 0 {
		return
	}
	if len(r.buffered) >= maxBuffered {
		floor := e.seq
		for _, m := range r.waiting {
			floor = min(floor, m.floor)
		}
		n := 0
		for n < len(r.buffered) && r.buffered[n].seq <= floor {
			n++
		}
		if n == 0 {
			n = len(r.buffered)
		}
		r.dropped = max(r.dropped, r.buffered[n-1].seq)
		r.buffered = slices.Delete(r.buffered, 0, n)
	}
	r.buffered = append(r.buffered, e)
}

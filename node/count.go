package node

import (
	"context"
	"errors"

	"github.com/presence-dev/presence/protocol"
)

// Count frames (view count): a count member gets the room's count, read
// from the store, when its join is answered and at a tick after the
// room's membership changed (fanout.go starts the reads, one goroutine
// at a time).

// Counter reads a room's member count without listing it: the regional
// store (*region.Store), the global view's client, and the node's views
// all have it. Count frames come from it.
type Counter interface {
	Count(ctx context.Context, room string) (int, error)
}

// errNoCounts refuses view count where the snapshots' source has no
// Counter.
var errNoCounts = errors.New("node: the store does not count rooms")

// roomCounts is a room's part in count frames, under hub.mu: counters is
// how many members have view count; countDirty that the room's
// membership changed since its count was last read; readN the latest
// count read, and readGen its read.
type roomCounts struct {
	counters   int
	countDirty bool
	readN      int
	readGen    uint64
}

// readCounts reads the count of each room and sends it to its count
// members that have an older one. A failed read is retried at the next
// tick.
func (h *hub) readCounts(rooms []*room) {
	defer h.wg.Done()
	defer h.out.counting.Store(false)
	for _, r := range rooms {
		gen := h.out.gen.Add(1)
		ctx, cancel := context.WithTimeout(h.ctx, h.timeout)
		n, err := h.counter.Count(ctx, r.name)
		cancel()
		h.mu.Lock()
		if err != nil {
			r.countDirty = true
			h.out.dirty[r] = struct{}{}
		} else {
			r.readN, r.readGen = n, gen
			h.sendCountLocked(r, n, gen)
		}
		h.mu.Unlock()
		if err != nil {
			h.log.Warn("node: count read failed; retried at the next tick", "room", r.name, "err", err)
		}
	}
}

// sendCountLocked sends count n, read by read gen, to r's live count
// members whose count is older and different. A member whose queue is
// full is skipped and the room read again at the next tick: counts are
// whole, so only the latest matters.
func (h *hub) sendCountLocked(r *room, n int, gen uint64) {
	var f []byte
	for c, m := range r.members {
		if !m.in.count || !m.live || m.gen >= gen {
			continue
		}
		if m.sent != n {
			if c.queued() >= behindFrames {
				r.countDirty = true
				h.out.dirty[r] = struct{}{}
				continue
			}
			if f == nil {
				f = encodeCount("", "", r.name, n)
			}
			c.send(f)
			m.sent = n
		}
		m.gen = gen
	}
}

// countReply answers a join with view count: the room's count, read now.
// The member is live from then on.
func (h *hub) countReply(ctx context.Context, name string, c *conn, ref string) error {
	if h.counter == nil {
		return errNoCounts
	}
	gen := h.out.gen.Add(1)
	n, err := h.counter.Count(ctx, name)
	if err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.rooms[name]
	m := r.memberOf(c)
	if m == nil || !m.in.count {
		return nil // left, or joined again with another view, meanwhile
	}
	if r.readGen > gen {
		n, gen = r.readN, r.readGen // a tick's read, newer, skipped this member
	}
	c.send(encodeCount(ref, protocol.ReasonJoin, name, n))
	m.live, m.sent, m.gen = true, n, gen
	r.noteLocked(c, m)
	return nil
}

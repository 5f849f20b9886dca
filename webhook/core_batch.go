package webhook

import (
	"time"
)

// verdict is what a failed attempt leads to.
type verdict int

const (
	retryLater verdict = iota
	deadLetter         // past the horizon: to the dead-letter stream
	disable            // 410 Gone: the endpoint stops until the config is reloaded
)

// tick acts on the gaps open for the gap timeout. The missing message
// may be in the stream still, delivered to the lane's consumer but lost
// on its way (it would come again only after the AckWait): the first
// time, tick returns true and the lane reads again from its consumer's
// ack floor; a gap still open a gap timeout later is given up.
func (c *core) tick(now time.Time) (refetch bool) {
	for room, rs := range c.gaps {
		switch {
		case !rs.seq.Overdue(now):
		case rs.refetched.IsZero():
			rs.refetched, refetch = now, true
		case !now.Before(rs.refetched.Add(c.lim.gapTimeout)):
			rs.seq.SkipGap(now)
			c.gaveUp(rs, room, now)
		}
	}
	return refetch
}

// due returns the batch to attempt now, forming one when the queue is
// full enough or its head waited max wait; otherwise nil and when to ask
// again (zero: when something arrives). A batch without a visible item
// (only messages the filter leaves out) needs no request: settle it.
func (c *core) due(now time.Time) (*batch, time.Time) {
	wake := c.gapDeadline()
	if b := c.batch; b != nil && b.oldest.IsZero() && len(c.ready) > 0 && !c.disabled {
		c.dissolve() // only markers: they take what is ready along
	}
	if b := c.batch; b != nil {
		if c.disabled {
			return nil, wake
		}
		if !now.Before(b.next) {
			return b, time.Time{}
		}
		return nil, earliest(wake, b.next)
	}
	if len(c.ready) == 0 {
		return nil, wake
	}
	if c.visible > 0 && c.visible < c.lim.batchSize {
		if at := c.firstVisible().readyAt.Add(c.lim.maxWait); now.Before(at) {
			return nil, earliest(wake, at)
		}
	}
	c.batch = c.form(now)
	return c.batch, time.Time{}
}

// dissolve puts a batch of markers only back in the queue, to be formed
// again with what became ready behind it, on the same retry schedule:
// the receiver never accepted it, and the markers keep their ids.
func (c *core) dissolve() {
	b := c.batch
	c.ready = append(b.items, c.ready...)
	c.visible += b.visible
	c.batch = nil
	c.next, c.attempts = b.next, b.attempts
}

func (c *core) firstVisible() *item {
	for _, it := range c.ready {
		if it.visible() {
			return it
		}
	}
	return nil
}

func (c *core) gapDeadline() time.Time {
	var t time.Time
	for _, rs := range c.gaps {
		if !rs.refetched.IsZero() {
			t = earliest(t, rs.refetched.Add(c.lim.gapTimeout))
			continue
		}
		t = earliest(t, rs.seq.Deadline())
	}
	return t
}

// earliest returns the earlier of two times, a zero one meaning none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// form takes the queue's head: up to batch size visible items and the
// silent ones among and after them.
func (c *core) form(now time.Time) *batch {
	b := &batch{next: later(now, c.next), attempts: c.attempts}
	c.next, c.attempts = time.Time{}, 0
	var ids []string
	var datas [][]byte
	var latest time.Time
	n := 0
	for n < len(c.ready) {
		it := c.ready[n]
		if it.visible() {
			if b.visible == c.lim.batchSize {
				break
			}
			b.visible++
			ids, datas = append(ids, it.id), append(datas, it.data)
			latest = later(latest, it.at)
		}
		if it.sseq != 0 {
			b.oldest = earliest(b.oldest, it.stored)
		}
		n++
	}
	b.items = append([]*item(nil), c.ready[:n]...)
	clear(c.ready[:n])
	c.ready = c.ready[n:]
	c.visible -= b.visible
	switch len(ids) {
	case 0:
	case 1:
		b.id = ids[0]
	default:
		b.id = batchID(ids)
	}
	if b.visible > 0 {
		b.body = encodeBody(datas, latest)
	}
	return b
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// failed records a failed attempt of the batch and says what follows:
// another attempt (scheduled, never past the horizon), the dead-letter
// stream once the horizon has passed, or disabling on 410.
func (c *core) failed(r result, now time.Time) verdict {
	b := c.batch
	b.attempts++
	b.last = r
	if r.gone() {
		c.disabled = true
		return disable
	}
	end := b.oldest.Add(c.lim.horizon)
	if b.oldest.IsZero() {
		end = time.Time{} // markers only: no horizon, they wait for events or the endpoint
	} else if !now.Before(end) {
		return deadLetter
	}
	next := now.Add(retryDelay(b.attempts, c.lim.minBackoff, c.lim.maxBkf, r.retryAfter, c.rnd()))
	b.next = earliest(next, end)
	return retryLater
}

// enable lifts a 410: the held batch is attempted at once.
func (c *core) enable(now time.Time) {
	c.disabled = false
	if c.batch != nil {
		c.batch.next = now
	}
}

// settle returns what to persist for the batch answered 2xx (or, with
// dead, dead-lettered): each room's new position; markers delivered;
// after a dead letter, the rooms whose events the endpoint never got now
// owe a dead_letter marker.
func (c *core) settle(dead bool) settlement {
	s := settlement{positions: map[string]position{}, owe: map[string]position{}}
	for _, it := range c.batch.items {
		switch {
		case it.marker == "":
			s.positions[it.room] = it.pos
			s.acks = append(s.acks, it.sseq)
			if dead && it.visible() {
				s.owe[it.room] = it.pos
			}
		case it.marker == ResyncDeadLetter && dead:
			s.owe[it.room] = it.pos // owed still
		case it.marker == ResyncDeadLetter:
			s.paid = append(s.paid, it.room)
		}
	}
	for room := range s.owe {
		if p, ok := s.positions[room]; ok {
			s.owe[room] = p
		}
	}
	return s
}

// settled ends the batch once the shell persisted s and acknowledged:
// owed markers are queued first in line.
func (c *core) settled(s settlement, now time.Time) {
	for _, it := range c.batch.items {
		rs := c.room(it.room, now)
		rs.pending--
		if it.sseq != 0 {
			delete(c.owned, it.sseq)
		}
		if it.marker == ResyncDeadLetter {
			rs.owed = false
		}
	}
	c.batch = nil
	for room, p := range s.owe {
		c.owe(room, p, now)
	}
}

// owe queues a dead_letter marker of room first in line, unless one
// waits already.
func (c *core) owe(room string, p position, now time.Time) {
	rs := c.room(room, now)
	if rs.owed {
		return
	}
	rs.owed = true
	c.pushMarker(rs, room, p, ResyncDeadLetter, now, true)
}

// evict forgets rooms idle since before cutoff with nothing in flight:
// their positions are persisted, and read again when they come back.
func (c *core) evict(cutoff time.Time) {
	for name, rs := range c.rooms {
		if rs.pending == 0 && rs.seq.Held() == 0 && rs.touched.Before(cutoff) {
			delete(c.rooms, name)
		}
	}
}

// held counts the stream messages the core holds unacknowledged, and
// returns the stored time of the oldest: the lane's lag in seconds.
func (c *core) held() (n int, oldest time.Time) {
	if c.batch != nil {
		oldest = c.batch.oldest
	}
	for _, it := range c.ready {
		oldest = earliest(oldest, it.stored)
	}
	for _, rs := range c.gaps {
		if d := rs.seq.Deadline(); !d.IsZero() {
			oldest = earliest(oldest, d.Add(-c.lim.gapTimeout))
		}
	}
	return len(c.owned), oldest
}

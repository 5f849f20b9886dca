package node

import (
	"context"
	"sync"
	"time"
)

// wheelSlots spreads pings over the ping interval.
const wheelSlots = 16

// wheel is the registry of open connections and their shared ping timer:
// one goroutine visits one slot per tick and asks each of its connections
// for a ping, instead of a ticker per connection. A connection that does
// not answer in time fails its read deadline and is cleaned up by its
// reader.
type wheel struct {
	mu     sync.Mutex
	slots  [wheelSlots][]*conn
	n      int
	closed bool // draining or closed: no new connections
}

// add registers c and counts its two goroutines in wg; false means the
// node is draining. Counting under the lock orders every Add before the
// Wait of a drain, which closes the wheel first.
func (w *wheel) add(c *conn, wg *sync.WaitGroup) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return false
	}
	best := 0
	for i := range w.slots {
		if len(w.slots[i]) < len(w.slots[best]) {
			best = i
		}
	}
	c.wslot, c.widx = int32(best), int32(len(w.slots[best]))
	w.slots[best] = append(w.slots[best], c)
	w.n++
	wg.Add(1) // the reader; writers add themselves
	return true
}

func (w *wheel) remove(c *conn) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if c.widx < 0 {
		return
	}
	sl := w.slots[c.wslot]
	end := len(sl) - 1
	if int(c.widx) != end {
		sl[c.widx] = sl[end]
		sl[c.widx].widx = c.widx
	}
	sl[end] = nil
	w.slots[c.wslot] = sl[:end]
	c.widx = -1
	w.n--
}

// close stops registrations and returns the open connections.
func (w *wheel) close() []*conn {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	var all []*conn
	for _, sl := range w.slots {
		all = append(all, sl...)
	}
	return all
}

// run pings one slot per tick until ctx is done, so each connection is
// pinged once per interval.
func (w *wheel) run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(max(interval/wheelSlots, time.Millisecond))
	defer t.Stop()
	for i := 0; ; i = (i + 1) % wheelSlots {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.mu.Lock()
		for _, c := range w.slots[i] {
			c.requestPing()
		}
		w.mu.Unlock()
	}
}

package node

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// pinged reports whether the wheel asked c for a ping since the last
// look, and forgets it.
func (c *conn) pinged() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.ping
	c.ping = false
	return p
}

// The ping wheel, on synctest's clock: each open connection is asked for
// one ping per interval, one slot per interval/wheelSlots; the slots are
// balanced; a connection taken out is pinged no more; a closed wheel
// takes no connection and hands back those it had.
func TestTheWheelPingsEachConnectionOncePerInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const interval = 1600 * time.Millisecond
		var w wheel
		var wg sync.WaitGroup
		conns := make([]*conn, 3*wheelSlots+5)
		for i := range conns {
			conns[i] = queuedConn(fmt.Sprint("u", i)) // its writer is marked running: no goroutine
			if !w.add(conns[i], &wg) {
				t.Fatal("an open wheel refused a connection")
			}
		}
		for i := range w.slots {
			if n := len(w.slots[i]); n < 3 || n > 4 {
				t.Fatalf("slot %d holds %d connections, want 3 or 4 of %d over %d slots", i, n, len(conns), wheelSlots)
			}
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			w.run(ctx, interval)
		}()
		count := func(pings []int) {
			for i, c := range conns {
				if c.pinged() {
					pings[i]++
				}
			}
		}
		// One interval, tick by tick: each tick pings one slot.
		pings := make([]int, len(conns))
		for range wheelSlots {
			time.Sleep(interval / wheelSlots)
			synctest.Wait()
			before := sumOf(pings)
			count(pings)
			if n := sumOf(pings) - before; n < 3 || n > 4 {
				t.Fatalf("a tick pinged %d connections, want one slot's 3 or 4", n)
			}
		}
		for i, n := range pings {
			if n != 1 {
				t.Fatalf("connection %d pinged %d times in an interval, want once", i, n)
			}
		}
		// Taken out, a connection is pinged no more; the others go on.
		gone := conns[0]
		w.remove(gone)
		pings = make([]int, len(conns))
		time.Sleep(interval)
		synctest.Wait()
		count(pings)
		for i, n := range pings {
			if i == 0 && n != 0 || i > 0 && n != 1 {
				t.Fatalf("after a removal, connection %d pinged %d times in an interval", i, n)
			}
		}
		cancel()
		<-done
		if all := w.close(); len(all) != len(conns)-1 {
			t.Fatalf("close handed back %d connections, want %d", len(all), len(conns)-1)
		}
		if w.add(queuedConn("late"), &wg) {
			t.Fatal("a closed wheel took a connection")
		}
	})
}

func sumOf(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}

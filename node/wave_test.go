package node

import (
	"fmt"
	"testing"
)

// TestATicksWritersAreWokenInWaves: frames a tick queues to connections
// with no writer running are counted in waves of wakeChunk connections;
// a wave is done once each of its frames was taken by a writer, written
// or dropped, and the waker has dropped its hold; a connection whose
// writer runs takes its frame without being counted.
func TestATicksWritersAreWokenInWaves(t *testing.T) {
	h, _ := fanoutHub(t, 1)
	idle := make([]*conn, wakeChunk+44)
	for i := range idle {
		idle[i] = queuedConn(fmt.Sprint("u", i))
		idle[i].writing = false
	}
	busy := queuedConn("busy") // its writer is running
	h.mu.Lock()
	for i, c := range idle {
		h.out.waker.hold(c, outFrame{b: []byte("f")})
		if i == 10 {
			h.out.waker.hold(busy, outFrame{b: []byte("f")})
		}
	}
	h.out.waker.hold(idle[0], outFrame{b: []byte("g")}) // a second frame, in the last wave
	conns, waves := h.out.waker.waking, h.out.waker.waves
	h.mu.Unlock()
	if len(conns) != len(idle)+1 || len(waves) != 2 {
		t.Fatalf("%d to wake in %d waves, want %d in 2", len(conns), len(waves), len(idle)+1)
	}
	if l0, l1 := waves[0].left.Load(), waves[1].left.Load(); l0 != wakeChunk+1 || l1 != 44+1+1 {
		t.Fatalf("waves count %d and %d frames (with the hold), want %d and %d", l0, l1, wakeChunk+1, 46)
	}
	if busy.queued() != 1 || busy.queue[0].wave != nil {
		t.Fatal("the running writer's frame was not queued uncounted")
	}
	// The first wave: its writers take their frames (one connection is
	// closed instead, dropping its frames), then the waker lets go.
	for _, c := range idle[1:wakeChunk] {
		c.mu.Lock()
		takeWaves(c.queue)
		c.queue = nil
		c.mu.Unlock()
	}
	idle[0].mu.Lock()
	idle[0].dropQueueLocked() // as a shutdown or a slow consumer's close does
	idle[0].mu.Unlock()
	select {
	case <-waves[0].done:
		t.Fatal("a wave was done while the waker still held it")
	default:
	}
	waves[0].taken()
	select {
	case <-waves[0].done:
	default:
		t.Fatalf("the first wave is not done: %d left", waves[0].left.Load())
	}
	// idle[0]'s second frame, of the last wave, went with its close.
	for _, c := range idle[wakeChunk:] {
		c.mu.Lock()
		takeWaves(c.queue)
		c.mu.Unlock()
	}
	waves[1].taken()
	select {
	case <-waves[1].done:
	default:
		t.Fatalf("the last wave is not done: %d left", waves[1].left.Load())
	}
}

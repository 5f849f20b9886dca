package node

import (
	"sync/atomic"
	"time"
)

// Waking a tick's writers in waves.
//
// A tick that sends a frame to each of 15,000 members used to start
// 15,000 writer goroutines at once. Go runs new goroutines, and those a
// network reply wakes, from run queues in order: a snapshot read's reply,
// a claim's, or the NATS message with the next events then waited behind
// every writer of the tick, hundreds of milliseconds (a storm's joiners
// waited 376 ms for a read that takes 10). Now the tick queues its frames
// without starting writers, and one goroutine starts them wakeChunk at a
// time, the next wave once the last one's writers have taken their
// frames (or after wavePatience, so that a writer that never runs, its
// connection closed meanwhile, cannot stall the rest). The run queues
// then hold a wave, not the whole tick, and everything else interleaves.

const (
	wakeChunk    = 256
	wavePatience = 10 * time.Millisecond
)

// wave counts the frames of one wave not yet taken by their writers. It
// starts at one, the tick's hold, dropped once the wave's writers are
// started: it cannot reach zero while the tick still adds to it.
type wave struct {
	left atomic.Int32
	done chan struct{}
}

func newWave() *wave {
	w := &wave{done: make(chan struct{})}
	w.left.Store(1)
	return w
}

// taken is called once for each frame of the wave a writer took, and
// once by the waker.
func (w *wave) taken() {
	if w.left.Add(-1) == 0 {
		close(w.done)
	}
}

// holdSharedLocked queues a tick's frame to c; if c has no writer
// running, c is woken with the tick's next wave instead of at once.
func (h *hub) holdSharedLocked(c *conn, f outFrame) {
	if len(h.waking) == len(h.waves)*wakeChunk {
		h.waves = append(h.waves, newWave())
	}
	w := h.waves[len(h.waves)-1]
	if c.hold(f, w) {
		h.waking = append(h.waking, c)
	}
}

// wakeLocked hands the tick's held writers to a waker.
func (h *hub) wakeLocked() {
	conns, waves := h.waking, h.waves
	if len(conns) == 0 {
		h.waves = h.waves[:0] // nothing counted in them: every writer ran
		return
	}
	h.waking, h.waves = nil, nil
	h.wg.Add(1)
	go h.wake(conns, waves)
}

// wake starts the writers of conns wave by wave.
func (h *hub) wake(conns []*conn, waves []*wave) {
	defer h.wg.Done()
	t := time.NewTimer(wavePatience)
	defer t.Stop()
	for i, w := range waves {
		for _, c := range conns[min(i*wakeChunk, len(conns)):min((i+1)*wakeChunk, len(conns))] {
			c.signal()
		}
		w.taken()
		t.Reset(wavePatience)
		select {
		case <-w.done:
		case <-t.C:
		case <-h.ctx.Done():
			// The node is closing: the rest at once, unpaced.
			for _, c := range conns[min((i+1)*wakeChunk, len(conns)):] {
				c.signal()
			}
			return
		}
	}
}

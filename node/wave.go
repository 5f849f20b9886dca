package node

import (
	"context"
	"sync"
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

// waker gathers a tick's writers to start and starts them in waves. It
// has no lock: only the tick uses it, and the tick runs on the
// dispatcher alone. waking[i] is in waves[i/wakeChunk].
type waker struct {
	ctx    context.Context // the node's: closing, the rest start at once
	wg     *sync.WaitGroup // counts the goroutines starting the waves
	waking []*conn
	waves  []*wave
}

// hold queues a tick's frame to c; if c has no writer running, c is woken
// with the tick's next wave instead of at once.
func (k *waker) hold(c *conn, f outFrame) {
	if len(k.waking) == len(k.waves)*wakeChunk {
		k.waves = append(k.waves, newWave())
	}
	w := k.waves[len(k.waves)-1]
	if c.hold(f, w) {
		k.waking = append(k.waking, c)
	}
}

// wake hands the tick's held writers to a goroutine that starts them.
func (k *waker) wake() {
	conns, waves := k.waking, k.waves
	if len(conns) == 0 {
		k.waves = k.waves[:0] // nothing counted in them: every writer ran
		return
	}
	k.waking, k.waves = nil, nil
	k.wg.Add(1)
	go k.run(conns, waves)
}

// run starts the writers of conns wave by wave.
func (k *waker) run(conns []*conn, waves []*wave) {
	defer k.wg.Done()
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
		case <-k.ctx.Done():
			// The node is closing: the rest at once, unpaced.
			for _, c := range conns[min((i+1)*wakeChunk, len(conns)):] {
				c.signal()
			}
			return
		}
	}
}

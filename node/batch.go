package node

import (
	"net"
	"sync"
	"time"
)

// WrapListener returns a listener whose connections can batch writes: a
// connection's writer then sends every frame it has queued with one
// write call instead of one per frame. Fanning a large room's events out
// is mostly write calls, so serve the node's Handler on this listener.
// (Wrap a TLS listener, not the other way round: the batch must reach the
// TLS layer as one write too.)
func WrapListener(ln net.Listener) net.Listener { return batchListener{ln} }

type batchListener struct{ net.Listener }

func (l batchListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &batchConn{Conn: c}, nil
}

// batchConn holds writes between begin and flush.
//
// Writes come from more than one goroutine: the connection's writer, but
// also gorilla's WriteControl (the default close handler answers a close
// frame from the reader goroutine) and Close. gorilla serializes its own
// writes, but begin and flush run outside its lock, so the batch state is
// under mu. A write that arrives during a batch joins it, in order; one
// that arrives between flush's hand-over and its write goes out first.
// Close sends a held batch before it closes. All of this keeps every frame whole: each Write is a whole frame or part of
// one written under gorilla's lock, and net.Conn writes do not interleave.
type batchConn struct {
	net.Conn
	mu  sync.Mutex
	on  bool
	buf *[]byte
	// deadline: gorilla sets the write deadline before every frame; during
	// a batch nothing is written until flush, which sets the last one
	// once.
	deadline time.Time
	// set is the write deadline in force on the socket.
	set time.Time
}

// deadlineSlack is how much later than asked the write deadline in force
// may be, never earlier. gorilla sets it before every frame, and moving a
// socket's timer (a lock on the timer heap, and a goroutine stack grown
// for it) was a fifth of the node's CPU when a tick writes one frame to
// each of 15,000 members. With the slack it moves about once a second; a
// client that stops reading is cut at most this much later.
const deadlineSlack = time.Second

// SetWriteDeadline is kept for the flush during a batch.
func (b *batchConn) SetWriteDeadline(t time.Time) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.on {
		b.deadline = t
		return nil
	}
	return b.setDeadlineLocked(t)
}

// setDeadlineLocked makes the deadline in force at least t and at most
// deadlineSlack after it (exactly t when t is zero: none).
func (b *batchConn) setDeadlineLocked(t time.Time) error {
	if !t.IsZero() && !b.set.IsZero() && !b.set.Before(t) && b.set.Sub(t) <= deadlineSlack {
		return nil
	}
	if !t.IsZero() {
		t = t.Add(deadlineSlack)
	}
	if err := b.Conn.SetWriteDeadline(t); err != nil {
		return err
	}
	b.set = t
	return nil
}

var batchBufs = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

func (b *batchConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	if b.on {
		*b.buf = append(*b.buf, p...)
		b.mu.Unlock()
		return len(p), nil
	}
	b.mu.Unlock()
	return b.Conn.Write(p)
}

// Close sends what is held, then closes. A close frame that gorilla
// wrote from the reader goroutine during a batch is held with it, and the
// reader closes the connection right after: without this the client
// would never see the close answered.
func (b *batchConn) Close() error {
	b.mu.Lock()
	buf := b.buf
	b.on, b.buf = false, nil
	b.mu.Unlock()
	if buf != nil && len(*buf) > 0 {
		_ = b.Conn.SetWriteDeadline(time.Now().Add(closeFlushTimeout))
		_, _ = b.Conn.Write(*buf)
	}
	return b.Conn.Close()
}

// closeFlushTimeout bounds the last write of Close.
const closeFlushTimeout = time.Second

// begin starts holding writes.
func (b *batchConn) begin() {
	buf := batchBufs.Get().(*[]byte)
	b.mu.Lock()
	b.on, b.buf = true, buf
	b.mu.Unlock()
}

// flush sends what was held with one write and stops holding. The buffer
// goes back to a pool: an idle connection holds none.
func (b *batchConn) flush() error {
	b.mu.Lock()
	buf, deadline := b.buf, b.deadline
	b.on, b.buf, b.deadline = false, nil, time.Time{}
	if buf != nil && len(*buf) > 0 && !deadline.IsZero() {
		_ = b.setDeadlineLocked(deadline)
	}
	b.mu.Unlock()
	if buf == nil {
		return nil
	}
	var err error
	if len(*buf) > 0 {
		_, err = b.Conn.Write(*buf)
	}
	if cap(*buf) <= 64<<10 {
		*buf = (*buf)[:0]
		batchBufs.Put(buf)
	}
	return err
}

package node

import (
	"net"
	"sync"
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

// batchConn holds writes between begin and flush. Only one goroutine
// writes at a time: the HTTP server before the upgrade, the connection's
// writer after it.
type batchConn struct {
	net.Conn
	on  bool
	buf *[]byte
}

var batchBufs = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

func (b *batchConn) Write(p []byte) (int, error) {
	if b.on {
		*b.buf = append(*b.buf, p...)
		return len(p), nil
	}
	return b.Conn.Write(p)
}

// begin starts holding writes.
func (b *batchConn) begin() {
	b.on = true
	b.buf = batchBufs.Get().(*[]byte)
}

// flush sends what was held with one write and stops holding. The buffer
// goes back to a pool: an idle connection holds none.
func (b *batchConn) flush() error {
	b.on = false
	var err error
	if len(*b.buf) > 0 {
		_, err = b.Conn.Write(*b.buf)
	}
	if cap(*b.buf) <= 64<<10 {
		*b.buf = (*b.buf)[:0]
		batchBufs.Put(b.buf)
	}
	b.buf = nil
	return err
}

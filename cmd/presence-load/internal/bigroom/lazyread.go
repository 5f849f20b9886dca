package bigroom

import (
	"net"
	"sync"
	"syscall"
	"time"
)

// Lazy reading for the connections of a big room that only count their
// frames (every member but the sampled ones).
//
// Every frame the node wrote to one of them woke its reader on this
// machine, which the node shares: the kernel's wakeup of the worker was
// charged to the node's write, and the worker's wakeups took as much CPU
// as the node's writes. A client on its own machine costs the node none
// of that. So such a connection's socket signals it readable only once
// lowat bytes have gathered (SO_RCVLOWAT; the kernel skips the wakeups
// below it), and once per lazyFlush every socket's mark is lowered to one
// byte for lazyHold, so that a ping (answered within the node's pong
// timeout), a close or the last frames before a quiet spell are read
// within a second. (The mark must stay down until the readers' poller has
// seen the sockets: the kernel checks it again when it reports them.)
// The node writes the same frames to the same sockets; only when this
// side reads them changes. The sampled members, whose arrivals are
// timed, read every frame at once.

const (
	lazyFlush = time.Second
	lazyHold  = 100 * time.Millisecond
)

// lazyReaders holds a worker's lazily read sockets and flushes them.
type lazyReaders struct {
	mu    sync.Mutex
	lowat int
	raws  []syscall.RawConn
	once  sync.Once
}

// add makes c's socket readable only from lowat bytes, and starts the
// flusher with the first one. A connection that is not TCP stays as it is.
func (l *lazyReaders) add(c net.Conn, lowat int) error {
	tc, ok := c.(*net.TCPConn)
	if !ok || lowat <= 1 {
		return nil
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return err
	}
	if err := setLowat(raw, lowat); err != nil {
		return err
	}
	l.mu.Lock()
	l.lowat = lowat
	l.raws = append(l.raws, raw)
	l.mu.Unlock()
	l.once.Do(func() { go l.flush(nil) })
	return nil
}

// flush wakes every socket's reader once per lazyFlush if it has
// anything to read: the mark down to one byte (the kernel signals a
// socket holding data on the change), for lazyHold, then back.
// It runs until done is closed (nil: for good, as a worker's does).
func (l *lazyReaders) flush(done <-chan struct{}) {
	t := time.NewTicker(lazyFlush)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		l.setAll(true)
		time.Sleep(lazyHold)
		l.setAll(false)
	}
}

// setAll sets every socket's mark to one byte (down) or back to lowat.
// A socket since closed fails, and is left alone.
func (l *lazyReaders) setAll(down bool) {
	l.mu.Lock()
	raws, n := l.raws, l.lowat
	l.mu.Unlock()
	if down {
		n = 1
	}
	for _, raw := range raws {
		_ = setLowat(raw, n)
	}
}

func setLowat(raw syscall.RawConn, n int) error {
	var serr error
	err := raw.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT, n)
	})
	if err != nil {
		return err
	}
	return serr
}

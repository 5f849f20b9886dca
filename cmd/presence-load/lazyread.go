package main

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
// below it), and once per lazyFlush every socket is signalled whatever it
// holds, so that a ping (answered within the node's pong timeout), a
// close or the last frames before a quiet spell are read within a second.
// The node writes the same frames to the same sockets; only when this
// side reads them changes. The sampled members, whose arrivals are
// timed, read every frame at once.

const lazyFlush = time.Second

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
	l.once.Do(func() { go l.flush() })
	return nil
}

// flush signals every socket once per lazyFlush: setting the low-water
// mark to 1 wakes a reader that has anything to read (the kernel checks
// on every change), and setting it back leaves it lazy again.
func (l *lazyReaders) flush() {
	t := time.NewTicker(lazyFlush)
	defer t.Stop()
	for range t.C {
		l.mu.Lock()
		raws, lowat := l.raws, l.lowat
		l.mu.Unlock()
		for _, raw := range raws {
			if setLowat(raw, 1) == nil {
				_ = setLowat(raw, lowat)
			}
		}
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

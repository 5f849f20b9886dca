package bigroom

import (
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// A lazily read socket is not readable below its mark, is while the
// flush holds the mark down, and its reader gets what arrives either way.
func TestALazySocketStillReadsWhatArrives(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server := <-accepted
	defer server.Close()

	var l lazyReaders
	l.once.Do(func() {}) // the test flushes by hand, then starts the flusher
	if err := l.add(client, 16384); err != nil {
		t.Fatal(err)
	}
	raw, err := client.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var fd int
	_ = raw.Control(func(f uintptr) { fd = int(f) })
	if got, err := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_RCVLOWAT); err != nil || got != 16384 {
		t.Fatalf("SO_RCVLOWAT %d (%v), want 16384", got, err)
	}

	// A poller of its own, to see what the readers' poller is told.
	ep, err := syscall.EpollCreate1(0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(ep)
	if err := syscall.EpollCtl(ep, syscall.EPOLL_CTL_ADD, fd, &syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(fd)}); err != nil {
		t.Fatal(err)
	}
	readable := func() bool {
		evs := make([]syscall.EpollEvent, 1)
		n, err := syscall.EpollWait(ep, evs, 0)
		if err != nil && err != syscall.EINTR {
			t.Fatal(err)
		}
		return n > 0
	}
	queued := func() int { // bytes arrived (up to 100), peeked, not read
		n, _, err := syscall.Recvfrom(fd, make([]byte, 100), syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		if err != nil && err != syscall.EAGAIN {
			t.Fatal(err)
		}
		return max(n, 0)
	}

	if _, err := server.Write(make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); queued() < 100; {
		if time.Now().After(deadline) {
			t.Fatal("100 bytes written never arrived")
		}
		time.Sleep(time.Millisecond)
	}
	if readable() {
		t.Fatal("100 bytes below a mark of 16384 reported readable")
	}
	l.setAll(true)
	if !readable() {
		t.Fatal("with the mark down, 100 bytes not readable")
	}
	l.setAll(false)
	if readable() {
		t.Fatal("with the mark back, 100 bytes still readable")
	}

	// The reader gets what arrives, below the mark (by a flush) and above.
	stop := make(chan struct{})
	defer close(stop)
	go l.flush(stop)
	read := func(n int) <-chan error {
		errc := make(chan error, 1)
		go func() {
			// Far above lazyFlush: a flush, not the deadline, ends the wait.
			_ = client.SetReadDeadline(time.Now().Add(10 * lazyFlush))
			_, err := io.ReadFull(client, make([]byte, n))
			errc <- err
		}()
		return errc
	}
	for _, n := range []int{100, 40000, 10} {
		errc := read(n)
		if n != 100 { // the 100 bytes are there already
			if _, err := server.Write(make([]byte, n)); err != nil {
				t.Fatal(err)
			}
		}
		if err := <-errc; err != nil {
			t.Fatalf("reading %d bytes: %v", n, err)
		}
	}
}

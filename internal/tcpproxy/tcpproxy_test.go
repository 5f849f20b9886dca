package tcpproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/presence-dev/presence/internal/testkit"
)

// echoServer accepts connections and echoes every byte back; its
// Conns reports how many connections it has seen end.
type echoServer struct {
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	ended int
}

func startEcho(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &echoServer{ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				_, _ = io.Copy(c, c)
				_ = c.Close()
				s.mu.Lock()
				s.ended++
				s.mu.Unlock()
			}()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); s.wg.Wait() })
	return s
}

func (s *echoServer) endedConns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ended
}

func newProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// roundTrip sends line and reads it back through conn.
func roundTrip(t *testing.T, conn net.Conn, r *bufio.Reader, line string) error {
	t.Helper()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte(line + "\n")); err != nil {
		return err
	}
	got, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if got != line+"\n" {
		t.Fatalf("echo: got %q, want %q", got, line+"\n")
	}
	return nil
}

func dial(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, bufio.NewReader(c)
}

func TestForwards(t *testing.T) {
	echo := startEcho(t)
	p := newProxy(t, echo.ln.Addr().String())
	a, ra := dial(t, p.Addr())
	b, rb := dial(t, p.Addr())
	for i := 0; i < 3; i++ {
		if err := roundTrip(t, a, ra, "hello a"); err != nil {
			t.Fatal(err)
		}
		if err := roundTrip(t, b, rb, "hello b"); err != nil {
			t.Fatal(err)
		}
	}
	if n := p.Accepted(); n != 2 {
		t.Fatalf("Accepted = %d, want 2", n)
	}
	// A clean close travels through: the echo server sees its end, and the
	// proxy forgets the pair.
	_ = a.Close()
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.Want("connections the echo server saw end", echo.endedConns(), 1) })
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.Want("open pairs", p.Open(), 1) })
}

func TestRefuseResetsBothSidesAndRefusesUntilRestore(t *testing.T) {
	echo := startEcho(t)
	p := newProxy(t, echo.ln.Addr().String())
	a, ra := dial(t, p.Addr())
	if err := roundTrip(t, a, ra, "before"); err != nil {
		t.Fatal(err)
	}

	p.Refuse()
	// The client's side fails at once: a reset, not a clean end of stream.
	_ = a.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := ra.ReadByte()
	if err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("read after Refuse: %v, want a connection reset", err)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("read after Refuse timed out: the connection was not dropped")
	}
	// The target's side ends too.
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.Want("connections the echo server saw end", echo.endedConns(), 1) })
	if n := p.Open(); n != 0 {
		t.Fatalf("Open after Refuse = %d, want 0", n)
	}

	// While cut, a new connection is accepted and reset at once (the
	// reset can beat the dial's return): nothing reaches the target.
	if c, err := net.Dial("tcp", p.Addr()); err == nil {
		if err := roundTrip(t, c, bufio.NewReader(c), "during"); err == nil {
			t.Fatal("a connection made while cut carried data")
		}
		_ = c.Close()
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.AtLeast("refusals counted", p.Refused(), 1) })
	if n := p.Accepted(); n != 1 {
		t.Fatalf("Accepted while cut = %d, want 1", n)
	}

	p.Restore()
	d, rd := dial(t, p.Addr())
	if err := roundTrip(t, d, rd, "after"); err != nil {
		t.Fatalf("after Restore: %v", err)
	}
	if n := p.Accepted(); n != 2 {
		t.Fatalf("Accepted after Restore = %d, want 2", n)
	}
}

func TestConcurrentCutRestore(t *testing.T) {
	echo := startEcho(t)
	p := newProxy(t, echo.ln.Addr().String())
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := net.Dial("tcp", p.Addr())
				if err != nil {
					continue
				}
				r := bufio.NewReader(c)
				_ = c.SetDeadline(time.Now().Add(time.Second))
				_, _ = c.Write([]byte("x\n"))
				_, _ = r.ReadString('\n')
				_ = c.Close()
			}
		}()
	}
	for i := 0; i < 50; i++ {
		if i%2 == 0 {
			p.Cut()
		} else {
			p.Refuse()
		}
		time.Sleep(time.Millisecond)
		p.Restore()
		time.Sleep(time.Millisecond)
	}
	close(stop)
	wg.Wait()
	// Still forwarding after all that.
	a, ra := dial(t, p.Addr())
	if err := roundTrip(t, a, ra, "still"); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if n := p.Open(); n != 0 {
		t.Fatalf("Open after Close = %d", n)
	}
}

func TestCutHoldsNewConnectionsUntilRestore(t *testing.T) {
	echo := startEcho(t)
	p := newProxy(t, echo.ln.Addr().String())
	a, ra := dial(t, p.Addr())
	if err := roundTrip(t, a, ra, "before"); err != nil {
		t.Fatal(err)
	}

	p.Cut()
	_ = a.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := ra.ReadByte(); err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("read after Cut: %v, want a connection reset", err)
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.Want("connections the echo server saw end", echo.endedConns(), 1) })

	// A connection made while cut is accepted, and its bytes go nowhere.
	b, rb := dial(t, p.Addr())
	if _, err := b.Write([]byte("held\n")); err != nil {
		t.Fatal(err)
	}
	_ = b.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if _, err := rb.ReadByte(); err == nil {
		t.Fatal("a connection held while cut got an answer")
	} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("a held connection failed: %v", err)
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.Want("held connections", p.Held(), 1) })
	if n := p.Accepted(); n != 1 {
		t.Fatalf("Accepted while cut = %d, want 1", n)
	}

	// Restore forwards it: what it wrote while held arrives, and the echo
	// comes back.
	p.Restore()
	_ = b.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := rb.ReadString('\n')
	if err != nil || got != "held\n" {
		t.Fatalf("held connection after Restore: %q, %v", got, err)
	}
	if err := roundTrip(t, b, rb, "after"); err != nil {
		t.Fatal(err)
	}
	if n := p.Accepted(); n != 2 {
		t.Fatalf("Accepted after Restore = %d, want 2", n)
	}
}

func TestCloseEndsHeldConnections(t *testing.T) {
	echo := startEcho(t)
	p := newProxy(t, echo.ln.Addr().String())
	p.Cut()
	c, rc := dial(t, p.Addr())
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.Want("held connections", p.Held(), 1) })
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := rc.ReadByte(); err == nil {
		t.Fatal("a held connection outlived Close")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("a held connection was not closed by Close")
	}
	if n := echo.endedConns(); n != 0 || p.Accepted() != 0 {
		t.Fatalf("a held connection reached the target after Close (%d ended, %d accepted)", n, p.Accepted())
	}
}

// startNamed runs a server that answers every line it reads with its
// name, a colon and the line: which server a connection reached.
func startNamed(t *testing.T, name string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(name + ":" + line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	return ln.Addr().String()
}

// ask sends line through conn and returns the answer, without its newline.
func ask(t *testing.T, conn net.Conn, r *bufio.Reader, line string) string {
	t.Helper()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte(line + "\n")); err != nil {
		t.Fatal(err)
	}
	got, err := r.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	return got[:len(got)-1]
}

// SetTarget sends new connections to the new target, leaves open ones
// where they are, and applies to a connection held by a cut when it is
// restored; concurrent with dials, it is race-free (run under -race).
func TestSetTarget(t *testing.T) {
	one, two := startNamed(t, "one"), startNamed(t, "two")
	p := newProxy(t, one)
	if got := p.Target(); got != one {
		t.Fatalf("Target = %s, want %s", got, one)
	}
	a, ra := dial(t, p.Addr())
	if got := ask(t, a, ra, "a"); got != "one:a" {
		t.Fatalf("before SetTarget: %q, want one:a", got)
	}

	p.SetTarget(two)
	if got := p.Target(); got != two {
		t.Fatalf("Target = %s, want %s", got, two)
	}
	b, rb := dial(t, p.Addr())
	if got := ask(t, b, rb, "b"); got != "two:b" {
		t.Fatalf("a new connection after SetTarget: %q, want two:b", got)
	}
	if got := ask(t, a, ra, "a again"); got != "one:a again" {
		t.Fatalf("the open connection after SetTarget: %q, want one:a again", got)
	}
	if n, o := p.Accepted(), p.Open(); n != 2 || o != 2 {
		t.Fatalf("Accepted %d, Open %d; want 2 and 2", n, o)
	}

	// Held by a cut: it dials on Restore, to the target of then.
	p.Cut()
	c, rc := dial(t, p.Addr())
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.Want("held connections", p.Held(), 1) })
	p.SetTarget(one)
	p.Restore()
	if got := ask(t, c, rc, "c"); got != "one:c" {
		t.Fatalf("a held connection restored after SetTarget: %q, want one:c", got)
	}

	// Retargeting while connections are dialed.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if i%2 == 0 {
				p.SetTarget(two)
			} else {
				p.SetTarget(one)
			}
		}
	}()
	for i := 0; i < 20; i++ {
		d, rd := dial(t, p.Addr())
		if got := ask(t, d, rd, "d"); got != "one:d" && got != "two:d" {
			t.Fatalf("during retargeting: %q", got)
		}
		_ = d.Close()
	}
	close(stop)
	wg.Wait()
}

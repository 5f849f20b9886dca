// Package tcpproxy is a TCP proxy for tests: it listens on a loopback port,
// forwards every connection to one target, and lets the test cut the link.
//
// Cut drops every open connection at the TCP level, with a reset on both
// sides (the client and the target each see their connection fail, as when
// a network path dies and a middlebox resets it), and holds new
// connections until Restore: they are accepted but nothing reaches the
// target, as over a path that has not come back yet; Restore forwards
// them. Refuse is Cut that resets new connections instead of holding
// them. A test puts a Proxy between a client (a browser tab) and a server
// and cuts one client's link without touching the others.
//
// SetTarget points new connections at another server (the client's
// server went away, a load balancer now sends it elsewhere); the
// connections already forwarded stay with the server they reached.
package tcpproxy

import (
	"errors"
	"io"
	"net"
	"sync"
)

// Proxy forwards connections from its loopback listener to a target.
type Proxy struct {
	ln net.Listener

	mu       sync.Mutex
	target   string // where the next connection is dialed (SetTarget)
	cut      bool
	refuse   bool          // while cut: reset new connections, do not hold them
	restored chan struct{} // closed by Restore (and Close): held connections go on
	closed   bool
	pairs    map[*pair]struct{}
	accepted int // connections forwarded to the target, ever
	refused  int // connections reset on arrival while cut
	held     int // connections held while cut, ever

	wg sync.WaitGroup // the accept loop and every pair's copiers
}

// pair is one proxied connection: the client's side and the target's.
type pair struct {
	client, target net.Conn
	once           sync.Once
}

// New listens on 127.0.0.1:0 and forwards each accepted connection to
// target (host:port).
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{target: target, ln: ln, pairs: map[*pair]struct{}{}, restored: make(chan struct{})}
	close(p.restored)
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr is the proxy's listening address (127.0.0.1:port).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetTarget makes the connections that the proxy dials from now on go to
// target (host:port). Connections already forwarded are untouched; one
// held by a cut dials when the link is restored, so it goes to the
// target of that moment.
func (p *Proxy) SetTarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
}

// Target is the address that the next connection will be dialed to.
func (p *Proxy) Target() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.target
}

// Cut resets every open connection on both sides and holds new ones
// until Restore. It returns once every open connection is closed.
func (p *Proxy) Cut() { p.cutLink(false) }

// Refuse is Cut, except that a new connection is reset as soon as it is
// accepted, until Restore.
func (p *Proxy) Refuse() { p.cutLink(true) }

func (p *Proxy) cutLink(refuse bool) {
	p.mu.Lock()
	if !p.cut && !p.closed {
		p.restored = make(chan struct{})
	}
	p.cut, p.refuse = true, refuse
	pairs := p.take()
	p.mu.Unlock()
	for _, c := range pairs {
		c.reset()
	}
}

// Restore forwards new connections again, and the ones held since Cut.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut && !p.closed {
		close(p.restored)
	}
	p.cut, p.refuse = false, false
}

// Open is the number of connections being forwarded now.
func (p *Proxy) Open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pairs)
}

// Accepted is the number of connections forwarded to the target since
// New, closed ones included; connections refused or reset before they
// reached the target do not count.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// Refused is the number of connections reset on arrival (after Refuse).
func (p *Proxy) Refused() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refused
}

// Held is the number of connections that arrived while cut (after Cut)
// and were held, forwarded since or not.
func (p *Proxy) Held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held
}

// Close stops listening, resets every open connection and waits for the
// proxy's goroutines to end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.cut && !p.closed {
		close(p.restored) // held connections wake up, see closed and end
	}
	p.closed = true
	pairs := p.take()
	p.mu.Unlock()
	err := p.ln.Close()
	for _, c := range pairs {
		c.reset()
	}
	p.wg.Wait()
	return err
}

// take empties the set of open pairs and returns them; p.mu is held.
func (p *Proxy) take() []*pair {
	out := make([]*pair, 0, len(p.pairs))
	for c := range p.pairs {
		out = append(out, c)
	}
	clear(p.pairs)
	return out
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		conn, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue // a transient accept error: keep listening
		}
		p.mu.Lock()
		refuse := p.closed || (p.cut && p.refuse)
		hold := p.restored
		if refuse {
			p.refused++
		} else if p.cut {
			p.held++
		}
		p.mu.Unlock()
		if refuse {
			resetConn(conn)
			continue
		}
		p.wg.Add(1)
		go p.forward(conn, hold)
	}
}

// forward waits for hold to close (the link restored), dials the target
// for one accepted connection and copies both ways until either side
// ends or the pair is reset.
func (p *Proxy) forward(client net.Conn, hold <-chan struct{}) {
	defer p.wg.Done()
	<-hold // closed already unless the connection came while cut
	p.mu.Lock()
	closed, addr := p.closed, p.target
	p.mu.Unlock()
	if closed {
		resetConn(client)
		return
	}
	target, err := net.Dial("tcp", addr)
	if err != nil {
		resetConn(client)
		return
	}
	c := &pair{client: client, target: target}
	p.mu.Lock()
	if p.cut || p.closed { // cut again while this one was held or dialing
		p.mu.Unlock()
		c.reset()
		return
	}
	p.pairs[c] = struct{}{}
	p.accepted++
	p.mu.Unlock()

	var copiers sync.WaitGroup
	copiers.Add(2)
	go func() { defer copiers.Done(); pipe(target, client) }()
	go func() { defer copiers.Done(); pipe(client, target) }()
	copiers.Wait()
	p.mu.Lock()
	delete(p.pairs, c)
	p.mu.Unlock()
	c.close()
}

// pipe copies src to dst; at src's end it half-closes dst, so a clean
// close travels through the proxy as it would without it. An error on
// either side ends both directions.
func pipe(dst, src net.Conn) {
	_, err := io.Copy(dst, src)
	if err != nil {
		_ = src.Close()
		_ = dst.Close()
		return
	}
	if tc, ok := dst.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
		return
	}
	_ = dst.Close()
}

// reset closes both sides with a TCP reset.
func (c *pair) reset() {
	c.once.Do(func() {
		resetConn(c.client)
		resetConn(c.target)
	})
}

// close closes both sides normally (after both directions ended).
func (c *pair) close() {
	c.once.Do(func() {
		_ = c.client.Close()
		_ = c.target.Close()
	})
}

// resetConn closes conn so that the peer gets a RST, not a FIN.
func resetConn(conn net.Conn) {
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

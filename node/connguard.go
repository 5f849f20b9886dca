package node

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// connGuard keeps the server's plain HTTP connections (health checks,
// metrics scrapes, handshakes not yet upgraded) within a bound. Idle
// keep-alive connections cost a descriptor each; a flood of them would
// otherwise leave none for clients. Past the bound a new connection
// closes the one idle the longest, or else the oldest that never sent a
// request; if every one is busy with a request, the new one is closed.
// Upgraded connections leave it (they count against MaxConnections).
type connGuard struct {
	max int

	mu    sync.Mutex
	conns map[net.Conn]*guarded
}

type guarded struct {
	state http.ConnState
	since time.Time
}

func newConnGuard(max int) *connGuard {
	return &connGuard{max: max, conns: map[net.Conn]*guarded{}}
}

// ConnState is the http.Server hook: set Server.ConnState to the node's.
func (n *Node) ConnState(c net.Conn, s http.ConnState) { n.guard.track(c, s) }

func (g *connGuard) track(c net.Conn, s http.ConnState) {
	g.mu.Lock()
	switch s {
	case http.StateHijacked, http.StateClosed:
		delete(g.conns, c)
		g.mu.Unlock()
		return
	case http.StateNew:
		var evict net.Conn
		if len(g.conns) >= g.max {
			evict = g.victimLocked()
			if evict == nil {
				evict = c // every connection is busy with a request
			} else {
				delete(g.conns, evict)
			}
		}
		if evict != c {
			g.conns[c] = &guarded{state: s, since: time.Now()}
		}
		g.mu.Unlock()
		if evict != nil {
			_ = evict.Close()
		}
		return
	}
	if e := g.conns[c]; e != nil {
		e.state, e.since = s, time.Now()
	}
	g.mu.Unlock()
}

// victimLocked picks the connection to close for a new one: the longest
// idle, else the oldest that has not sent a request, else none.
func (g *connGuard) victimLocked() net.Conn {
	var idle, fresh net.Conn
	var idleAt, freshAt time.Time
	for c, e := range g.conns {
		switch e.state {
		case http.StateIdle:
			if idle == nil || e.since.Before(idleAt) {
				idle, idleAt = c, e.since
			}
		case http.StateNew:
			if fresh == nil || e.since.Before(freshAt) {
				fresh, freshAt = c, e.since
			}
		}
	}
	if idle != nil {
		return idle
	}
	return fresh
}

// open returns the connections tracked.
func (g *connGuard) open() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.conns)
}

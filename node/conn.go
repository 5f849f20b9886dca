package node

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/presence-dev/presence/internal/storm"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
)

// A connection's code is in three files: this one (its state and what it
// depends on), conn_io.go (the read loop, the write path and the close)
// and conn_verbs.go (the protocol's requests).

// conn is one client connection. The reader goroutine owns the fields
// marked so and makes every store call of the connection, one frame at a
// time. A writer goroutine runs only while there is something to write
// (an idle connection has none: at 15k connections a parked writer's
// stack is a quarter of the node's memory); at most one runs at a time,
// so it is the only data writer. Others only queue frames and request
// pings or a close, under mu.
//
// Kept small: at 15k connections per node every field costs. What a
// connection needs of the node is in its connDeps, shared by all.
type conn struct {
	d       *connDeps
	ws      *websocket.Conn
	user    string
	session string
	// expiry closes the connection when its token expires; nil in dev
	// mode. A refresh moves it.
	expiry *time.Timer

	// Reader goroutine only.
	grant   *identity // the latest token's; a refresh replaces it
	rooms   []string  // joined with a session
	follows []string  // joined without one ("present":false)
	watches []string  // watched
	tokens  float64
	last    int64    // monotonic ns of the last refill
	strikes refusals // the abuse rule (abuse.go)
	// deflate: permessage-deflate was negotiated; shared events frames
	// go out compressed. Set before the reader and writer start.
	deflate bool

	// keep: close without releasing sessions (drain, node close).
	keep atomic.Bool
	// wheel position, under wheel.mu.
	wslot, widx int32

	mu        sync.Mutex
	queue     []outFrame
	ping      bool // a ping is requested
	awaiting  bool // a ping is out and its pong deadline set
	closeCode int  // close frame to send; set once
	closeText string
	done      bool // the reader has exited; the writer stops
	writing   bool // a writer goroutine is running
}

// connDeps is what a connection needs of its node: one value per node,
// shared by its connections.
type connDeps struct {
	lim          Limits
	storeTimeout time.Duration
	global       bool // clients see the cross-region view (Config.Global)
	rooms        roomSet
	watches      watchSet
	sessions     sessionHolder
	tokens       tokenParser
	admission    *admission
	joins        *storm.Gate
	revoked      *revocations
	registry     connRegistry
	counts       *connCounts
	metrics      *metrics
	log          *slog.Logger
	// ctx carries the store calls made for clients; the node's Close
	// cancels it.
	ctx context.Context
	// wg counts readers, and writers while they run: Drain and Close
	// wait on it.
	wg   *sync.WaitGroup
	mono func() int64 // monotonic clock in nanoseconds
	// joined counts a room joined (metrics, Status).
	joined func()
}

// roomSet is what the hub offers a connection: membership of rooms, their
// snapshots and pages of their members.
type roomSet interface {
	// add makes c a (not yet live) member of room.
	add(ctx context.Context, room string, c *conn, in interest) error
	// remove takes c out of room.
	remove(room string, c *conn)
	// snapshot sends c the room's snapshot, answering ref, and makes it
	// live, kept at detail d from now on.
	snapshot(ctx context.Context, room string, c *conn, ref string, in interest) error
	// page reads one page of room's members, from where snapshots come,
	// at c's detail.
	page(ctx context.Context, room string, c *conn, offset, limit int) (presence.Snapshot, error)
}

// watchSet is what the watch lists offer a connection.
type watchSet interface {
	// watchUsers replaces c's watch of room by users (none: ends it) and
	// sends the watching reply; on error c no longer watches room.
	watchUsers(ctx context.Context, room string, c *conn, ref string, users []string) error
	// unwatch ends c's watch of room.
	unwatch(room string, c *conn)
}

// sessionHolder is what the session keeper offers a connection: holding
// its sessions, and writing their state.
type sessionHolder interface {
	hold(ctx context.Context, r presence.SessionRef, o owner) error
	unhold(ctx context.Context, r presence.SessionRef, o owner, release bool) (released bool, err error)
	setState(ctx context.Context, r presence.SessionRef, state json.RawMessage) error
}

// tokenParser checks a refreshed token.
type tokenParser interface {
	parse(raw string) (*identity, error)
}

// connRegistry is where open connections are registered (the ping
// wheel); an ending connection takes itself out.
type connRegistry interface {
	remove(c *conn)
}

var (
	_ roomSet       = (*hub)(nil)
	_ watchSet      = (*watches)(nil)
	_ sessionHolder = (*sessionKeeper)(nil)
	_ tokenParser   = (*authenticator)(nil)
	_ connRegistry  = (*wheel)(nil)
	_ owner         = (*conn)(nil)
)

// connCounts counts a node's connections.
type connCounts struct {
	active atomic.Int64 // handshakes and connections, against MaxConnections
	open   atomic.Int64 // upgraded connections
}

func newConn(d *connDeps, ws *websocket.Conn, id *identity, session string) *conn {
	return &conn{
		d: d, ws: ws, user: id.user, session: session, grant: id,
		tokens: float64(d.lim.FrameBurst), last: d.mono(),
		widx: -1,
	}
}

// armExpiry starts the token's timer. It runs once the connection is
// registered and before its reader starts, so a token that runs out at
// once cannot start a writer for a connection that is not counted.
func (c *conn) armExpiry() {
	if !c.grant.until.IsZero() {
		c.expiry = time.AfterFunc(time.Until(c.grant.until), c.expire)
	}
}

// sessionMoved closes a connection whose session another node has taken
// over: its client reconnected there. The sessions this connection still
// holds are released; the one that moved is the other node's, and the
// release leaves it alone.
func (c *conn) sessionMoved() {
	c.d.metrics.rejectedConns.WithLabelValues("moved").Inc()
	c.shutdown(protocol.CloseSessionMoved, "session moved to another connection", false)
}

// expire closes a connection whose token ran out. Its sessions are
// released, so a reconnect with a fresh token inside the grace announces
// nothing, and a user who is not let back in leaves after it.
func (c *conn) expire() {
	c.d.log.Info("node: token expired", "user", c.user, "session", c.session)
	c.shutdown(protocol.CloseTokenExpired, "token expired", false)
}

func (c *conn) ref(room string) presence.SessionRef {
	return presence.SessionRef{Room: room, User: c.user, Session: c.session}
}

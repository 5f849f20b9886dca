package client

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"golang.org/x/time/rate"

	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
)

// Config configures a client. URL is required; so is Token, except
// against a dev node with User.
type Config struct {
	// URL is the node: ws://, wss://, http:// or https://, with the path
	// protocol.PathWebSocket or none.
	URL string
	// Token returns the JWT to connect with; it is called for every
	// connect, so a source that caches must return a fresh token once the
	// last one nears its expiry.
	Token func(ctx context.Context) (string, error)
	// User names the user on a dev node without a token (?user=).
	User string
	// Session is the session id kept across reconnects; empty picks a
	// random one. Ids use A-Z a-z 0-9 - _ = @ + ~, at most 64 bytes.
	Session string
	// OnError is told of errors that no call returns: error frames
	// without a request, a refused rejoin or watch, failed reconnects
	// (once per kind until the next hello).
	OnError func(error)
	// OnDisconnect is told of every connection that ends, with why: a
	// *CloseError for a close frame of the node, else the read error.
	OnDisconnect func(error)
	// OnReconnect is told of every connection after the first, once its
	// hello came (rooms and watch lists are then being sent again).
	OnReconnect func(protocol.Hello)
	// Dialer dials the WebSocket; nil: websocket.DefaultDialer.
	Dialer *websocket.Dialer
}

// Callbacks must return soon, and must neither wait for the node (Join,
// SetState, Leave, Update) nor call Close, which waits for the goroutine
// that runs OnDisconnect: start a goroutine for that. A room's or a watch
// list's OnChange run one at a time, in the node's order, on the
// goroutine that reads the connection. OnDisconnect and OnReconnect run
// on the goroutine that reconnects; OnError on either, or on the one that
// rejoins after a reconnect, so it may run while an OnChange or another
// OnError runs.

// Client is a connection to a node that reconnects, with the same session
// id, until Close or a close that ends it (Err).
type Client struct {
	cfg     Config
	session string
	dial    func(ctx context.Context, url string, h http.Header) (*websocket.Conn, *http.Response, error)
	rnd     func() float64

	mu       sync.Mutex
	cur      *conn // the open connection; nil while down
	hello    protocol.Hello
	pending  map[string]chan result
	refs     uint64
	rooms    map[string]*Room
	watches  map[string]*Watch
	sched    schedule
	reported map[string]bool // error kinds reported since the last hello
	err      error           // why the client ended; nil while it runs

	ctx    context.Context // canceled by Close
	cancel context.CancelFunc
	quit   chan struct{} // closed by Close
	done   chan struct{} // closed when the client has ended
	once   sync.Once
}

// conn is one WebSocket connection, from its hello to its end.
type conn struct {
	ws     *websocket.Conn
	wmu    sync.Mutex // one writer at a time
	lim    *rate.Limiter
	opened time.Time
	end    chan struct{} // closed when the reader stops
	err    error         // why, set before end is closed
}

type result struct {
	f   protocol.Frame
	err error
}

// Dial connects and waits for the node's hello. A refusal of this first
// connect is returned (a *HandshakeError, *TokenError or *CloseError);
// after it the client reconnects on its own.
func Dial(ctx context.Context, cfg Config) (*Client, error) {
	c, err := newClient(cfg)
	if err != nil {
		return nil, err
	}
	cn, err := c.connect(ctx)
	if err != nil {
		return nil, err
	}
	go c.supervise(cn)
	return c, nil
}

func newClient(cfg Config) (*Client, error) {
	if _, err := wsURL(cfg.URL); err != nil {
		return nil, err
	}
	if cfg.Session == "" {
		cfg.Session = rand.Text() // base32: within the id alphabet
	}
	if err := presence.ValidateSession(cfg.Session); err != nil {
		return nil, fmt.Errorf("presence client: session: %w", err)
	}
	d := cfg.Dialer
	if d == nil {
		d = websocket.DefaultDialer
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Client{
		ctx: ctx, cancel: cancel, cfg: cfg, session: cfg.Session, dial: d.DialContext, rnd: mrand.Float64,
		pending: map[string]chan result{}, rooms: map[string]*Room{}, watches: map[string]*Watch{},
		reported: map[string]bool{}, quit: make(chan struct{}), done: make(chan struct{}),
	}, nil
}

func wsURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("presence client: URL: %w", err)
	}
	switch u.Scheme {
	case "http":
		u.Scheme = "ws"
	case "https":
		u.Scheme = "wss"
	case "ws", "wss":
	default:
		return nil, fmt.Errorf("presence client: URL %q: want ws, wss, http or https", raw)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = protocol.PathWebSocket
	}
	return u, nil
}

// Session is the session id the client keeps across reconnects.
func (c *Client) Session() string { return c.session }

// Hello is the last connection's hello: the user, region and limits.
func (c *Client) Hello() protocol.Hello {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hello
}

// Done is closed once the client has ended: after Close, or a close of
// the node that ends it (see Err).
func (c *Client) Done() <-chan struct{} { return c.done }

// Err is why the client ended: ErrClosed after Close, or a *CloseError
// (protocol.CloseSessionMoved: a newer connection holds the session;
// protocol.CloseRevoked: not before RevokedUntil). Nil while it runs.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close closes the connection (the node releases the session: its
// members see it leave once the offline grace has passed) and stops
// reconnecting. It waits for the client to end.
func (c *Client) Close() error {
	c.once.Do(func() { close(c.quit); c.cancel() })
	<-c.done
	return nil
}

// connect dials, reads the hello and starts the connection's reader.
func (c *Client) connect(ctx context.Context) (*conn, error) {
	h := http.Header{}
	if c.cfg.Token != nil {
		tok, err := c.cfg.Token(ctx)
		if err != nil {
			return nil, &TokenError{err}
		}
		h.Set("Authorization", "Bearer "+strings.TrimSpace(tok))
	}
	u, _ := wsURL(c.cfg.URL) // checked by newClient
	q := u.Query()
	q.Set(protocol.SessionQueryParam, c.session)
	if c.cfg.User != "" {
		q.Set(protocol.UserQueryParam, c.cfg.User)
	}
	u.RawQuery = q.Encode()
	ws, resp, err := c.dial(ctx, u.String(), h)
	if err != nil {
		if resp != nil {
			defer func() { _ = resp.Body.Close() }()
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			return nil, &HandshakeError{Status: resp.StatusCode, Message: strings.TrimSpace(string(body))}
		}
		return nil, fmt.Errorf("presence client: dial: %w", err)
	}
	hello, err := readHello(ctx, ws)
	if err != nil {
		_ = ws.Close()
		return nil, err
	}
	return c.opened(ws, hello), nil
}

// readHello reads the first frame, which must be a hello of version 1.
func readHello(ctx context.Context, ws *websocket.Conn) (protocol.Hello, error) {
	deadline := time.Now().Add(15 * time.Second)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = ws.SetReadDeadline(deadline)
	var h protocol.Hello
	_, data, err := ws.ReadMessage()
	if err != nil {
		if ce := closeErrorOf(err); ce != nil {
			return h, ce // 4401, 4004: refused at once
		}
		return h, fmt.Errorf("presence client: reading hello: %w", err)
	}
	if err := json.Unmarshal(data, &h); err != nil || h.Type != protocol.TypeHello {
		return h, fmt.Errorf("presence client: first frame is not a hello: %.100s", data)
	}
	if h.V != protocol.Version {
		return h, fmt.Errorf("presence client: the node speaks protocol version %d, this client %d", h.V, protocol.Version)
	}
	return h, nil
}

// opened makes ws, after its hello, the client's connection.
func (c *Client) opened(ws *websocket.Conn, h protocol.Hello) *conn {
	// A little under the node's bucket: frames sent evenly can still
	// arrive bunched.
	r, burst := h.Limits.FrameRate*0.9, max(1, h.Limits.FrameBurst-2)
	if r <= 0 {
		r = 9
	}
	cn := &conn{ws: ws, lim: rate.NewLimiter(rate.Limit(r), burst), opened: time.Now(), end: make(chan struct{})}
	// A connection the node no longer pings is dead: the read deadline
	// is two ping intervals, pushed back by every frame and ping.
	alive := 2*time.Duration(h.Limits.PingIntervalMS)*time.Millisecond + 5*time.Second
	_ = ws.SetReadDeadline(time.Now().Add(alive))
	ws.SetPingHandler(func(data string) error {
		_ = ws.SetReadDeadline(time.Now().Add(alive))
		err := ws.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(5*time.Second))
		if errors.Is(err, websocket.ErrCloseSent) {
			return nil
		}
		return err
	})
	c.mu.Lock()
	c.cur, c.hello = cn, h
	c.sched.grace = time.Duration(h.OfflineGraceMS) * time.Millisecond
	clear(c.reported)
	c.mu.Unlock()
	go c.read(cn, alive)
	return cn
}

func (c *Client) read(cn *conn, alive time.Duration) {
	for {
		_, data, err := cn.ws.ReadMessage()
		if err != nil {
			cn.err = err
			close(cn.end)
			return
		}
		_ = cn.ws.SetReadDeadline(time.Now().Add(alive))
		c.handle(data)
	}
}

// report hands err to OnError; with a kind, only the first of that kind
// since the last hello.
func (c *Client) report(kind string, err error) {
	c.mu.Lock()
	seen := kind != "" && c.reported[kind]
	if kind != "" {
		c.reported[kind] = true
	}
	c.mu.Unlock()
	if !seen && c.cfg.OnError != nil {
		c.cfg.OnError(err)
	}
}

// ended reports whether the client has stopped.
func (c *Client) ended() bool {
	select {
	case <-c.quit:
		return true
	case <-c.done:
		return true
	default:
		return false
	}
}

package bigroom

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/cmd/presence-load/internal/churn"
	"github.com/presence-dev/presence/cmd/presence-load/internal/load"
	"github.com/presence-dev/presence/cmd/presence-load/internal/worker"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
)

// The big-room scenarios hold more WebSockets than one process may open
// (20,000 files), so the connections live in worker processes
// (`presence-load bigroom-worker`, started by the bigroom mode as `latency
// --hog` starts its hog). A worker opens the connections it is asked to,
// reads every frame of each, and answers requests on stdin with one JSON
// line each on stdout: open, mark, stats, report, check, close.

// Roles of a worker's connections.
const (
	roleMember = "member" // a member of the room, joined with "batch":true; sampled ones fold their view
	rolePop    = "pop"    // a member joined with "view":"count" (the population on the second node)
	roleCount  = "count"  // a watcher of the count, "view":"count","present":false
	roleWatch  = "watch"  // a `watch` of a list of users of the room
)

// openSpec asks a worker to open connections From..To-1 of one role, user
// Prefix+i, each with session "s".
type openSpec struct {
	Role    string `json:"role"`
	Addr    string `json:"addr"`
	Secret  string `json:"secret"`
	Sources string `json:"sources"`
	Deflate bool   `json:"deflate,omitempty"`
	// ReadBuffer is each WebSocket's read buffer (0: the dialer's 512).
	ReadBuffer int `json:"read_buffer,omitempty"`
	// Lowat, above 1, makes connections that do not parse their frames
	// read them in batches of about that many bytes (lazyread.go).
	Lowat    int        `json:"lowat,omitempty"`
	Room     string     `json:"room"`
	Prefix   string     `json:"prefix"`
	From     int        `json:"from"`
	To       int        `json:"to"`
	Sample   []int      `json:"sample,omitempty"` // members that fold their view and time events
	Inflight int        `json:"inflight"`
	Users    [][]string `json:"users,omitempty"` // watch: the list of connection From+k at k
	// Arrivals are timed for users ChurnPrefix+i, i < ChurnN, in µs since
	// BaseUS (Unix µs).
	ChurnPrefix string `json:"churn_prefix"`
	ChurnN      int    `json:"churn_n"`
	BaseUS      int64  `json:"base_us"`
}

type openResp struct {
	load.Tally
	TickMS []int  `json:"tick_ms"` // distinct tick_ms seen in hello (0: absent)
	Reply  string `json:"reply,omitempty"`
	// Retried counts joins sent again after an unavailable's
	// retry_after_ms, as a client does (the node's join limiter).
	Retried int `json:"retried,omitempty"`
}

// statsResp is what a worker's connections saw since the last mark.
type statsResp struct {
	Frames  []int64          `json:"frames"` // per connection (-1: never opened), in open order
	Types   map[string]int64 `json:"types"`
	Resyncs int64            `json:"resyncs"` // resync snapshots or watching frames, all connections
	Errors  map[string]int   `json:"errors"`  // error frames by code
	Closed  map[string]int   `json:"closed"`  // connections that ended, by close code or error
	Anom    anomalies        `json:"anom"`
	MinSeq  uint64           `json:"min_seq"` // lowest room seq a folding or counting connection has reached
	MaxSeq  uint64           `json:"max_seq"`
}

// anomalies of the folding, counting and watching connections.
type anomalies struct {
	Dups       int      `json:"dups"`         // events at or below the last seq applied
	Gaps       int      `json:"gaps"`         // gaps in the room's seq
	Missing    int      `json:"missing"`      // events missing in those gaps
	EpochErrs  int      `json:"epoch_errs"`   // events of another epoch without a resync
	PageSlips  int      `json:"page_slips"`   // members pages asked again after a slip
	Foreign    int      `json:"foreign"`      // watch: events of users not watched
	CountBack  int      `json:"count_back"`   // count: a count frame whose room_seq did not grow
	CountNoSeq int      `json:"count_no_seq"` // count: frames without room_seq (PROTOCOL.md "Counts" gives none: counted, not a violation)
	Bad        int      `json:"bad"`          // frames that did not parse or did not fit the role
	Examples   []string `json:"examples,omitempty"`
}

func (a *anomalies) add(b anomalies) {
	a.Dups += b.Dups
	a.Gaps += b.Gaps
	a.Missing += b.Missing
	a.EpochErrs += b.EpochErrs
	a.PageSlips += b.PageSlips
	a.Foreign += b.Foreign
	a.CountBack += b.CountBack
	a.CountNoSeq += b.CountNoSeq
	a.Bad += b.Bad
	for _, e := range b.Examples {
		if len(a.Examples) < 8 {
			a.Examples = append(a.Examples, e)
		}
	}
}

func (a anomalies) String() string {
	s := fmt.Sprintf("repeated/out-of-order %d, seq gaps %d (%d events missing), epoch without resync %d, page re-reads %d, foreign %d, count going back %d, count without room_seq %d, bad frames %d",
		a.Dups, a.Gaps, a.Missing, a.EpochErrs, a.PageSlips, a.Foreign, a.CountBack, a.CountNoSeq, a.Bad)
	if len(a.Examples) > 0 {
		s += "; e.g. " + strings.Join(a.Examples, " | ")
	}
	return s
}

func (a anomalies) protocolBroken() bool {
	return a.Dups+a.Gaps+a.EpochErrs+a.Foreign+a.CountBack+a.Bad > 0
}

// inSkip reports whether seq came inside one of the resyncs.
func inSkip(skips [][2]uint64, seq uint64) bool {
	for _, s := range skips {
		if seq > s[0] && seq <= s[1] {
			return true
		}
	}
	return false
}

// checkReq is the truth after quiescence.
type checkReq struct {
	View  view    `json:"view,omitempty"`
	Total int     `json:"total"`
	Seq   uint64  `json:"seq"`
	Epoch int64   `json:"epoch"`
	Trans []trans `json:"trans,omitempty"` // watch: every transition of the room
}

// trans is one transition as NATS carried it.
type trans struct {
	User     string `json:"u"`
	Kind     string `json:"k"`
	Seq      uint64 `json:"s"`
	InWindow bool   `json:"w,omitempty"`
}

type checkResp struct {
	Checked  int      `json:"checked"`
	Wrong    int      `json:"wrong"`
	Behind   int      `json:"behind"` // folded to an older seq than the truth's
	Lost     int      `json:"lost"`   // connections the node dropped: not compared
	Examples []string `json:"examples,omitempty"`
	Expected []int64  `json:"expected,omitempty"` // watch: transitions of each connection's users in the window
}

// bigWorker holds the connections of one worker process.
type bigWorker struct {
	mu     sync.Mutex
	conns  []*bconn // in open order; nil where one failed
	types  typeCounts
	mark   map[string]int64
	closed map[string]int
	errs   map[string]int
	lazy   lazyReaders // connections that read their frames in batches (lazyread.go)
}

type typeCounts struct {
	mu sync.Mutex
	m  map[string]int64
}

func (t *typeCounts) inc(k string) {
	t.mu.Lock()
	t.m[k]++
	t.mu.Unlock()
}

func (t *typeCounts) snapshot() map[string]int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := make(map[string]int64, len(t.m))
	for k, v := range t.m {
		m[k] = v
	}
	return m
}

func newBigWorker() *bigWorker {
	return &bigWorker{types: typeCounts{m: map[string]int64{}}, closed: map[string]int{}, errs: map[string]int{}}
}

// bconn is one connection of a worker.
type bconn struct {
	w    *bigWorker
	spec *openSpec
	user string
	load.Conn
	parse  bool // read and parse every frame (folding, counting, watching)
	frames atomic.Int64
	mark   int64
	resync atomic.Int64

	mu       sync.Mutex // guards the rest
	fold     *folder
	on, off  []int64 // arrival µs since base per churner index; on -1: replaced by a resync
	count    int
	countSeq uint64
	epoch    int64
	recv     []entry // watch: events since the last watching frame
	baseSeq  uint64  // watch: the watching frame's room_seq
	users    map[string]bool
	skips    [][2]uint64 // (seq before, room_seq) of each resync: events in between came inside it
	lost     bool        // the connection ended before the run closed it
	anom     anomalies
	tokens   float64 // page requests: a token bucket under the node's frame rate
	tokenAt  time.Time
}

func (c *bconn) bad(format string, args ...any) {
	c.anom.Bad++
	if len(c.anom.Examples) < 3 {
		c.anom.Examples = append(c.anom.Examples, c.user+": "+fmt.Sprintf(format, args...))
	}
}

func (c *bconn) example(format string, args ...any) {
	if len(c.anom.Examples) < 3 {
		c.anom.Examples = append(c.anom.Examples, c.user+": "+fmt.Sprintf(format, args...))
	}
}

// ops are the requests a worker answers (package worker's protocol).
func (w *bigWorker) ops() map[string]worker.Op {
	return map[string]worker.Op{
		"open":         worker.Handle(func(ctx context.Context, spec openSpec) (any, error) { return w.open(ctx, &spec) }),
		"mark":         worker.Do(w.doMark),
		"stats":        func(context.Context, json.RawMessage) (any, error) { return w.stats(), nil },
		"report":       worker.Handle(func(_ context.Context, r churn.Sent) (any, error) { return w.report(&r), nil }),
		"check":        worker.Handle(func(_ context.Context, t checkReq) (any, error) { return w.check(&t), nil }),
		worker.OpClose: worker.Do(w.closeAll),
	}
}

// open opens and joins (or watches with) spec's connections, Inflight at
// a time, and starts reading each.
func (w *bigWorker) open(ctx context.Context, spec *openSpec) (openResp, error) {
	if spec == nil || spec.To < spec.From {
		return openResp{}, errors.New("open: bad spec")
	}
	o := load.Options{Addr: spec.Addr, Secret: spec.Secret, Sources: spec.Sources, Insecure: spec.Secret == "", Deflate: spec.Deflate, ReadBuffer: spec.ReadBuffer}
	d, err := load.NewDialer(o)
	if err != nil {
		return openResp{}, err
	}
	n := spec.To - spec.From
	conns := make([]*bconn, n)
	sample := map[int]bool{}
	for _, i := range spec.Sample {
		sample[i] = true
	}
	var mu sync.Mutex // guards resp's extras and ticks
	var resp openResp
	ticks := map[int]bool{}
	resp.Tally = load.OpenEach(ctx, n, spec.Inflight, func(k int) error {
		i := spec.From + k
		c := &bconn{w: w, spec: spec, user: spec.Prefix + strconv.Itoa(i)}
		switch spec.Role {
		case roleMember:
			c.parse = sample[i]
		case roleCount, roleWatch:
			c.parse = true
		}
		if c.parse && spec.ChurnN > 0 && spec.Role != roleCount {
			c.on, c.off = make([]int64, spec.ChurnN), make([]int64, spec.ChurnN)
		}
		var users []string
		if spec.Role == roleWatch && k < len(spec.Users) {
			users = spec.Users[k]
		}
		tick, reply, retried, err := c.open(ctx, d, users)
		mu.Lock()
		defer mu.Unlock()
		resp.Retried += retried
		if err != nil {
			return err
		}
		ticks[tick] = true
		if resp.Reply == "" {
			resp.Reply = reply
		}
		conns[k] = c
		return nil
	})
	for t := range ticks {
		resp.TickMS = append(resp.TickMS, t)
	}
	slices.Sort(resp.TickMS)
	w.mu.Lock()
	w.conns = append(w.conns, conns...)
	w.mu.Unlock()
	return resp, ctx.Err()
}

// again sends a join or watch (req) again after its refusal (frame, an
// error frame) if the refusal is an unavailable with a retry hint and
// retried is under openRetries; otherwise it returns the refusal.
func (c *bconn) again(ctx context.Context, frame, req []byte, retried int) error {
	var f protocol.Error
	if json.Unmarshal(frame, &f) != nil {
		return fmt.Errorf("unreadable error frame %.100s", frame)
	}
	if f.Code != protocol.CodeUnavailable || f.RetryAfterMS <= 0 || retried >= openRetries {
		return &load.Refusal{Code: string(f.Code), Msg: f.Message}
	}
	select {
	case <-time.After(time.Duration(f.RetryAfterMS) * time.Millisecond):
	case <-ctx.Done():
		return ctx.Err()
	}
	return c.Send(req)
}

// openRetries is how many times a join or watch is sent again after an
// unavailable.
const openRetries = 20

// open dials, reads the hello, sends the role's request and reads until
// its reply, sending it again after each unavailable's retry_after_ms
// (openRetries times); then reading goes on in its own goroutine. It
// returns the hello's tick_ms, the reply's type and the retries.
func (c *bconn) open(ctx context.Context, d *load.Dialer, users []string) (int, string, int, error) {
	spec := c.spec
	ws, err := d.DialToken(ctx, c.user, "s", spec.Role == roleCount)
	if err != nil {
		return 0, "", 0, err
	}
	c.WS = ws
	retried := 0
	fail := func(err error) (int, string, int, error) { ws.Close(); return 0, "", retried, err }
	_ = ws.SetReadDeadline(time.Now().Add(60 * time.Second))
	_, data, err := ws.ReadMessage()
	if err != nil {
		return fail(err)
	}
	var hello protocol.Hello
	if json.Unmarshal(data, &hello) != nil || hello.Type != protocol.TypeHello {
		return fail(fmt.Errorf("first frame is not a hello: %.100s", data))
	}
	req := protocol.Request{Type: protocol.TypeJoin, Room: spec.Room, Ref: "j"}
	switch spec.Role {
	case roleMember:
		req.Batch = true
	case rolePop:
		req.View = protocol.ViewCount
	case roleCount:
		req.View, req.Present = protocol.ViewCount, load.Ptr(false)
	case roleWatch:
		req.Type, req.Users = protocol.TypeWatch, &users
		c.users = map[string]bool{}
		for _, x := range users {
			c.users[x] = true
		}
	default:
		return fail(fmt.Errorf("unknown role %q", spec.Role))
	}
	if c.parse && spec.Role != roleCount {
		c.fold = newFolder()
		if spec.Role == roleWatch {
			c.fold.filter = c.users
		}
	}
	frame := load.Encode(req)
	if err := c.Send(frame); err != nil {
		return fail(err)
	}
	for {
		typ, ref, data, err := c.readReply()
		if err != nil {
			return fail(err)
		}
		if ref != "j" {
			continue // a frame before the reply (none is expected)
		}
		if typ == "error" {
			if err := c.again(ctx, data, frame, retried); err != nil {
				return fail(err)
			}
			retried++
			continue
		}
		_ = ws.SetReadDeadline(time.Time{})
		if c.parse {
			c.mu.Lock()
			c.handle(data, time.Now())
			c.mu.Unlock()
		}
		if !c.parse && spec.Lowat > 1 {
			if err := c.w.lazy.add(ws.NetConn(), spec.Lowat); err != nil {
				return fail(fmt.Errorf("lazy reading: %w", err))
			}
		}
		go c.readLoop()
		return int(hello.Limits.TickMS), typ, retried, nil
	}
}

// readReply reads one frame of a join or watch's wait for its reply: its
// type and ref, from its head, where the node writes them. A member that
// does not parse its frames reads the rest of a snapshot off the socket
// without decoding it: a joiner's snapshot is up to 1,000 members, and
// decoding every one of them in the fill took a third of a core from the
// machine the node is measured on. Errors, and every frame of a parsing
// connection, are read whole (data).
func (c *bconn) readReply() (typ, ref string, data []byte, err error) {
	_, r, err := c.WS.NextReader()
	if err != nil {
		return "", "", nil, err
	}
	head := make([]byte, 512)
	n, err := io.ReadFull(r, head)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return "", "", nil, err
	}
	head = head[:n]
	typ, ref = frameKind(head), headField(head, "ref")
	if typ == "" {
		return "", "", nil, fmt.Errorf("unreadable frame %.100s", head)
	}
	if c.parse || typ == "error" || ref == "" {
		rest, err := io.ReadAll(r)
		if err != nil {
			return "", "", nil, err
		}
		data = append(head, rest...)
		if ref == "" {
			// The head did not hold it: decode the frame for it.
			var f struct {
				Ref string `json:"ref"`
			}
			if json.Unmarshal(data, &f) != nil {
				return "", "", nil, fmt.Errorf("unreadable frame %.100s", data)
			}
			ref = f.Ref
		}
	}
	return typ, ref, data, nil
}

// readLoop reads every frame until the connection ends. Connections that
// do not parse look only at a frame's first bytes, to count it by type.
// Raw frames, not package client: the worker counts frames per tick and
// times events as they come off the socket, checks the protocol's
// ordering rules itself (fold.go), and most of its 15,000 connections
// must not decode what they read at all.
func (c *bconn) readLoop() {
	var buf bytes.Buffer
	head := make([]byte, 24)
	for {
		_, r, err := c.WS.NextReader()
		if err != nil {
			if !c.Ending() {
				c.w.gone(load.CloseReason(err))
				c.mu.Lock()
				c.lost = true
				c.mu.Unlock()
			}
			return
		}
		at := time.Now()
		c.frames.Add(1)
		if c.parse {
			buf.Reset()
			if _, err := buf.ReadFrom(r); err != nil {
				continue
			}
			c.mu.Lock()
			c.handle(buf.Bytes(), at)
			c.mu.Unlock()
			continue
		}
		// A compressed frame (its reader inflates, and closes) is an
		// events frame: the node compresses no other. It is read off the
		// socket whole but inflated only one time in 64, to check that:
		// inflating every one is the browser's work, on its own machine,
		// and here it would take the cores the node is measured on.
		if _, deflated := r.(io.Closer); deflated && c.frames.Load()%64 != 0 {
			c.w.types.inc("events")
			continue
		}
		n, _ := io.ReadFull(r, head)
		kind := frameKind(head[:n])
		switch kind {
		case "snapshot":
			// Only its reason matters here, and it comes before the
			// members: the rest is read off the socket, not parsed.
			more := make([]byte, 512)
			m, _ := io.ReadFull(r, more)
			c.snapshotSeen(snapshotReason(append(head[:n:n], more[:m]...)))
		case "error", "":
			buf.Reset()
			buf.Write(head[:n])
			_, _ = buf.ReadFrom(r)
			c.unparsed(kind, buf.Bytes())
		default:
			// The next NextReader reads the rest off the socket without
			// copying it out, or inflating it: a browser would inflate
			// it, on its own machine.
			c.w.types.inc(kind)
		}
	}
}

// headField is a string field of a frame's head (its first 256 bytes),
// where the node writes a snapshot's ref and reason before its members:
// read without decoding 100 KB of them.
func headField(frame []byte, name string) string {
	head := string(frame[:min(len(frame), 256)])
	key := `"` + name + `":"`
	i := strings.Index(head, key)
	if i < 0 {
		return ""
	}
	v := head[i+len(key):]
	j := strings.IndexByte(v, '"')
	if j < 0 {
		return ""
	}
	return v[:j]
}

// snapshotReason is the reason in a snapshot frame's head, where the node
// writes it (ahead of the members); "" if the head does not hold it.
func snapshotReason(head []byte) string { return headField(head, "reason") }

// snapshotSeen counts a snapshot a non-parsing connection got.
func (c *bconn) snapshotSeen(reason string) {
	switch reason {
	case "resync":
		c.resync.Add(1)
		c.w.types.inc("snapshot/resync")
	case "":
		c.w.types.inc("unparsable")
	default:
		c.w.types.inc("snapshot")
	}
}

// unparsed handles the rare frames a non-parsing connection looks into.
func (c *bconn) unparsed(kind string, data []byte) {
	var f protocol.Frame
	if json.Unmarshal(data, &f) != nil {
		c.w.types.inc("unparsable")
		return
	}
	switch {
	case f.Type == "snapshot" && f.Reason == "resync":
		c.resync.Add(1)
		c.w.types.inc("snapshot/resync")
	case f.Type == "error":
		c.w.types.inc("error")
		c.w.errored(string(f.Code))
	default:
		c.w.types.inc(f.Type)
	}
}

func (w *bigWorker) gone(why string) {
	w.mu.Lock()
	w.closed[why]++
	w.mu.Unlock()
}

func (w *bigWorker) errored(code string) {
	w.mu.Lock()
	w.errs[code]++
	w.mu.Unlock()
}

// pframe is a frame a parsing connection reads: any frame, and a
// room_seq, which no count frame should carry (its absence is counted).
type pframe struct {
	protocol.Frame
	RoomSeq uint64 `json:"room_seq"`
}

// onSnapshot applies a snapshot or watching frame (a join's, a watch's
// or a resync).
func (c *bconn) onSnapshot(f pframe) {
	if f.Snapshot == nil {
		if f.Type == "watching" && c.fold != nil { // "users":[] (not sent by this tool)
			return
		}
		c.bad("%s without a snapshot", f.Type)
		return
	}
	if c.fold == nil || (f.Type == "watching") != (c.spec.Role == roleWatch) {
		c.bad("unexpected %s (reason %s) for role %s", f.Type, f.Reason, c.spec.Role)
		return
	}
	resync := f.Reason == "resync"
	if resync {
		c.resync.Add(1)
		if c.fold.ready {
			c.skips = append(c.skips, [2]uint64{c.fold.seq, f.Snapshot.RoomSeq})
		}
		// The onlines of churners it lists that were not seen as
		// events never will be.
		for _, m := range f.Snapshot.Members {
			if i, ok := c.churnIndex(m.User); ok && c.on[i] == 0 {
				c.on[i] = -1
			}
		}
	}
	if c.spec.Role == roleWatch {
		c.recv = c.recv[:0]
		c.baseSeq = f.Snapshot.RoomSeq
	}
	if c.fold.snapshot(f.Snapshot, resync) {
		c.askPage()
	}
}

// onCount applies a count frame.
func (c *bconn) onCount(f pframe) {
	if c.spec.Role != roleCount && c.spec.Role != rolePop {
		c.bad("unexpected count frame")
		return
	}
	if f.Count == nil {
		c.bad("count frame without count")
		return
	}
	if f.RoomSeq == 0 {
		c.anom.CountNoSeq++ // counts are whole and carry no room_seq
	}
	if f.Epoch == c.epoch && f.RoomSeq <= c.countSeq && f.Reason != "resync" && c.countSeq > 0 {
		c.anom.CountBack++
		c.example("count frame at room_seq %d after %d", f.RoomSeq, c.countSeq)
	}
	if f.Reason == "resync" {
		c.resync.Add(1)
	}
	c.count, c.countSeq, c.epoch = *f.Count, f.RoomSeq, f.Epoch
}

// handle applies one frame of a parsing connection (c.mu held).
func (c *bconn) handle(data []byte, at time.Time) {
	kind := frameKind(data)
	if kind == "events" {
		c.w.types.inc(kind)
		f, es, err := parseEvents(data)
		if err != nil {
			c.bad("events frame: %v", err)
			return
		}
		for _, e := range es {
			c.applyEvent(f.Epoch, e, at)
		}
		return
	}
	var f pframe
	if err := json.Unmarshal(data, &f); err != nil {
		c.bad("unreadable frame: %v", err)
		return
	}
	typ := f.Type
	if f.Type == "snapshot" && f.Reason == "resync" || f.Type == "watching" && f.Reason == "resync" {
		typ += "/resync"
	}
	c.w.types.inc(typ)
	switch f.Type {
	case "event":
		t, err := bus.DecodeEvent(f.Event)
		if err != nil {
			c.bad("event: %v", err)
			return
		}
		c.applyEvent(t.Epoch, entryOf(t), at)
	case "snapshot", "watching":
		c.onSnapshot(f)
	case "members":
		if c.fold == nil || f.Snapshot == nil {
			c.bad("unexpected members page")
			return
		}
		gen, err := strconv.Atoi(strings.TrimPrefix(f.Ref, "p"))
		if err != nil {
			c.bad("members page with ref %q", f.Ref)
			return
		}
		if c.fold.page(gen, f.Snapshot) {
			c.askPage()
		}
	case "count":
		c.onCount(f)
	case "error":
		c.w.errored(string(f.Code))
		if f.Code == protocol.CodeRateLimited && c.fold != nil && c.fold.paging {
			// A page request was dropped: ask again later.
			gen := c.fold.gen
			time.AfterFunc(1500*time.Millisecond, func() {
				c.mu.Lock()
				defer c.mu.Unlock()
				if c.fold.gen == gen && c.fold.paging {
					c.sendPage()
				}
			})
		}
	case "left", "pong":
	default:
		c.bad("unexpected frame type %q", f.Type)
	}
}

func (c *bconn) churnIndex(user string) (int, bool) {
	if c.on == nil || !strings.HasPrefix(user, c.spec.ChurnPrefix) {
		return 0, false
	}
	i, err := strconv.Atoi(user[len(c.spec.ChurnPrefix):])
	if err != nil || i < 0 || i >= len(c.on) {
		return 0, false
	}
	return i, true
}

func (c *bconn) applyEvent(epoch int64, e entry, at time.Time) {
	if c.fold == nil {
		c.bad("unexpected event for role %s", c.spec.Role)
		return
	}
	if c.users != nil {
		if !c.users[e.User] {
			c.anom.Foreign++
			c.example("event of unwatched user %s", e.User)
			return
		}
		c.recv = append(c.recv, e)
	}
	d0, g0, e0, s0 := c.fold.dups, c.fold.gaps, c.fold.epochErrs, c.fold.seq
	c.fold.apply(epoch, e)
	if c.fold.dups != d0 || c.fold.gaps != g0 || c.fold.epochErrs != e0 {
		c.example("event %d %s %s (epoch %d) after seq %d", e.Seq, e.Kind, e.User, epoch, s0)
	}
	if i, ok := c.churnIndex(e.User); ok {
		us := at.UnixMicro() - c.spec.BaseUS
		switch e.Kind {
		case presence.Online:
			if c.on[i] == 0 {
				c.on[i] = us
			}
		case presence.Offline:
			if c.off[i] == 0 {
				c.off[i] = us
			}
		}
	}
}

// askPage sends the next members request, under a token bucket of 8/s
// (burst 15) that keeps it below the node's frame rate (10/s, burst 20).
func (c *bconn) askPage() {
	now := time.Now()
	if c.tokenAt.IsZero() {
		c.tokens = 15
	} else {
		c.tokens = min(15, c.tokens+now.Sub(c.tokenAt).Seconds()*8)
	}
	c.tokenAt = now
	if c.tokens >= 1 {
		c.tokens--
		c.sendPage()
		return
	}
	wait := time.Duration((1 - c.tokens) / 8 * float64(time.Second))
	gen := c.fold.gen
	time.AfterFunc(wait, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.fold.gen == gen && c.fold.paging {
			c.askPage()
		}
	})
}

func (c *bconn) sendPage() {
	req := load.Encode(protocol.Request{Type: protocol.TypeMembers, Room: c.spec.Room, Offset: load.Ptr(c.fold.nextOff), Limit: load.Ptr(pageLimit), Ref: "p" + strconv.Itoa(c.fold.gen)})
	go func() { _ = c.Send(req) }()
}

func (w *bigWorker) each(f func(c *bconn)) {
	w.mu.Lock()
	conns := slices.Clone(w.conns)
	w.mu.Unlock()
	for _, c := range conns {
		if c != nil {
			f(c)
		}
	}
}

func (w *bigWorker) doMark() {
	w.each(func(c *bconn) { c.mark = c.frames.Load() })
	w.mu.Lock()
	w.mark = w.types.snapshot()
	w.mu.Unlock()
}

func (w *bigWorker) stats() statsResp {
	w.mu.Lock()
	conns := slices.Clone(w.conns)
	mark := w.mark
	s := statsResp{Types: map[string]int64{}, Errors: map[string]int{}, Closed: map[string]int{}}
	for k, v := range w.errs {
		s.Errors[k] = v
	}
	for k, v := range w.closed {
		s.Closed[k] = v
	}
	w.mu.Unlock()
	for k, v := range w.types.snapshot() {
		if d := v - mark[k]; d != 0 {
			s.Types[k] = d
		}
	}
	s.MinSeq = ^uint64(0)
	for _, c := range conns {
		if c == nil {
			s.Frames = append(s.Frames, -1)
			continue
		}
		s.Frames = append(s.Frames, c.frames.Load()-c.mark)
		s.Resyncs += c.resync.Load()
		c.mu.Lock()
		a := c.anom
		seq := c.countSeq
		if c.fold != nil {
			a.Dups += c.fold.dups
			a.Gaps += c.fold.gaps
			a.Missing += c.fold.missing
			a.EpochErrs += c.fold.epochErrs
			a.PageSlips += c.fold.pageSlips
			seq = c.fold.seq
		}
		c.mu.Unlock()
		s.Anom.add(a)
		if c.parse && (c.fold == nil || c.fold.filter == nil) {
			s.MinSeq = min(s.MinSeq, seq)
			s.MaxSeq = max(s.MaxSeq, seq)
		}
	}
	if s.MinSeq == ^uint64(0) {
		s.MinSeq = 0
	}
	return s
}

// report gives the latencies of the churners' events at the connections
// that time them: join sent -> online read, leave sent -> offline read.
// A watcher expects only its users' events.
func (w *bigWorker) report(r *churn.Sent) churn.Arrivals {
	var out churn.Arrivals
	w.each(func(c *bconn) {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.on == nil {
			return
		}
		out.Conns++
		for i := range c.on {
			if i >= len(r.SendUS) || r.SendUS[i] == 0 {
				continue
			}
			if c.users != nil && !c.users[c.spec.ChurnPrefix+strconv.Itoa(i)] {
				continue
			}
			out.Expects++
			seqAt := func(v []uint64) uint64 {
				if i < len(v) {
					return v[i]
				}
				return 0
			}
			switch a := c.on[i]; {
			case a > 0:
				out.On = append(out.On, a-r.SendUS[i])
				if out.Worst == nil {
					out.Worst = make([]int64, len(r.SendUS))
				}
				out.Worst[i] = max(out.Worst[i], a-r.SendUS[i])
			case a < 0 || inSkip(c.skips, seqAt(r.OnSeq)):
				out.OnResynced++
			case c.lost:
				out.LostConn++
			default:
				out.OnNever++
			}
			if i < len(r.LeaveUS) && r.LeaveUS[i] > 0 {
				switch a := c.off[i]; {
				case a > 0:
					out.Off = append(out.Off, a-r.LeaveUS[i])
				case inSkip(c.skips, seqAt(r.OffSeq)):
					out.OffResync++
				case c.lost:
				default:
					out.OffNever++
				}
			}
		}
	})
	return out
}

// check compares what each parsing connection holds with the truth.
func (w *bigWorker) check(t *checkReq) checkResp {
	var out checkResp
	var byUser map[string][]trans
	if t.Trans != nil {
		byUser = map[string][]trans{}
		for _, x := range t.Trans {
			byUser[x.User] = append(byUser[x.User], x)
		}
	}
	w.each(func(c *bconn) {
		if !c.parse {
			return
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.lost {
			out.Lost++ // its view stopped when the node dropped it
			return
		}
		out.Checked++
		var diffs []string
		switch c.spec.Role {
		case roleCount, rolePop:
			// Without room_seq in count frames (a node deviating from
			// PROTOCOL.md, counted apart), only the count is compared.
			if c.count != t.Total || (c.countSeq != 0 && c.countSeq != t.Seq) {
				diffs = append(diffs, fmt.Sprintf("count %d at room_seq %d, truth %d at %d", c.count, c.countSeq, t.Total, t.Seq))
			}
		case roleMember:
			if c.fold.seq < t.Seq {
				out.Behind++
			}
			diffs = diffViews(t.View, c.fold.v, nil)
		case roleWatch:
			diffs = diffViews(t.View, c.fold.v, c.users)
			var exp int64
			var want []trans
			for u := range c.users {
				for _, x := range byUser[u] {
					if x.InWindow {
						exp++
					}
					if x.Seq > c.baseSeq {
						want = append(want, x)
					}
				}
			}
			out.Expected = append(out.Expected, exp)
			// Each user's events exactly once, in seq order; two users'
			// may cross (docs/PROTOCOL.md, "Watch lists").
			slices.SortFunc(want, func(a, b trans) int { return cmp.Or(strings.Compare(a.User, b.User), cmpU64(a.Seq, b.Seq)) })
			got := slices.Clone(c.recv)
			slices.SortStableFunc(got, func(a, b entry) int { return strings.Compare(a.User, b.User) })
			if d := diffTrans(want, got); d != "" {
				diffs = append(diffs, d)
			}
		}
		if len(diffs) > 0 {
			out.Wrong++
			if len(out.Examples) < 5 {
				out.Examples = append(out.Examples, fmt.Sprintf("%s: %d differences: %s", c.user, len(diffs), strings.Join(diffs[:min(len(diffs), 3)], "; ")))
			}
		}
	})
	return out
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// diffTrans compares the events a watcher received with the ones it
// should have, both grouped by user, each user's in the order received
// and in seq order: "" when equal.
func diffTrans(want []trans, got []entry) string {
	for i := 0; i < max(len(want), len(got)); i++ {
		switch {
		case i >= len(want):
			return fmt.Sprintf("extra event %d %s %s", got[i].Seq, got[i].Kind, got[i].User)
		case i >= len(got):
			return fmt.Sprintf("missing event %d %s %s (got %d of %d)", want[i].Seq, want[i].Kind, want[i].User, len(got), len(want))
		case want[i].Seq != got[i].Seq || want[i].User != got[i].User || want[i].Kind != string(got[i].Kind):
			return fmt.Sprintf("event %d: got %d %s %s, want %d %s %s", i, got[i].Seq, got[i].Kind, got[i].User, want[i].Seq, want[i].Kind, want[i].User)
		}
	}
	return ""
}

func (w *bigWorker) closeAll() {
	w.each(func(c *bconn) {
		c.End()
	})
}

// WorkerMain is a bigroom-worker: it serves its parent's requests on in
// and out (package worker) until closed.
func WorkerMain(ctx context.Context, in io.Reader, out io.Writer) error {
	w := newBigWorker()
	defer w.closeAll()
	return worker.Serve(ctx, in, out, w.ops())
}

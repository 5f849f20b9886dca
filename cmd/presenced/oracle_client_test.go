package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/presence-dev/presence/internal/oracle"
	"github.com/presence-dev/presence/internal/testkit"
)

// The oracle's own WebSocket client: it speaks docs/PROTOCOL.md with
// gorilla/websocket and nothing of the node's packages, reads every frame,
// and keeps for every joined room the view a client builds from its join
// snapshot, then the events in arrival order, replaced by each resync
// snapshot.

// oracleToken signs a client token valid for two days, so that a long run
// never meets a token expiry (4002).
func oracleToken(secret, user string) (string, error) {
	return testkit.Token([]byte(secret), user, []string{"*"}, 48*time.Hour)
}

// wsFrame is any frame a node sends.
type wsFrame struct {
	Type     string          `json:"type"`
	Ref      string          `json:"ref"`
	Room     string          `json:"room"`
	Reason   string          `json:"reason"`
	Code     string          `json:"code"`
	Message  string          `json:"message"`
	Snapshot *wsSnapshot     `json:"snapshot"`
	Event    json.RawMessage `json:"event"`
	ev       wsEvent         // an event frame read by fastEvent
}

type wsSnapshot struct {
	Room    string `json:"room"`
	Members []struct {
		User     string `json:"user"`
		Sessions []struct {
			ID    string          `json:"id"`
			State json.RawMessage `json:"state"`
		} `json:"sessions"`
	} `json:"members"`
	RoomSeq uint64 `json:"room_seq"`
	Epoch   int64  `json:"epoch"`
}

// members returns the snapshot's membership.
func (s *wsSnapshot) members() oracle.Members {
	out := oracle.Members{}
	for _, m := range s.Members {
		ss := map[string]string{}
		for _, x := range m.Sessions {
			ss[x.ID] = normState(x.State)
		}
		out[m.User] = ss
	}
	return out
}

// wsEvent is a bus event (docs/BUS.md, version 1).
type wsEvent struct {
	V        int             `json:"v"`
	ID       string          `json:"id"`
	Kind     string          `json:"kind"`
	Reason   string          `json:"reason"`
	Region   string          `json:"region"`
	Room     string          `json:"room"`
	User     string          `json:"user"`
	Sessions int             `json:"sessions"`
	Seq      uint64          `json:"seq"`
	Epoch    int64           `json:"epoch"`
	At       time.Time       `json:"at"`
	Session  string          `json:"session"`
	State    json.RawMessage `json:"state"`
}

// fastEvent reads the fields a view needs from an event frame, as the node
// writes it ({"type":"event","event":{...}}, compact, ids never escaped,
// the state last), without encoding/json: every client reads every event
// of its rooms, and under the race detector encoding/json is what the
// harness would spend its time on. Anything unexpected returns false, and
// the frame goes to encoding/json.
func fastEvent(data []byte) (wsEvent, bool) {
	var e wsEvent
	const prefix = `{"type":"event","event":{`
	if !bytes.HasPrefix(data, []byte(prefix)) || !bytes.HasSuffix(data, []byte("}}")) {
		return e, false
	}
	body := data[len(prefix)-1 : len(data)-1]
	head := body
	if i := bytes.Index(body, []byte(`,"state":`)); i >= 0 {
		head = body[:i]
		raw := body[i+len(`,"state":`) : len(body)-1]
		if !json.Valid(raw) {
			return e, false
		}
		e.State = raw
	}
	str := func(key string) (string, bool) {
		k := `"` + key + `":"`
		i := bytes.Index(head, []byte(k))
		if i < 0 {
			return "", false
		}
		rest := head[i+len(k):]
		j := bytes.IndexByte(rest, '"')
		if j < 0 || bytes.IndexByte(rest[:j], '\\') >= 0 {
			return "", false
		}
		return string(rest[:j]), true
	}
	num := func(key string) (int64, bool) {
		k := `"` + key + `":`
		i := bytes.Index(head, []byte(k))
		if i < 0 {
			return 0, false
		}
		rest := head[i+len(k):]
		j := bytes.IndexAny(rest, ",}")
		if j < 0 {
			j = len(rest)
		}
		n, err := strconv.ParseInt(string(rest[:j]), 10, 64)
		return n, err == nil
	}
	var ok [6]bool
	e.ID, ok[0] = str("id")
	e.Kind, ok[1] = str("kind")
	e.Reason, _ = str("reason")
	e.Room, ok[2] = str("room")
	e.User, ok[3] = str("user")
	var seq, epoch int64
	seq, ok[4] = num("seq")
	epoch, ok[5] = num("epoch")
	e.Session, _ = str("session")
	e.Seq, e.Epoch = uint64(seq), epoch
	for _, x := range ok {
		if !x {
			return wsEvent{}, false
		}
	}
	return e, true
}

// normState is a state as the oracle compares it: compact JSON, "" for
// none or null.
func normState(raw json.RawMessage) string {
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return string(raw)
	}
	return b.String()
}

// roomView is a client's belief about one room.
type roomView struct {
	members    oracle.Members
	epoch      int64
	base       uint64 // highest seq applied
	contiguous bool   // every seq from the snapshot to base was applied
}

// wsClient is one connection.
type wsClient struct {
	h    *harness
	id   int
	ws   *websocket.Conn
	done chan struct{} // closed when the reader has stopped

	mu      *sync.Mutex  // shared with the harness's entry for the record
	rec     *oracle.Conn // the record; holds and states are the actor's, the end the reader's unless the client ended it
	ended   bool         // the client closed or reset it
	pending map[string]chan wsFrame
	views   map[string]*roomView
	refs    int
}

var errConnGone = errors.New("connection gone")

// dialWS opens a connection of (user, session) to the node with id node at
// addr and waits for its hello.
func (h *harness) dialWS(node int, addr, user, session string) (*wsClient, error) {
	tok, err := oracleToken(h.secret, user)
	if err != nil {
		return nil, err
	}
	u := fmt.Sprintf("ws://%s/v1/ws?session=%s&access_token=%s", addr, url.QueryEscape(session), tok)
	h.mu.Lock()
	rec := &oracle.Conn{ID: len(h.recs), User: user, Session: session, Node: node, Dialed: h.now(), Opened: oracle.None, End: oracle.None}
	c := &wsClient{h: h, id: rec.ID, mu: &sync.Mutex{}, rec: rec, done: make(chan struct{}), pending: map[string]chan wsFrame{}, views: map[string]*roomView{}}
	// The harness keeps every record, but a client only while it is open:
	// a long run makes hundreds of thousands of connections.
	h.recs = append(h.recs, connEntry{mu: c.mu, rec: rec})
	h.live[rec.ID] = c
	h.mu.Unlock()
	d := websocket.Dialer{HandshakeTimeout: 5 * time.Second}
	ws, resp, err := d.Dial(u, nil)
	if resp != nil && resp.Body != nil {
		resp.Body.Close()
	}
	if err != nil {
		c.mu.Lock()
		rec.End, rec.How = h.now(), oracle.Dropped
		c.mu.Unlock()
		close(c.done)
		h.mu.Lock()
		delete(h.live, rec.ID)
		h.mu.Unlock()
		return nil, err
	}
	c.ws = ws
	hello := make(chan wsFrame, 1)
	c.pending["hello"] = hello
	go c.read()
	select {
	case f, ok := <-hello:
		if !ok || f.Type != "hello" {
			return nil, fmt.Errorf("no hello from %s: %v", addr, f)
		}
		c.mu.Lock()
		rec.Opened = h.now()
		c.mu.Unlock()
		return c, nil
	case <-time.After(10 * time.Second):
		c.reset()
		return nil, fmt.Errorf("no hello from %s in 10s", addr)
	}
}

// read reads every frame until the connection ends.
func (c *wsClient) read() {
	defer close(c.done)
	for {
		_, data, err := c.ws.ReadMessage()
		if err != nil {
			c.finish(err)
			return
		}
		var f wsFrame
		if e, ok := fastEvent(data); ok {
			f.Type, f.ev = "event", e
		} else if json.Unmarshal(data, &f) != nil {
			c.h.note(c.id, "undecodable frame: "+string(data))
			continue
		}
		c.frame(f)
	}
}

// finish records how the connection ended, unless the client ended it,
// and forgets the client: its views no longer matter.
func (c *wsClient) finish(err error) {
	_ = c.ws.Close()
	now := c.h.now()
	defer func() {
		c.h.mu.Lock()
		delete(c.h.live, c.id)
		c.h.mu.Unlock()
	}()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.views = nil
	if !c.ended {
		c.rec.End, c.rec.How = now, oracle.Dropped
		var ce *websocket.CloseError
		if errors.As(err, &ce) && ce.Code != websocket.CloseAbnormalClosure {
			// 1006 is gorilla's name for "no close frame came".
			c.rec.How, c.rec.Code = oracle.ServerClosed, ce.Code
		}
		if c.rec.How == oracle.ServerClosed && c.rec.Code != oracle.CodeSessionMoved {
			c.h.note(c.id, fmt.Sprintf("closed by the node with %d (%s)", c.rec.Code, ce.Text))
		}
	}
	for ref, ch := range c.pending {
		close(ch)
		delete(c.pending, ref)
	}
}

func (c *wsClient) frame(f wsFrame) {
	now := c.h.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	switch f.Type {
	case "hello":
		f.Ref = "hello"
	case "snapshot":
		if f.Snapshot == nil {
			break
		}
		v := c.views[f.Room]
		if f.Reason == "resync" && v != nil {
			c.h.resync(oracle.Resync{Conn: c.id, Room: f.Room, At: now, Base: v.base, Epoch: v.epoch, Contiguous: v.contiguous,
				SnapSeq: f.Snapshot.RoomSeq, SnapEpoch: f.Snapshot.Epoch})
		}
		c.views[f.Room] = &roomView{members: f.Snapshot.members(), epoch: f.Snapshot.Epoch, base: f.Snapshot.RoomSeq, contiguous: true}
		for _, m := range f.Snapshot.Members {
			if len(m.Sessions) == 0 {
				c.h.emptyMember(oracle.Empty{Conn: c.id, Room: f.Room, User: m.User, At: now})
			}
		}
	case "event":
		e, ok := f.ev, f.ev.ID != ""
		if !ok && json.Unmarshal(f.Event, &e) != nil {
			c.h.note(c.id, "undecodable event frame")
			break
		}
		v := c.views[e.Room]
		if v == nil {
			c.h.note(c.id, "event for a room without a snapshot: "+e.ID)
			break
		}
		if v.epoch != 0 && e.Epoch != v.epoch || e.Seq != v.base+1 {
			c.h.note(c.id, fmt.Sprintf("room %s: event seq %d (epoch %d) after %d (epoch %d)", e.Room, e.Seq, e.Epoch, v.base, v.epoch))
			v.contiguous = false
		}
		v.epoch, v.base = e.Epoch, e.Seq
		// The folding rule of PROTOCOL.md ("What a view holds"), detail
		// "sessions".
		switch e.Kind {
		case "online":
			v.members[e.User] = map[string]string{e.Session: ""}
		case "offline":
			delete(v.members, e.User)
		case "update":
			ss := v.members[e.User]
			if ss == nil {
				c.h.note(c.id, "update of a non-member: "+e.ID)
				break
			}
			switch e.Reason {
			case "joined":
				ss[e.Session] = ""
			case "left", "expired":
				delete(ss, e.Session)
			default:
				ss[e.Session] = normState(e.State)
			}
		}
	case "error":
		if f.Ref == "" {
			c.h.note(c.id, fmt.Sprintf("error frame %s: %s", f.Code, f.Message))
		}
	}
	if ch := c.pending[f.Ref]; f.Ref != "" && ch != nil {
		ch <- f
		delete(c.pending, f.Ref)
	}
}

// request sends a frame with a fresh ref and returns the channel its reply
// comes on (closed if the connection ends first).
func (c *wsClient) request(m map[string]any) (chan wsFrame, error) {
	c.mu.Lock()
	c.refs++
	ref := strconv.Itoa(c.refs)
	ch := make(chan wsFrame, 1)
	select {
	case <-c.done:
		c.mu.Unlock()
		return nil, errConnGone
	default:
	}
	c.pending[ref] = ch
	c.mu.Unlock()
	m["ref"] = ref
	b, _ := json.Marshal(m)
	_ = c.ws.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if err := c.ws.WriteMessage(websocket.TextMessage, b); err != nil {
		return nil, err
	}
	return ch, nil
}

// await waits for a reply of the wanted type.
func (c *wsClient) await(ch chan wsFrame, want string) (wsFrame, error) {
	select {
	case f, ok := <-ch:
		if !ok {
			return f, errConnGone
		}
		if f.Type != want {
			return f, fmt.Errorf("%s reply: %s %s", f.Type, f.Code, f.Message)
		}
		return f, nil
	case <-time.After(10 * time.Second):
		return wsFrame{}, fmt.Errorf("no %s reply in 10s", want)
	}
}

// joinAll sends a join for every room at once, then the states to send
// again, and waits for every reply: a return is acknowledged as soon as
// the node allows.
func (c *wsClient) joinAll(rooms, states []string) {
	type sent struct {
		hold int
		ch   chan wsFrame
	}
	var js []sent
	for _, r := range rooms {
		c.mu.Lock()
		c.rec.Holds = append(c.rec.Holds, oracle.Hold{Room: r, JoinSent: c.h.now(), JoinAcked: oracle.None, LeaveSent: oracle.None})
		hi := len(c.rec.Holds) - 1
		c.mu.Unlock()
		c.h.count("join")
		ch, err := c.request(map[string]any{"type": "join", "room": r, "detail": "sessions"})
		if err != nil {
			return
		}
		js = append(js, sent{hi, ch})
	}
	for _, s := range js {
		if _, err := c.await(s.ch, "snapshot"); err != nil {
			c.failed("join "+c.rec.Holds[s.hold].Room, err)
			continue
		}
		now := c.h.now()
		c.mu.Lock()
		c.rec.Holds[s.hold].JoinAcked = now
		c.mu.Unlock()
	}
	for i, r := range rooms {
		if i < len(states) && states[i] != "" {
			c.setState(r, states[i])
		}
	}
}

// setState sets the state in a room ("" sends null).
func (c *wsClient) setState(room, state string) {
	var st any = json.RawMessage(state)
	if state == "" {
		st = nil
	}
	c.mu.Lock()
	c.rec.States = append(c.rec.States, oracle.StateSet{Room: room, Sent: c.h.now(), Acked: oracle.None, State: normState(json.RawMessage(state))})
	si := len(c.rec.States) - 1
	c.mu.Unlock()
	c.h.count("state")
	ch, err := c.request(map[string]any{"type": "state", "room": room, "state": st})
	if err != nil {
		return
	}
	if _, err := c.await(ch, "state_set"); err != nil {
		c.failed("state "+room, err)
		return
	}
	now := c.h.now()
	c.mu.Lock()
	c.rec.States[si].Acked = now
	c.mu.Unlock()
}

// leave leaves a room; the hold ends when the leave is sent.
func (c *wsClient) leave(room string) {
	c.mu.Lock()
	hi := -1
	for i, h := range c.rec.Holds {
		if h.Room == room && h.LeaveSent == oracle.None {
			hi = i
		}
	}
	if hi >= 0 {
		c.rec.Holds[hi].LeaveSent = c.h.now()
	}
	c.mu.Unlock()
	c.h.count("leave")
	ch, err := c.request(map[string]any{"type": "leave", "room": room})
	if err != nil {
		return
	}
	if _, err := c.await(ch, "left"); err != nil {
		c.failed("leave "+room, err)
	}
	c.mu.Lock()
	delete(c.views, room)
	c.mu.Unlock()
}

func (c *wsClient) failed(what string, err error) {
	if errors.Is(err, errConnGone) {
		return // the connection's end says why
	}
	c.h.note(c.id, what+": "+err.Error())
}

// alive reports whether the connection is still open.
func (c *wsClient) alive() bool {
	select {
	case <-c.done:
		return false
	default:
		return true
	}
}

// end records the client's own end of the connection, at the time it does
// it; false if it had already ended.
func (c *wsClient) end(how oracle.ConnEnd) bool {
	now := c.h.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended || c.rec.End != oracle.None {
		return false
	}
	c.ended = true
	c.rec.End, c.rec.How = now, how
	return true
}

// closeClean sends a close frame; the node answers and the reader stops.
func (c *wsClient) closeClean() {
	if !c.end(oracle.Closed) {
		return
	}
	_ = c.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "bye"), time.Now().Add(2*time.Second))
	// The reader stops at the node's answer; not forever if none comes.
	_ = c.ws.SetReadDeadline(time.Now().Add(5 * time.Second))
}

// reset drops the TCP connection with a reset, as a network failure does.
func (c *wsClient) reset() {
	if !c.end(oracle.Reset) {
		return
	}
	if tc, ok := c.ws.UnderlyingConn().(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.ws.UnderlyingConn().Close()
}

// endTime is when the connection ended (None while open) and whether the
// client ended it.
func (c *wsClient) endTime() (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rec.End, c.ended
}

// snapshotViews copies the views of the rooms the connection holds.
func (c *wsClient) snapshotViews() map[string]oracle.Members {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]oracle.Members{}
	for room, v := range c.views {
		m := oracle.Members{}
		for u, ss := range v.members {
			cp := map[string]string{}
			for s, st := range ss {
				cp[s] = st
			}
			m[u] = cp
		}
		out[room] = m
	}
	return out
}

// connEntry is the harness's handle on a connection's record, kept after
// the client is gone.
type connEntry struct {
	mu  *sync.Mutex
	rec *oracle.Conn
}

// record returns a copy of the connection's record.
func (e connEntry) record() oracle.Conn {
	e.mu.Lock()
	defer e.mu.Unlock()
	r := *e.rec
	r.Holds = append([]oracle.Hold(nil), r.Holds...)
	r.States = append([]oracle.StateSet(nil), r.States...)
	return r
}

// fastEvent reads what encoding/json reads, or declines.
func TestOracleFastEvent(t *testing.T) {
	for _, frame := range []string{
		`{"type":"event","event":{"v":1,"id":"eu/r1/1764444000000/18","kind":"online","reason":"joined","region":"eu","room":"r1","user":"u001","sessions":1,"seq":18,"epoch":1764444000000,"at":"2026-11-29T19:48:47.002Z"}}`,
		`{"type":"event","event":{"v":1,"id":"eu/r1/1764444000000/19","kind":"update","reason":"state","region":"eu","room":"r1","user":"u001","sessions":2,"seq":19,"epoch":1764444000000,"at":"2026-11-29T19:48:47.002Z","session":"u001-t1","state":{"s":"away","n":[1,{"x":"}"}]}}}`,
		`{"type":"event","event":{"v":1,"id":"eu/r1/1764444000000/20","kind":"update","reason":"state","region":"eu","room":"r1","user":"u001","sessions":2,"seq":20,"epoch":1764444000000,"at":"2026-11-29T19:48:47.002Z","session":"u001-t1"}}`,
	} {
		got, ok := fastEvent([]byte(frame))
		if !ok {
			t.Fatalf("declined %s", frame)
		}
		var f struct{ Event wsEvent }
		if err := json.Unmarshal([]byte(frame), &f); err != nil {
			t.Fatal(err)
		}
		want := f.Event
		if got.ID != want.ID || got.Kind != want.Kind || got.Room != want.Room || got.User != want.User || got.Seq != want.Seq ||
			got.Epoch != want.Epoch || got.Session != want.Session || got.Reason != want.Reason || normState(got.State) != normState(want.State) {
			t.Fatalf("fastEvent(%s) = %+v, want %+v", frame, got, want)
		}
	}
	for _, frame := range []string{`{"type":"snapshot"}`, `{"type":"event","event":{"v":1,"id":"a\"b"}}`} {
		if _, ok := fastEvent([]byte(frame)); ok {
			t.Fatalf("accepted %s", frame)
		}
	}
}

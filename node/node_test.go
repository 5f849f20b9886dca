package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	jsclient "github.com/presence-dev/presence/clients/js"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testnats"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
	"github.com/presence-dev/presence/region"
)

var _ Store = (*region.Store)(nil)

func TestJoinSendsSnapshotThenLiveDiffs(t *testing.T) {
	e := newEnv(t)
	n := e.newNode()
	all := []string{"*"}

	a := n.dial(t, token(t, "alice", all, time.Hour), "tab1")
	if a.hello.V != protocol.Version || a.hello.User != "alice" || a.hello.Session != "tab1" ||
		a.hello.OfflineGraceMS != testTiming.OfflineGrace.Milliseconds() {
		t.Fatalf("hello: %s", a.hello.raw)
	}
	snap := a.join("room1").Snapshot
	if snap.Total != 1 || len(snap.Members) != 1 || snap.Members[0].User != "alice" || len(snap.Members[0].Sessions) != 1 || snap.Members[0].Sessions[0].ID != "tab1" {
		t.Fatalf("snapshot: %+v", snap)
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		return e.rec.WantOf(presence.Online, "room1", "alice", 1)
	})
	if snap.RoomSeq != e.rec.Of(presence.Online, "room1", "alice")[0].Seq {
		t.Fatalf("snapshot room_seq %d does not cover alice's join", snap.RoomSeq)
	}

	// A watcher kept at the default detail: states, not session lists.
	w := n.dial(t, token(t, "walt", all, time.Hour), "w")
	if s := w.joinDetail("room1", "").Snapshot; s.Total != 2 || len(s.Members[0].Sessions) != 0 {
		t.Fatalf("default detail lists sessions without state: %+v", s)
	}
	if f := a.expect("event"); f.Event.Kind != presence.Online || f.Event.User != "walt" || f.Event.Session != "w" {
		t.Fatalf("walt's online: %s", f.raw)
	}

	// A second session of the same user: one update (joined), which
	// alice's first connection (detail sessions) gets and walt does not.
	a2 := n.dial(t, token(t, "alice", all, time.Hour), "tab2")
	if s := a2.join("room1").Snapshot; s.Total != 2 || len(s.Members[0].Sessions) != 2 {
		t.Fatalf("second session snapshot: %+v", s)
	}
	if f := a.expect("event"); f.Event.Kind != presence.Update || f.Event.Reason != presence.Joined || f.Event.Session != "tab2" || f.Event.Sessions != 2 {
		t.Fatalf("second session's update: %s", f.raw)
	}

	// Another user: one online, delivered to both of alice's connections
	// exactly once, after their snapshots.
	b := n.dial(t, token(t, "bob", all, time.Hour), "x")
	if s := b.join("room1").Snapshot; s.Total != 3 {
		t.Fatalf("bob's snapshot: %+v", s)
	}
	for _, c := range []*client{a, a2, w} {
		f := c.expect("event")
		if f.Event.Kind != presence.Online || f.Event.User != "bob" || f.Event.Room != "room1" || f.Event.Seq <= snap.RoomSeq || f.Event.V != 1 {
			t.Fatalf("event: %s", f.raw)
		}
		c.ping() // nothing else was queued before the pong
	}
	e.quiesce("room1")
	if got := e.rec.Of("", "room1", "alice"); len(got) != 2 {
		t.Fatalf("alice's transitions: %v, want one online and one update", got)
	}
}

func TestJoinOutsideTokenRoomsIsRefused(t *testing.T) {
	e := newEnv(t)
	n := e.newNode()
	c := n.dial(t, token(t, "carol", []string{"team7-*", "lobby"}, time.Hour), "s")

	c.send(map[string]string{"type": "join", "room": "team8-a", "ref": "r1"})
	c.expectError(protocol.CodeForbidden, "r1")
	c.send(map[string]string{"type": "join", "room": "lobby2", "ref": "r2"})
	c.expectError(protocol.CodeForbidden, "r2")
	c.join("lobby")
	c.join("team7-general")
	c.ping()
	if got := e.live("team8-a", "carol"); got != nil {
		t.Fatalf("refused join wrote a session: %v", got)
	}
}

func TestMalformedFramesGetErrorsAndWriteNothing(t *testing.T) {
	e := newEnv(t)
	n := e.newNode(func(c *Config) { c.Limits.FrameBurst = 100 })
	c := n.dial(t, token(t, "dave", []string{"*"}, time.Hour), "s")

	cases := []struct {
		raw  string
		code protocol.ErrorCode
		ref  string
	}{
		{`not json`, protocol.CodeBadFrame, ""},
		{`[1,2]`, protocol.CodeBadFrame, ""},
		{`{"type":5}`, protocol.CodeBadFrame, ""},
		{`{"room":"r"}`, protocol.CodeBadFrame, ""},
		{`{"type":"dance","ref":"d"}`, protocol.CodeUnknownType, "d"},
		{`{"type":"join","ref":"1"}`, protocol.CodeInvalidRoom, "1"},
		{`{"type":"join","room":"a.b","ref":"2"}`, protocol.CodeInvalidRoom, "2"},
		{`{"type":"join","room":"` + strings.Repeat("r", presence.MaxRoomLen+1) + `","ref":"3"}`, protocol.CodeInvalidRoom, "3"},
		{`{"type":"leave","room":"r","ref":"4"}`, protocol.CodeNotJoined, "4"},
		{`{"type":"state","room":"r","state":{},"ref":"5"}`, protocol.CodeNotJoined, "5"},
		{`{"type":"join","room":"r","ref":"` + strings.Repeat("x", protocol.MaxRefLen+1) + `"}`, protocol.CodeBadFrame, ""},
	}
	for _, k := range cases {
		t.Run(k.raw[:min(len(k.raw), 40)], func(t *testing.T) {
			c := c.in(t)
			c.sendRaw(websocket.TextMessage, []byte(k.raw))
			c.expectError(k.code, k.ref)
		})
	}
	c.sendRaw(websocket.BinaryMessage, []byte{1, 2, 3})
	c.expectError(protocol.CodeBadFrame, "")
	c.ping()
	// The reaper's sweeps write the region's clock every reap interval,
	// frames or not; anything else would be a frame's write.
	k, err := e.rdb.Keys(context.Background(), "*").Result()
	if k = slices.DeleteFunc(k, func(k string) bool { return k == "presence:clock" }); err != nil || len(k) != 0 {
		t.Fatalf("malformed frames wrote to Redis: %v %v", k, err)
	}

	// State errors on a joined room.
	c.join("r")
	for _, k := range []struct {
		name, raw string
	}{
		{"missing", `{"type":"state","room":"r","ref":"s1"}`},
		{"too big", `{"type":"state","room":"r","ref":"s1","state":"` + strings.Repeat("x", presence.MaxStateBytes) + `"}`},
	} {
		t.Run("state "+k.name, func(t *testing.T) {
			c := c.in(t)
			c.sendRaw(websocket.TextMessage, []byte(k.raw))
			c.expectError(protocol.CodeInvalidState, "s1")
		})
	}
	c.ping()
	if m, _, _ := e.store.Sessions(context.Background(), "r", "dave"); len(m.Sessions) != 1 || m.Sessions[0].State != nil {
		t.Fatalf("state after bad state frames: %+v", m)
	}
}

func TestStateUpdateIsOneUpdateEvent(t *testing.T) {
	e := newEnv(t)
	n := e.newNode()
	watcher := n.dial(t, token(t, "w", []string{"*"}, time.Hour), "w")
	watcher.join("room")
	c := n.dial(t, token(t, "erin", []string{"*"}, time.Hour), "tab")
	c.join("room")
	if f := watcher.expect("event"); f.Event.Kind != presence.Online || f.Event.User != "erin" {
		t.Fatalf("watcher: %s", f.raw)
	}

	c.send(map[string]any{"type": "state", "room": "room", "state": map[string]string{"status": "away"}, "ref": "st"})
	if f := c.replyAndOwnEvent("state_set", presence.Update); f.Ref != "st" || f.Room != "room" {
		t.Fatalf("state reply: %s", f.raw)
	}
	f := watcher.expect("event")
	if f.Event.Kind != presence.Update || f.Event.User != "erin" || f.Event.Session != "tab" || string(f.Event.State) != `{"status":"away"}` {
		t.Fatalf("update event: %s", f.raw)
	}
	if s := watcher.join("room").Snapshot; string(findSession(s, "erin", "tab").State) != `{"status":"away"}` {
		t.Fatalf("snapshot state: %+v", s)
	}
	c.send(map[string]any{"type": "state", "room": "room", "state": nil, "ref": "clear"})
	c.replyAndOwnEvent("state_set", presence.Update)
	if f := watcher.expect("event"); f.Event.Kind != presence.Update || f.Event.State != nil {
		t.Fatalf("clear event: %s", f.raw)
	}
	e.quiesce("room")
	if got := e.rec.Of("", "room", "erin"); len(got) != 3 || got[1].Kind != presence.Update || got[2].Kind != presence.Update {
		t.Fatalf("erin's transitions: %v, want online, update, update", got)
	}
}

func findSession(s presence.Snapshot, user, session string) presence.SessionInfo {
	for _, m := range s.Members {
		if m.User == user {
			for _, si := range m.Sessions {
				if si.ID == session {
					return si
				}
			}
		}
	}
	return presence.SessionInfo{}
}

func TestCleanCloseAnnouncesOfflineAfterGrace(t *testing.T) {
	slow(t)
	e := newEnv(t)
	n := e.newNode()
	c := n.dial(t, token(t, "fay", []string{"*"}, time.Hour), "tab")
	c.join("room")
	c.send(map[string]any{"type": "state", "room": "room", "state": "busy"})
	c.replyAndOwnEvent("state_set", presence.Update)
	c.closeNormally()
	closed := time.Now()
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return e.rec.WantOf(presence.Offline, "room", "fay", 1) })
	if d := time.Since(closed); d < testTiming.OfflineGrace-100*time.Millisecond {
		t.Fatalf("offline %v after the close, before the grace of %v", d, testTiming.OfflineGrace)
	}
	if off := e.rec.Of(presence.Offline, "room", "fay")[0]; off.Reason != presence.Left {
		t.Fatalf("offline reason %q, want left (released, not expired)", off.Reason)
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		return errors.Join(testkit.Want("open connections", n.counts.open.Load(), 0), testkit.Want("sessions held", n.keeper.held(), 0))
	})
}

func TestAbruptTCPCloseIsReleased(t *testing.T) {
	slow(t)
	e := newEnv(t)
	n := e.newNode()
	c := n.dial(t, token(t, "gus", []string{"*"}, time.Hour), "tab")
	c.join("room")
	_ = c.ws.NetConn().Close() // no close frame
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return e.rec.WantOf(presence.Offline, "room", "gus", 1) })
	if off := e.rec.Of(presence.Offline, "room", "gus")[0]; off.Reason != presence.Left {
		t.Fatalf("offline reason %q, want left", off.Reason)
	}
}

// A client whose TCP connection stays up but which never answers pings
// (a frozen tab, a dead NAT mapping) is found by the pong deadline and
// released; meanwhile the node keeps its session refreshed, so the
// departure can only come from that release.
func TestUnresponsiveClientIsDetectedByPing(t *testing.T) {
	slow(t)
	e := newEnv(t)
	n := e.newNode()
	h := http.Header{}
	h.Set("Authorization", "Bearer "+token(t, "hal", []string{"*"}, time.Hour))
	ws, _, err := dialRaw(n.wsURL("session=tab"), h)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	if err := ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"join","room":"room"}`)); err != nil {
		t.Fatal(err)
	}
	// Never read again: pings go unanswered.
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return e.rec.WantOf(presence.Online, "room", "hal", 1) })
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error { return e.rec.WantOf(presence.Offline, "room", "hal", 1) })
	if off := e.rec.Of(presence.Offline, "room", "hal")[0]; off.Reason != presence.Left {
		t.Fatalf("offline reason %q, want left", off.Reason)
	}
}

func TestReconnectInsideGraceIsSilent(t *testing.T) {
	slow(t)
	e := newEnv(t)
	n1 := e.newNode()
	n2 := e.newNode()
	tok := token(t, "ida", []string{"*"}, time.Hour)

	c := n1.dial(t, tok, "tab")
	c.join("room")
	c.closeNormally()
	// Same node, same session id.
	c = n1.dial(t, tok, "tab")
	c.join("room")
	_ = c.ws.NetConn().Close()
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.Want("sessions n1 holds, the abrupt close released", n1.keeper.held(), 0) })
	// Another node on the same Redis.
	c = n2.dial(t, tok, "tab")
	if s := c.join("room").Snapshot; len(findSession(s, "ida", "tab").ID) == 0 {
		t.Fatalf("snapshot after reconnect: %+v", s)
	}
	e.waitRedisPast(e.redisNow().Add(testTiming.OfflineGrace + 200*time.Millisecond))
	e.quiesce("room")
	if got := e.rec.Of("", "room", "ida"); len(got) != 1 || got[0].Kind != presence.Online {
		t.Fatalf("ida's transitions: %v, want only the first online", got)
	}
}

func TestDrainClosesWith1012AndKeepsSessions(t *testing.T) {
	slow(t)
	e := newEnv(t)
	n1 := e.newNode()
	n2 := e.newNode()
	tokA := token(t, "jo", []string{"*"}, time.Hour)
	tokB := token(t, "kim", []string{"*"}, time.Hour)
	a := n1.dial(t, tokA, "tab")
	a.join("room")
	b := n1.dial(t, tokB, "tab")
	b.join("room")
	a.expect("event") // kim online

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := n1.Drain(ctx); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	a.expectClose(protocol.CloseRestart)
	b.expectClose(protocol.CloseRestart)
	for _, u := range []string{"jo", "kim"} {
		if got := e.live("room", u); !slices.Equal(got, []string{"tab"}) {
			t.Fatalf("%s's sessions after drain: %v, want tab still live", u, got)
		}
	}
	if _, resp, err := dialRaw(n1.wsURL("session=x"), http.Header{"Authorization": {"Bearer " + tokA}}); err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("dial after drain: %v %v, want 503", err, resp)
	}
	resp, err := http.Get(n1.srv.URL + PathHealth)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("health after drain: %v", resp.Status)
	}

	// jo reconnects elsewhere inside the TTL; kim never comes back.
	a = n2.dial(t, tokA, "tab")
	a.join("room")
	drained := e.redisNow()
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error { return e.rec.WantOf(presence.Offline, "room", "kim", 1) })
	if off := e.rec.Of(presence.Offline, "room", "kim")[0]; off.Reason != presence.Expired {
		t.Fatalf("kim's offline: %v, want expired (never released)", off)
	}
	e.waitRedisPast(drained.Add(testTiming.SessionTTL + 200*time.Millisecond))
	e.quiesce("room")
	if got := e.rec.Of("", "room", "jo"); len(got) != 1 {
		t.Fatalf("jo's transitions: %v, want only the first online", got)
	}
}

func TestLimits(t *testing.T) {
	slow(t)
	e := newEnv(t)
	n := e.newNode(func(c *Config) {
		c.Limits.MaxRooms = 2
		c.Limits.MaxConnections = 3
		c.Limits.FrameRate = 1
		c.Limits.FrameBurst = 4
		c.Limits.RateStrikes = 3
	})
	all := []string{"*"}

	t.Run("frame size", func(t *testing.T) {
		c := n.dial(t, token(t, "big", all, time.Hour), "s")
		c.join("big-room")
		c.sendRaw(websocket.TextMessage, []byte(`{"type":"ping","ref":"`+strings.Repeat("x", DefaultMaxFrameBytes)+`"}`))
		c.expectClose(protocol.CloseTooBig)
		testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
			return e.rec.WantOf(presence.Offline, "big-room", "big", 1)
		})
	})
	t.Run("rooms", func(t *testing.T) {
		c := n.dial(t, token(t, "many", all, time.Hour), "s")
		c.join("r1")
		c.join("r2")
		c.send(map[string]string{"type": "join", "room": "r3", "ref": "3"})
		c.expectError(protocol.CodeTooManyRooms, "3")
		c.closeNormally()
	})
	t.Run("rate", func(t *testing.T) {
		c := n.dial(t, token(t, "fast", all, time.Hour), "s")
		for range 4 {
			c.send(map[string]string{"type": "ping"})
		}
		for range 4 {
			c.expect("pong")
		}
		c.send(map[string]string{"type": "ping", "ref": "x"})
		c.expectError(protocol.CodeRateLimited, "")
		c.send(map[string]string{"type": "ping"})
		c.expectError(protocol.CodeRateLimited, "")
		c.send(map[string]string{"type": "ping"})
		c.expectClose(protocol.ClosePolicy)
	})
	t.Run("connections", func(t *testing.T) {
		testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
			return testkit.Want("active connections, the earlier ones ended", n.counts.active.Load(), 0)
		})
		for i := range 3 {
			n.dial(t, token(t, "conn", all, time.Hour), "s"+string(rune('a'+i)))
		}
		_, resp, err := dialRaw(n.wsURL("session=d"), http.Header{"Authorization": {"Bearer " + token(t, "conn", all, time.Hour)}})
		if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("fourth connection: %v %v, want 503", err, resp)
		}
		body, _ := io.ReadAll(resp.Body)
		if !strings.Contains(string(body), "at capacity") {
			t.Fatalf("503 body: %s", body)
		}
	})
}

func TestHeartbeatKeepsSessionAliveBeyondTTL(t *testing.T) {
	slow(t)
	e := newEnv(t)
	n := e.newNode()
	c := n.dial(t, token(t, "lou", []string{"*"}, time.Hour), "tab")
	c.join("room")
	start := e.redisNow()
	e.waitRedisPast(start.Add(3*testTiming.SessionTTL + 200*time.Millisecond))
	if got := e.live("room", "lou"); !slices.Equal(got, []string{"tab"}) {
		t.Fatalf("sessions after 3 TTLs: %v", got)
	}
	c.ping()
	e.quiesce("room")
	if got := e.rec.Of("", "room", "lou"); len(got) != 1 {
		t.Fatalf("lou's transitions: %v, want only the online", got)
	}
}

// Transitions that reach the node out of order are passed on in order;
// duplicates are dropped; a gap that does not close makes the node send a
// fresh snapshot.
func TestOrderDedupAndResync(t *testing.T) {
	e := newEnv(t)
	n := e.newNode(func(c *Config) { c.gapTimeout = 200 * time.Millisecond })
	c := n.dial(t, token(t, "mo", []string{"*"}, time.Hour), "tab")
	snap := c.join("room").Snapshot
	base, epoch := snap.RoomSeq, snap.Epoch

	sink := natsSink(testnats.Connect(t, e.ns))
	var pubEpoch func(epoch int64, seq uint64, user string)
	pub := func(seq uint64, user string) {
		t.Helper()
		pubEpoch(epoch, seq, user)
	}
	pubEpoch = func(epoch int64, seq uint64, user string) {
		t.Helper()
		tr := presence.Transition{ID: fmt.Sprintf("eu/room/%d/%d", epoch, seq), Region: "eu", Room: "room", User: user, Epoch: epoch,
			Kind: presence.Online, Reason: presence.Joined, Sessions: 1, Seq: seq, At: time.UnixMilli(1)}
		if _, err := sink.Publish(context.Background(), []presence.Transition{tr}); err != nil {
			t.Fatal(err)
		}
	}
	pub(base+2, "u2")
	pub(base+1, "u1")
	pub(base+1, "u1") // duplicate
	pub(base, "old")  // already in the snapshot
	for _, want := range []string{"u1", "u2"} {
		if f := c.expect("event"); f.Event.User != want {
			t.Fatalf("got %s, want %s's event", f.raw, want)
		}
	}
	c.ping()

	pub(base+4, "u4") // base+3 never comes
	f := c.expect("snapshot")
	if f.Reason != "resync" || f.Ref != "" || f.Snapshot.Room != "room" {
		t.Fatalf("resync: %s", f.raw)
	}
	c.ping()

	// An earlier numbering is stale; a later one means the store restarted
	// the room's numbering: start over.
	pubEpoch(epoch-1, base+1, "stale")
	c.ping()
	pubEpoch(epoch+1, 1, "reborn")
	if f := c.expect("snapshot"); f.Reason != "resync" {
		t.Fatalf("after a new epoch: %s", f.raw)
	}
	c.ping()
}

func TestUnknownOriginAndBadRequests(t *testing.T) {
	e := newEnv(t)
	n := e.newNode(func(c *Config) { c.Auth.AllowedOrigins = []string{"https://app.example.com"} })
	tok := token(t, "ned", []string{"*"}, time.Hour)
	h := http.Header{"Authorization": {"Bearer " + tok}, "Origin": {"https://evil.example.com"}}
	if _, resp, err := dialRaw(n.wsURL("session=s"), h); err == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("foreign origin: %v %v", err, resp)
	}
	h.Set("Origin", "https://app.example.com")
	n.dialWith(t, "session=s", h).ping()
	h.Del("Origin")
	if _, resp, err := dialRaw(n.wsURL("session=a.b"), h); err == nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("bad session: %v %v", err, resp)
	}
	if _, resp, err := dialRaw(n.wsURL(""), h); err == nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("no session: %v %v", err, resp)
	}
	resp, err := http.Get(n.srv.URL + PathWebSocket)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("plain GET: %v", resp.Status)
	}
}

func TestHealthAndMetrics(t *testing.T) {
	e := newEnv(t)
	n := e.newNode()
	c := n.dial(t, token(t, "oz", []string{"*"}, time.Hour), "s")
	c.join("room")
	c.send(map[string]string{"type": "nope"})
	c.expectError(protocol.CodeUnknownType, "")

	resp, err := http.Get(n.srv.URL + PathHealth)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("health: %v", resp.Status)
	}
	var h Health
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil || h.Status != "ok" || h.Connections != 1 || h.Sessions != 1 || h.Rooms != 1 {
		t.Fatalf("health body: %+v %v", h, err)
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		resp, err := http.Get(n.srv.URL + PathMetrics)
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		s := string(b)
		for _, want := range []string{
			"presence_node_connections 1", "presence_node_sessions 1", "presence_node_rooms 1", "presence_node_joins_total 1",
			`presence_node_rejected_frames_total{code="unknown_type"} 1`, "presence_node_heartbeat_touch_seconds_count",
		} {
			if !strings.Contains(s, want) {
				return fmt.Errorf("the metrics lack %q", want)
			}
		}
		if strings.Contains(s, "presence_node_heartbeat_touch_seconds_count 0") {
			return errors.New("no heartbeat batch in the metrics yet")
		}
		return nil
	})
}

func TestNotStartedRefuses(t *testing.T) {
	e := newEnv(t)
	n, err := New(testConfig(e.store, testnats.Connect(t, e.ns)))
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	srv := httptest.NewServer(n.Handler())
	defer srv.Close()
	if _, resp, err := dialRaw("ws"+strings.TrimPrefix(srv.URL, "http")+PathWebSocket+"?session=s", http.Header{"Authorization": {"Bearer " + token(t, "p", nil, time.Hour)}}); err == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("before Start: %v %v", err, resp)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != ErrState {
		t.Fatalf("second Start: %v", err)
	}
}

// After NATS reconnects, transitions sent meanwhile may be lost: every
// room starts over from a new snapshot, and the live stream resumes.
func TestNATSReconnectResyncs(t *testing.T) {
	slow(t)
	e := newEnv(t)
	n := e.newNode()
	all := []string{"*"}
	c := n.dial(t, token(t, "pat", all, time.Hour), "tab")
	c.join("room")
	// A watcher of the room (watch lists are read again too) and a count
	// member (its count is read again).
	w := n.dial(t, token(t, "wes", all, time.Hour), "tab")
	w.send(map[string]any{"type": "watch", "room": "room", "users": []string{"pat", "quin"}, "ref": "w"})
	w.expect("watching")
	cnt := n.dial(t, token(t, "cy", all, time.Hour), "tab")
	cnt.send(map[string]any{"type": "join", "room": "room", "view": "count", "ref": "c"})
	if f := cnt.expect("count"); *f.Count != 2 {
		t.Fatalf("count: %s", f.raw)
	}
	if f := c.expect("event"); f.Event.User != "cy" {
		t.Fatalf("pat got %s, want cy's online", f.raw)
	}

	port := e.ns.Addr().(*net.TCPAddr).Port
	e.ns.Shutdown()
	e.ns.WaitForShutdown()
	o := testnats.Options(t)
	o.Port = port
	e.ns = testnats.StartWith(t, o)

	select {
	case f := <-c.frames:
		if f.Type != "snapshot" || f.Reason != "resync" || f.Room != "room" {
			t.Fatalf("after reconnect: %s", f.raw)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("no resync snapshot within 15s of the NATS restart")
	}
	if f := w.expect("watching"); f.Reason != "resync" || f.Ref != "" || !slices.Equal(members(f.Snapshot), []string{"pat"}) {
		t.Fatalf("watcher after reconnect: %s", f.raw)
	}
	b := n.dial(t, token(t, "quin", all, time.Hour), "tab")
	b.join("room")
	if f := c.expect("event"); f.Event.User != "quin" || f.Event.Kind != presence.Online {
		t.Fatalf("live event after resync: %s", f.raw)
	}
	if f := w.expect("event"); f.Event.User != "quin" || f.Event.Kind != presence.Online {
		t.Fatalf("watcher's live event after resync: %s", f.raw)
	}
	for {
		f := cnt.expect("count")
		if *f.Count == 3 {
			break
		}
		if *f.Count != 2 {
			t.Fatalf("count after reconnect: %s, want 2 then 3", f.raw)
		}
	}
}

// A client reconnects to another node while the first still thinks its
// old connection is alive: its join there takes the session over, the
// first node closes the old connection with 4001, and nothing is
// announced: the old node's release of the session changes nothing.
func TestTakeoverClosesTheStaleConnectionSilently(t *testing.T) {
	slow(t)
	e := newEnv(t)
	n1 := e.newNode()
	n2 := e.newNode()
	tok := token(t, "lee", []string{"*"}, time.Hour)
	old := n1.dial(t, tok, "tab")
	old.join("room")
	fresh := n2.dial(t, tok, "tab")
	fresh.join("room")
	old.expectClose(protocol.CloseSessionMoved)
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.Want("sessions n1 holds", n1.keeper.held(), 0) })
	e.waitRedisPast(e.redisNow().Add(testTiming.OfflineGrace + 200*time.Millisecond))
	e.quiesce("room")
	if got := e.rec.Of("", "room", "lee"); len(got) != 1 || got[0].Kind != presence.Online {
		t.Fatalf("lee's transitions: %v, want only the first online", got)
	}
	if live := e.live("room", "lee"); len(live) != 1 || live[0] != "tab" {
		t.Fatalf("live sessions %v, want tab", live)
	}
}

// A node whose store stops answering reports itself degraded (503), so a
// load balancer sends new clients elsewhere.
func TestHealthReportsAnUnreachableStore(t *testing.T) {
	slow(t)
	e := newEnv(t)
	n := e.newNode()
	health := func() (int, Health) {
		resp, err := http.Get(n.srv.URL + PathHealth)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var h Health
		if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, h
	}
	if code, h := health(); code != http.StatusOK || h.Store != "ok" {
		t.Fatalf("before: %d %+v", code, h)
	}
	e.rs.Stop()
	if code, h := health(); code != http.StatusServiceUnavailable || h.Status != "degraded" || h.Store == "ok" || h.Store == "" {
		t.Fatalf("with Redis gone: %d %+v", code, h)
	}
}

// Every node serves the browser client, importable from any origin, with
// an ETag that answers a revalidation with 304.
func TestNodeServesTheBrowserClient(t *testing.T) {
	e := newEnv(t)
	n := e.newNode()
	for path, body := range map[string][]byte{PathClient: jsclient.Source, PathClientTypes: jsclient.Types} {
		resp, err := http.Get(n.srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !bytes.Equal(got, body) || resp.Header.Get("Access-Control-Allow-Origin") != "*" || resp.Header.Get("ETag") == "" {
			t.Fatalf("%s: %d %v, %d bytes, want the embedded file", path, resp.StatusCode, resp.Header, len(got))
		}
		req, _ := http.NewRequest("GET", n.srv.URL+path, nil)
		req.Header.Set("If-None-Match", resp.Header.Get("ETag"))
		again, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		again.Body.Close()
		if again.StatusCode != http.StatusNotModified {
			t.Fatalf("%s revalidated: %d, want 304", path, again.StatusCode)
		}
	}
	if !bytes.Contains(jsclient.Source, []byte("export function createClient")) {
		t.Fatal("the embedded client does not export createClient")
	}
}

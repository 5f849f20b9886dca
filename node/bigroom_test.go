package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/gorilla/websocket"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
)

// Big rooms (docs/PROTOCOL.md): count views, joins without presence and
// watch lists, against real Redis and NATS. Batched events are checked by
// the fold oracle (fold_test.go) and hub-level tests (fanout_test.go).

// observerToken signs a token with the observe claim.
func observerToken(t testing.TB, user string, rooms []string) string {
	t.Helper()
	c := Claims{Rooms: rooms, Observe: true, RegisteredClaims: jwt.RegisteredClaims{Subject: user, ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))}}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(testSecret)
	if err != nil {
		t.Fatalf("sign: %v", err)
	}
	return s
}

// counts collects a client's count frames until the test reads them.
type counts struct {
	last  chan int
	other chan frame
}

func (c *client) countFrames() *counts {
	cs := &counts{last: make(chan int, 1000), other: make(chan frame, 100)}
	go func() {
		for f := range c.frames {
			if f.Type == "count" && f.Count != nil {
				cs.last <- *f.Count
			} else {
				cs.other <- f
			}
		}
	}()
	return cs
}

// waitCount waits until the latest count received is want.
func (cs *counts) waitCount(t *testing.T, want int) int {
	t.Helper()
	got, n := -1, 0
	deadline := time.After(10 * time.Second)
	for got != want {
		select {
		case got = <-cs.last:
			n++
		case f := <-cs.other:
			t.Fatalf("a count member got %s", f.raw)
		case <-deadline:
			t.Fatalf("count stayed %d, want %d", got, want)
		}
	}
	return n
}

func TestACountViewGetsTheCountNeverTheMembers(t *testing.T) {
	e := newEnv(t)
	n := e.newNode(func(c *Config) { c.FanoutTick = 20 * time.Millisecond })
	room := "lobby"
	a := n.dial(t, token(t, "a", []string{"*"}, time.Hour), "s")
	a.join(room)

	counter := n.dial(t, token(t, "counter", []string{"*"}, time.Hour), "s")
	counter.send(map[string]any{"type": "join", "room": room, "view": "count", "ref": "c"})
	reply := counter.expect("count")
	if reply.Ref != "c" || reply.Reason != "join" || reply.Count == nil || *reply.Count != 2 || len(reply.Snapshot.Members) != 0 {
		t.Fatalf("count join reply: %s, want count 2 (a and the counter itself)", reply.raw)
	}
	cs := counter.countFrames()

	var others []*client
	for i := range 12 {
		c := n.dial(t, token(t, fmt.Sprintf("u%02d", i), []string{"*"}, time.Hour), "s")
		c.joinDetail(room, "")
		others = append(others, c)
	}
	frames := cs.waitCount(t, 14)
	for _, c := range others[:5] {
		c.send(map[string]any{"type": "leave", "room": room, "ref": "l"})
	}
	// The grace ends, the five leave; the reaper announces it.
	frames += cs.waitCount(t, 9)
	got, err := n.store.Count(context.Background(), room)
	if err != nil || got != 9 {
		t.Fatalf("store count %d (%v), want 9", got, err)
	}
	// Counts are whole: 17 membership changes may take fewer frames, never
	// more (each frame is a change).
	if frames > 17 {
		t.Fatalf("%d count frames for 17 changes", frames)
	}
}

func TestJoiningWithoutPresenceNeedsTheObserveClaim(t *testing.T) {
	e := newEnv(t)
	n := e.newNode()
	room := "stage"
	a := n.dial(t, token(t, "a", []string{"*"}, time.Hour), "s")
	a.join(room)

	plain := n.dial(t, token(t, "plain", []string{"*"}, time.Hour), "s")
	plain.send(map[string]any{"type": "join", "room": room, "present": false, "ref": "p"})
	plain.expectError(protocol.CodeForbidden, "p")

	obs := n.dial(t, observerToken(t, "obs", []string{"*"}), "s")
	obs.send(map[string]any{"type": "join", "room": room, "view": "count", "present": false, "ref": "o"})
	if f := obs.expect("count"); *f.Count != 1 {
		t.Fatalf("an observer's count: %s, want 1 (a; the observer is not counted)", f.raw)
	}
	obs.send(map[string]any{"type": "join", "room": room, "present": false, "ref": "o2"})
	snap := obs.expect("snapshot").Snapshot
	if snap.Total != 1 || snap.Members[0].User != "a" {
		t.Fatalf("an observer's snapshot: %+v, want a alone", snap)
	}
	obs.send(map[string]any{"type": "state", "room": room, "state": map[string]string{"s": "x"}, "ref": "st"})
	obs.expectError(protocol.CodeNotJoined, "st")
	obs.send(map[string]any{"type": "join", "room": room, "ref": "again"})
	obs.expectError(protocol.CodeInvalidView, "again")
	if live := e.live(room, "obs"); len(live) != 0 {
		t.Fatalf("an observer holds sessions %v", live)
	}
	// It sees the room's events, and leaves as any member does.
	b := n.dial(t, token(t, "b", []string{"*"}, time.Hour), "s")
	b.join(room)
	if f := obs.expect("event"); f.Event.User != "b" || f.Event.Kind != presence.Online {
		t.Fatalf("observer got %s, want b's online", f.raw)
	}
	obs.send(map[string]any{"type": "leave", "room": room, "ref": "l"})
	if f := obs.expect("left"); f.Ref != "l" {
		t.Fatalf("leave: %s", f.raw)
	}
	obs.ping()
	if live := e.live(room, "obs"); len(live) != 0 {
		t.Fatalf("an observer holds sessions %v", live)
	}
}

// A member taking events frames that stops reading is held at a bounded
// queue, and once it reads again gets a resync snapshot from which its
// view is true again: order and exactly-once hold across the gap.
func TestASlowBatchMemberIsResyncedWithABoundedQueue(t *testing.T) {
	e := newEnv(t)
	n := e.newNode(func(c *Config) {
		c.BatchFrom, c.FanoutTick = 1, 10*time.Millisecond
		c.Limits.SnapshotMembers = 5000
		// The client reads nothing for a while, pongs included.
		c.Limits.PingInterval, c.Limits.PongTimeout = time.Minute, time.Minute
	})
	room := "big"
	// A client whose socket takes little: the node's writes block soon.
	d := websocket.Dialer{NetDialContext: (&net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 2048) })
	}}).DialContext}
	h := http.Header{}
	h.Set("Authorization", "Bearer "+token(t, "slow", []string{"*"}, time.Hour))
	ws, _, err := d.Dial(n.wsURL("session=s"), h)
	if err != nil {
		t.Fatal(err)
	}
	if err := ws.WriteJSON(map[string]any{"type": "join", "room": room, "batch": true, "ref": "j"}); err != nil {
		t.Fatal(err)
	}
	// It reads nothing while 600 users join, then change their 900-byte
	// states round after round until the node's writes to it block and
	// its queue reaches the bound (the kernel takes megabytes first).
	ctx := context.Background()
	refs := make([]presence.SessionRef, 600)
	for i := range refs {
		refs[i] = presence.SessionRef{Room: room, User: fmt.Sprintf("u%04d", i), Session: "s"}
	}
	var slow *conn
	behind := func() bool {
		n.hub.mu.Lock()
		defer n.hub.mu.Unlock()
		if r := n.hub.rooms[room]; r != nil {
			for c, m := range r.members {
				if m.behind {
					slow = c
				}
			}
		}
		return slow != nil
	}
	for round := 0; !behind(); round++ {
		if round == 40 {
			// On a loaded machine the events may still be on their way.
			testkit.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
				if !behind() {
					return errors.New("still waiting for 24,000 updates of 900 bytes to make the member fall behind")
				}
				return nil
			})
			break
		}
		if _, err := e.store.Claim(ctx, refs); err != nil { // keeps them alive
			t.Fatal(err)
		}
		state := json.RawMessage(fmt.Sprintf(`{"bio":%q,"round":%d}`, strings.Repeat("x", 900), round))
		for _, ref := range refs {
			if _, err := e.store.SetState(ctx, ref, state); err != nil {
				t.Fatal(err)
			}
		}
	}
	if q := slow.queued(); q > behindFrames+2 { // + a ping, a reply
		t.Fatalf("a member behind has %d frames queued", q)
	}
	// It reads again: a resync, then the room as it is.
	c := &client{t: t}
	c.w = testkit.NewWS(t, ws, decodeFrame)
	c.ws, c.frames = ws, c.w.Frames
	f := newFolder("slow", room, false, c)
	testkit.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		f.mu.Lock()
		defer f.mu.Unlock()
		if !slices.ContainsFunc(f.snaps, func(s string) bool { return strings.HasPrefix(s, "resync@") }) {
			return fmt.Errorf("snapshots %v, no resync among them", f.snaps)
		}
		return nil
	})
	// The 600 were never refreshed: they expire; the view ends with the
	// slow member alone, as the store has it.
	testkit.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		snap, err := n.store.Snapshot(ctx, room, 0, 5000)
		if err != nil {
			return err
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		return errors.Join(testkit.Want("the store's members", snap.Total, 1),
			testkit.Want("the slow member's view (the store's)", fmt.Sprint(f.view), fmt.Sprint(project(snap, false))))
	})
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.errs) > 0 {
		t.Fatalf("the slow member's frames broke the protocol: %v", f.errs)
	}
}

func TestBadViewsAreRefusedAndChangeNothing(t *testing.T) {
	e := newEnv(t)
	n := e.newNode()
	c := n.dial(t, token(t, "c", []string{"*"}, time.Hour), "s")
	for i, req := range []map[string]any{
		{"view": "list"},
		{"view": "count", "detail": "sessions"},
		{"view": "COUNT"},
	} {
		req["type"], req["room"], req["ref"] = "join", "r", fmt.Sprint(i)
		c.send(req)
		c.expectError(protocol.CodeInvalidView, fmt.Sprint(i))
	}
	c.ping()
	if live := e.live("r", "c"); len(live) != 0 || n.hub.count() != 0 {
		t.Fatalf("a refused join left sessions %v and %d rooms", live, n.hub.count())
	}
}

// watching collects a watcher's frames.
func (c *client) expectWatching(ref string) frame {
	c.t.Helper()
	f := c.expect("watching")
	if f.Ref != ref {
		c.t.Fatalf("watching: %s, want ref %q", f.raw, ref)
	}
	return f
}

func members(s presence.Snapshot) []string {
	var us []string
	for _, m := range s.Members {
		us = append(us, m.User)
	}
	return us
}

func TestAWatchListSeesExactlyItsUsers(t *testing.T) {
	e := newEnv(t)
	// The users are on another node: the watcher's node has no member in
	// the room.
	n, other := e.newNode(), e.newNode()
	room := "chat"
	users := map[string]*client{}
	for _, u := range []string{"ann", "bob", "cat"} {
		users[u] = other.dial(t, token(t, u, []string{"*"}, time.Hour), "s")
	}
	users["ann"].join(room)
	users["cat"].join(room)

	w := n.dial(t, token(t, "w", []string{room}, time.Hour), "s")
	w.send(map[string]any{"type": "watch", "room": room, "users": []string{"ann", "bob"}, "ref": "w1"})
	f := w.expectWatching("w1")
	if f.Reason != "watch" || !slices.Equal(f.Users, []string{"ann", "bob"}) || !slices.Equal(members(f.Snapshot), []string{"ann"}) || f.Snapshot.Total != 1 {
		t.Fatalf("watch reply: %s, want ann listed of ann and bob", f.raw)
	}
	// The node follows the two users' subjects, not the room's.
	n.hub.mu.Lock()
	rooms := len(n.hub.rooms)
	n.hub.mu.Unlock()
	n.hub.watches.mu.Lock()
	subs := len(n.hub.watches.watched[room].subs)
	var subjects []string
	for s := range n.hub.watches.watched[room].subs {
		subjects = append(subjects, s.Subject)
	}
	n.hub.watches.mu.Unlock()
	slices.Sort(subjects)
	if rooms != 0 || subs != 2 || !slices.Equal(subjects, []string{bus.UserFilter("eu", room, "ann"), bus.UserFilter("eu", room, "bob")}) {
		t.Fatalf("node subscriptions: %d rooms, watch subjects %v", rooms, subjects)
	}

	after := f.Snapshot.RoomSeq
	expectEvent := func(user string, kind presence.Kind, reason presence.Reason) {
		t.Helper()
		f := w.expect("event")
		if !strings.HasPrefix(f.raw, `{"type":"event","watch":true,`) || f.Event.User != user || f.Event.Kind != kind || f.Event.Reason != reason || f.Event.Seq <= after {
			t.Fatalf("watcher got %s, want %s %s/%s above %d", f.raw, user, kind, reason, after)
		}
		after = f.Event.Seq
	}
	users["cat"].send(map[string]any{"type": "state", "room": room, "state": map[string]string{"s": "away"}, "ref": "s"})
	users["bob"].join(room)
	expectEvent("bob", presence.Online, presence.Joined)
	users["ann"].send(map[string]any{"type": "state", "room": room, "state": map[string]string{"s": "away"}, "ref": "s"})
	expectEvent("ann", presence.Update, presence.State)
	users["bob"].send(map[string]any{"type": "leave", "room": room, "ref": "l"})
	expectEvent("bob", presence.Offline, presence.Left)

	// Replaced: cat only, with her state; then nothing of ann.
	w.send(map[string]any{"type": "watch", "room": room, "users": []string{"cat"}, "ref": "w2"})
	f = w.expectWatching("w2")
	if !slices.Equal(members(f.Snapshot), []string{"cat"}) || string(f.Snapshot.Members[0].Sessions[0].State) != `{"s":"away"}` {
		t.Fatalf("replaced watch: %s, want cat, away", f.raw)
	}
	after = f.Snapshot.RoomSeq
	users["ann"].send(map[string]any{"type": "state", "room": room, "state": nil, "ref": "s"})
	users["cat"].send(map[string]any{"type": "state", "room": room, "state": nil, "ref": "s"})
	expectEvent("cat", presence.Update, presence.State)

	// Ended: nothing more, and no subscription left.
	w.send(map[string]any{"type": "watch", "room": room, "users": []string{}, "ref": "w3"})
	if f := w.expectWatching("w3"); len(f.Users) != 0 || f.Snapshot.Room != "" {
		t.Fatalf("ended watch: %s", f.raw)
	}
	users["cat"].send(map[string]any{"type": "state", "room": room, "state": map[string]string{"s": "back"}, "ref": "s"})
	e.quiesce(room)
	w.ping()
	n.hub.watches.mu.Lock()
	left := len(n.hub.watches.watched)
	n.hub.watches.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d watched rooms after the watch ended", left)
	}
}

func TestBadWatchesAreRefusedAndChangeNothing(t *testing.T) {
	e := newEnv(t)
	n := e.newNode(func(c *Config) { c.Limits.MaxWatches = 1 })
	room := "chat"
	ann := n.dial(t, token(t, "ann", []string{"*"}, time.Hour), "s")
	ann.join(room)
	w := n.dial(t, token(t, "w", []string{room, "other"}, time.Hour), "s")
	w.send(map[string]any{"type": "watch", "room": room, "users": []string{"ann"}, "ref": "ok"})
	w.expectWatching("ok")

	many := make([]string, 101)
	for i := range many {
		many[i] = fmt.Sprintf("u%d", i)
	}
	for _, c := range []struct {
		req  map[string]any
		code protocol.ErrorCode
	}{
		{map[string]any{"room": room}, protocol.CodeInvalidWatch},
		{map[string]any{"room": room, "users": many}, protocol.CodeInvalidWatch},
		{map[string]any{"room": room, "users": []string{"ann", "bad id"}}, protocol.CodeInvalidWatch},
		{map[string]any{"room": room, "users": []string{"ann", "ann"}}, protocol.CodeInvalidWatch},
		{map[string]any{"room": "bad room", "users": []string{"ann"}}, protocol.CodeInvalidRoom},
		{map[string]any{"room": "secret", "users": []string{"ann"}}, protocol.CodeForbidden},
		{map[string]any{"room": "other", "users": []string{"ann"}}, protocol.CodeTooManyRooms},
	} {
		c.req["type"], c.req["ref"] = "watch", string(c.code)
		w.send(c.req)
		w.expectError(c.code, string(c.code))
	}
	w.send(map[string]any{"type": "watch", "room": room, "users": "ann", "ref": "x"})
	w.expectError(protocol.CodeBadFrame, "")
	// The watch of ann still stands.
	ann.send(map[string]any{"type": "state", "room": room, "state": map[string]string{"s": "away"}, "ref": "s"})
	if f := w.expect("event"); f.Event.User != "ann" || f.Event.Reason != presence.State {
		t.Fatalf("after refused watches: %s, want ann's update", f.raw)
	}
}

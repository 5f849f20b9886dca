package node

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testnats"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
)

func TestRevocationsKeepTheLatestWord(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	r := newRevocations()
	r.now = func() time.Time { return now }
	r.set(presence.Revocation{User: "alice", Until: now.Add(time.Hour)})
	r.set(presence.Revocation{User: "bob", Room: "room42", Until: now.Add(time.Minute)})
	if u, ok := r.connect("alice"); !ok || !u.Equal(now.Add(time.Hour)) {
		t.Fatalf("alice connect: %v %v", u, ok)
	}
	if _, ok := r.connect("bob"); ok {
		t.Fatal("a room's revocation barred bob from connecting")
	}
	if u, ok := r.join("bob", "room42"); !ok || !u.Equal(now.Add(time.Minute)) {
		t.Fatalf("bob room42: %v %v", u, ok)
	}
	if _, ok := r.join("bob", "lobby"); ok {
		t.Fatal("bob barred from lobby")
	}
	if u, ok := r.join("alice", "lobby"); !ok || !u.Equal(now.Add(time.Hour)) {
		t.Fatalf("alice lobby: %v %v", u, ok)
	}

	// A read of the store that began before carol's drop does not undo
	// it; what the store adds, or lengthens, is reported fresh.
	mark := r.mark()
	r.set(presence.Revocation{User: "carol", Until: now.Add(time.Hour)})
	fresh := r.replace([]presence.Revocation{
		{User: "alice", Until: now.Add(time.Hour)},                     // held as is
		{User: "bob", Room: "room42", Until: now.Add(2 * time.Minute)}, // lengthened
		{User: "dave", Until: now.Add(time.Minute)},                    // new
	}, mark)
	if len(fresh) != 2 || fresh[0].User != "bob" || fresh[1].User != "dave" {
		t.Fatalf("fresh: %+v", fresh)
	}
	if _, ok := r.connect("carol"); !ok {
		t.Fatal("carol's drop was undone by an older read")
	}
	// A later read without carol takes her out: the store is the truth.
	r.replace(nil, r.mark())
	if _, ok := r.connect("carol"); ok {
		t.Fatal("carol kept after a read that does not hold her")
	}
	// Revocations end on their own.
	r.set(presence.Revocation{User: "erin", Until: now.Add(time.Second)})
	now = now.Add(time.Second)
	if _, ok := r.connect("erin"); ok {
		t.Fatal("erin barred past the end")
	}
}

// closeOf waits for c's end and returns the close code and reason.
func closeOf(t *testing.T, c *client) (int, string) {
	t.Helper()
	err := c.waitEnd()
	var ce *websocket.CloseError
	if !errors.As(err, &ce) {
		t.Fatalf("ended with %v, not a close frame", err)
	}
	return ce.Code, ce.Text
}

// dialRevoked connects a revoked user: the upgrade succeeds, then the
// node closes with 4004 before any hello.
func dialRevoked(t *testing.T, n *node, tok, session string) string {
	t.Helper()
	h := http.Header{}
	h.Set("Authorization", "Bearer "+tok)
	w := testkit.DialWS(t, n.wsURL("session="+session), h, decodeFrame)
	select {
	case f, ok := <-w.Frames:
		if ok {
			t.Fatalf("a revoked user got a frame: %s", f.raw)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a revoked user's connection stayed open")
	}
	_, err := w.End(time.Second)
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != protocol.CloseRevoked {
		t.Fatalf("revoked connect ended with %v, want %d", err, protocol.CloseRevoked)
	}
	return ce.Text
}

func disconnecter(t *testing.T, e *env) *bus.RegionDisconnect {
	t.Helper()
	d, err := bus.NewRegionDisconnect(testnats.Connect(t, e.ns), "eu", e.store)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// A user disconnected from every room with a revocation is closed with
// 4004 on every node and refused at connect until it ends, by nodes
// started later too; their sessions are released as on a clean close.
func TestDisconnectRevokesOnEveryNode(t *testing.T) {
	e := newEnv(t)
	edit := func(c *Config) { c.Revocations = c.Store.(Revocations) }
	a, b := e.newNode(edit), e.newNode(edit)
	tok := token(t, "alice", []string{"*"}, time.Hour)
	ca, cb := a.dial(t, tok, "tab1"), b.dial(t, tok, "tab2")
	ca.join("room42")
	cb.join("lobby")
	bob := a.dial(t, token(t, "bob", []string{"*"}, time.Hour), "tab1")
	bob.join("room42")

	until := time.Now().Add(time.Hour).Truncate(time.Second)
	if _, err := disconnecter(t, e).Disconnect(context.Background(), bus.DisconnectRequest{User: "alice", RevokeUntil: &until}); err != nil {
		t.Fatal(err)
	}
	want := "revoked until " + until.UTC().Format(time.RFC3339)
	for _, c := range []*client{ca, cb} {
		if code, text := closeOf(t, c); code != protocol.CloseRevoked || text != want {
			t.Fatalf("close %d %q, want %d %q", code, text, protocol.CloseRevoked, want)
		}
	}
	bob.ping() // the other user is untouched
	if text := dialRevoked(t, b, tok, "tab3"); text != want {
		t.Fatalf("connect refused with %q", text)
	}
	later := e.newNode(edit)
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if _, ok := later.drops.revs.connect("alice"); !ok {
			return errors.New("the node started later does not refuse alice yet")
		}
		return nil
	})
	dialRevoked(t, later, tok, "tab4")
	// Released, not kept: alice leaves room42 after the grace.
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		return errors.Join(e.rec.WantOf(presence.Offline, "room42", "alice", 1), e.rec.WantOf(presence.Offline, "lobby", "alice", 1))
	})
}

// A disconnect from one room closes the user's connections in it with
// 4003: the client comes back, its other rooms rejoin, and the revoked
// room's join is refused until the revocation ends.
func TestDisconnectFromARoomRefusesItsJoin(t *testing.T) {
	e := newEnv(t)
	n := e.newNode(func(c *Config) { c.Revocations = c.Store.(Revocations) })
	tok := token(t, "bob", []string{"*"}, time.Hour)
	c := n.dial(t, tok, "tab1")
	c.join("room42")
	c.join("lobby")
	other := n.dial(t, tok, "tab2")
	other.join("lobby") // not in room42: stays
	until := time.Now().Add(time.Minute)
	if _, err := disconnecter(t, e).Disconnect(context.Background(), bus.DisconnectRequest{User: "bob", Room: "room42", RevokeUntil: &until}); err != nil {
		t.Fatal(err)
	}
	if code, text := closeOf(t, c); code != protocol.CloseDisconnected || text != "disconnected" {
		t.Fatalf("close %d %q", code, text)
	}
	other.ping()
	c = n.dial(t, tok, "tab1")
	c.join("lobby")
	c.send(map[string]string{"type": "join", "room": "room42", "ref": "r"})
	if f := c.expectError(protocol.CodeRevoked, "r"); !strings.Contains(f.Message, `revoked from room "room42" until `) {
		t.Fatalf("refusal: %s", f.raw)
	}
	// A disconnect without a revocation closes with 4003 and bars nothing.
	if _, err := disconnecter(t, e).Disconnect(context.Background(), bus.DisconnectRequest{User: "bob"}); err != nil {
		t.Fatal(err)
	}
	for _, x := range []*client{c, other} {
		if code, _ := closeOf(t, x); code != protocol.CloseDisconnected {
			t.Fatalf("close %d, want %d", code, protocol.CloseDisconnected)
		}
	}
	n.dial(t, tok, "tab3").join("lobby")
}

// A revocation written while a node missed its drop (here: written to
// the store alone) closes the user's connections at the node's next read.
func TestAMissedDropIsCaughtUpFromTheStore(t *testing.T) {
	e := newEnv(t)
	n := e.newNode(func(c *Config) { c.Revocations = c.Store.(Revocations) })
	c := n.dial(t, token(t, "carol", []string{"*"}, time.Hour), "tab1")
	c.join("room42")
	if err := e.store.Revoke(context.Background(), presence.Revocation{User: "carol", Until: time.Now().Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if code, text := closeOf(t, c); code != protocol.CloseRevoked || !strings.HasPrefix(text, "revoked until ") {
		t.Fatalf("close %d %q", code, text)
	}
}

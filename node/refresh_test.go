package node

import (
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
)

// A token that runs out closes its connection with 4002 and releases the
// sessions: a reconnect with a fresh token inside the grace announces
// nothing, and a user who does not come back leaves once, reason left.
func TestTokenExpiryClosesTheConnection(t *testing.T) {
	slow(t)
	e := newEnv(t)
	n := e.newNode()
	rooms := []string{"room"}
	stay := n.dial(t, token(t, "stay", rooms, 2*time.Second), "s")
	gone := n.dial(t, token(t, "gone", rooms, 2*time.Second), "s")
	for _, c := range []*client{stay, gone} {
		if c.hello.TokenExpires == nil || time.Until(*c.hello.TokenExpires) > 2*time.Second {
			t.Fatalf("hello token_expires %v, want within 2s", c.hello.TokenExpires)
		}
		c.join("room")
	}
	e.quiesce("room")
	stay.expectClose(protocol.CloseTokenExpired)
	back := n.dial(t, token(t, "stay", rooms, time.Hour), "s")
	back.join("room")
	gone.expectClose(protocol.CloseTokenExpired)
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		return e.rec.WantOf(presence.Offline, "room", "gone", 1)
	})
	e.quiesce("room")
	if got := e.rec.Of(presence.Offline, "room", "gone"); got[0].Reason != presence.Left {
		t.Fatalf("gone left with %v, want reason left", got[0].Reason)
	}
	if got := e.rec.Of("", "room", "stay"); len(got) != 1 || got[0].Kind != presence.Online {
		t.Fatalf("stay's transitions %v, want the join only", got)
	}
}

// A refresh moves the expiry, and rooms the new token no longer grants
// are left with an unasked left, reason revoked.
func TestRefreshExtendsTheTokenAndRevokesRooms(t *testing.T) {
	slow(t)
	e := newEnv(t)
	n := e.newNode()
	c := n.dial(t, token(t, "dana", []string{"lobby", "team7-*"}, 3*time.Second), "s") // exp in whole seconds: 2-3 s
	// A control connection whose token expires no earlier than dana's
	// first: once it is closed, that token's expiry has passed.
	ctl := n.dial(t, token(t, "ctl", []string{"lobby"}, 3*time.Second), "s")
	if ctl.hello.TokenExpires.Before(*c.hello.TokenExpires) {
		t.Fatalf("control token expires %v, before dana's %v", ctl.hello.TokenExpires, c.hello.TokenExpires)
	}
	c.join("lobby")
	c.join("team7-a")
	c.send(map[string]string{"type": "refresh", "token": token(t, "dana", []string{"lobby"}, time.Hour), "ref": "r1"})
	if f := c.expect("left"); f.Room != "team7-a" || f.Reason != protocol.ReasonRevoked || f.Ref != "" {
		t.Fatalf("revocation: %s", f.raw)
	}
	f := c.expect("refreshed")
	if f.Ref != "r1" || f.TokenExpires == nil || time.Until(*f.TokenExpires) < 59*time.Minute {
		t.Fatalf("refreshed: %s", f.raw)
	}
	c.send(map[string]string{"type": "join", "room": "team7-b", "ref": "j"})
	c.expectError(protocol.CodeForbidden, "j")
	if live := e.live("team7-a", "dana"); len(live) != 0 {
		t.Fatalf("revoked room still holds %v", live)
	}

	// Past the first token's expiry the connection is still open.
	ctl.expectClose(protocol.CloseTokenExpired)
	c.ping()
	if live := e.live("lobby", "dana"); len(live) != 1 {
		t.Fatalf("lobby sessions %v after the first token's expiry", live)
	}
}

// Bad refreshes get invalid_token, change nothing and keep the connection.
func TestBadRefreshIsRefused(t *testing.T) {
	e := newEnv(t)
	n := e.newNode()
	c := n.dial(t, token(t, "erin", []string{"room"}, time.Hour), "s")
	c.join("room")
	for i, tok := range []string{
		"",
		"garbage",
		token(t, "mallory", []string{"*"}, time.Hour),
		otherKey(t, "erin"),
		token(t, "erin", []string{"room"}, -time.Minute),
	} {
		ref := string(rune('a' + i))
		c.send(map[string]string{"type": "refresh", "token": tok, "ref": ref})
		c.expectError(protocol.CodeInvalidToken, ref)
	}
	c.send(map[string]string{"type": "join", "room": "other", "ref": "j"})
	c.expectError(protocol.CodeForbidden, "j") // the grant is still the first token's
	e.quiesce("room")
	if got := e.rec.Of("", "room", "erin"); len(got) != 1 {
		t.Fatalf("erin's transitions %v, want the join only", got)
	}
}

// otherKey signs a token for user with a key the node does not know.
func otherKey(t *testing.T, user string) string {
	t.Helper()
	c := Claims{Rooms: []string{"*"}, RegisteredClaims: jwt.RegisteredClaims{Subject: user, ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))}}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString([]byte("not the node's secret, 32+ bytes long"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

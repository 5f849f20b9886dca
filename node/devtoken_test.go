package node

import (
	"github.com/presence-dev/presence/protocol"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/presence-dev/presence/internal/testkit"
)

// getDevToken asks the node's dev token endpoint with the query.
func getDevToken(t *testing.T, n *node, query string) (int, http.Header, string) {
	t.Helper()
	return testkit.Get(t, n.srv.URL+PathDevToken+"?"+query, nil)
}

// expectGrant checks that c is user's for about an hour, joins the
// rooms given, and is refused denied.
func (c *client) expectGrant(user string, denied string, rooms ...string) {
	c.t.Helper()
	if c.hello.User != user || c.hello.TokenExpires == nil || time.Until(*c.hello.TokenExpires) < 59*time.Minute {
		c.t.Fatalf("hello: %s, want %s's, expiring in an hour", c.hello.raw, user)
	}
	for _, r := range rooms {
		c.join(r)
	}
	c.send(map[string]any{"type": "join", "room": denied, "ref": "denied"})
	c.expectError(protocol.CodeForbidden, "denied")
}

// A dev node mints real tokens and checks them as a production node
// does: the rooms and observe claims are enforced, the connection gets
// its token's expiry, a refresh takes a later one, and a bad token is
// refused even though ?user= alone would pass.
func TestDevToken(t *testing.T) {
	e := newEnv(t)
	n := e.newNode(func(c *Config) { c.Auth = AuthConfig{InsecureDev: true} })

	code, h, tok := getDevToken(t, n, "user=alice&rooms=room42,team7-*")
	if code != http.StatusOK || h.Get("Content-Type") != "text/plain; charset=utf-8" || h.Get("Access-Control-Allow-Origin") != "*" || h.Get("Cache-Control") != "no-store" {
		t.Fatalf("dev token: %d %v %q", code, h, tok)
	}
	c := n.dialWith(t, "session=s", http.Header{"Sec-Websocket-Protocol": {Subprotocol + ", " + TokenSubprotocolPrefix + tok}})
	c.expectGrant("alice", "team8", "room42", "team7-x")
	c.send(map[string]any{"type": "join", "room": "team7-y", "present": false, "ref": "obs"})
	c.expectError(protocol.CodeForbidden, "obs")

	_, _, short := getDevToken(t, n, "user=alice&rooms=room42,team7-*&ttl=90m")
	c.send(map[string]string{"type": "refresh", "token": short, "ref": "r"})
	c.expect("refreshed")

	_, _, obs := getDevToken(t, n, "user=watcher&observe=true")
	o := n.dial(t, obs, "s")
	o.send(map[string]any{"type": "join", "room": "anything", "present": false, "ref": "o"})
	o.expect("snapshot")

	if code, body := refused(t, n, "session=s&user=alice", http.Header{"Authorization": {"Bearer " + tok + "x"}}); code != http.StatusUnauthorized || !strings.Contains(body, "signature is invalid") {
		t.Fatalf("a forged token on a dev node: %d %s", code, body)
	}
	other := token(t, "alice", []string{"*"}, time.Hour) // another secret than the dev node's
	if code, body := refused(t, n, "session=s", http.Header{"Authorization": {"Bearer " + other}}); code != http.StatusUnauthorized {
		t.Fatalf("a token of another secret on a dev node: %d %s", code, body)
	}
}

// Bad requests get 400 with the rule broken, and mint nothing.
func TestDevTokenBadRequests(t *testing.T) {
	e := newEnv(t)
	n := e.newNode(func(c *Config) { c.Auth = AuthConfig{InsecureDev: true} })
	for query, want := range map[string]string{
		"":                                "?user=<user id> is required",
		"rooms=r":                         "?user=<user id> is required",
		"user=a.b":                        "user:",
		"user=" + strings.Repeat("u", 65): "user:",
		"user=u&rooms=team:*":             `pattern "team:*"`,
		"user=u&rooms=a,,b":               `pattern ""`,
		"user=u&ttl=forever":              `?ttl="forever"`,
		"user=u&ttl=25h":                  `?ttl="25h"`,
		"user=u&ttl=-1m":                  `?ttl="-1m"`,
		"user=u&observe=maybe":            `?observe="maybe"`,
	} {
		code, _, body := getDevToken(t, n, query)
		if code != http.StatusBadRequest || !strings.HasPrefix(body, "node: dev token: ") || !strings.Contains(body, want) {
			t.Errorf("%q: got %d %q, want 400 mentioning %q", query, code, body, want)
		}
	}
	r, err := http.PostForm(n.srv.URL+PathDevToken, url.Values{"user": {"u"}})
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d, want 405", r.StatusCode)
	}
}

// Only a dev node serves the endpoint. A dev node with a secret signs
// its dev tokens with it, so a production node of that secret takes
// them; its tokens also carry the issuer and audience the nodes check.
func TestDevTokenOnlyInDevMode(t *testing.T) {
	e := newEnv(t)
	prod := e.newNode(func(c *Config) { c.Auth.Issuer, c.Auth.Audience = "me", "presence" })
	if code, _, body := getDevToken(t, prod, "user=alice"); code != http.StatusNotFound {
		t.Fatalf("a production node's dev token endpoint: %d %q, want 404", code, body)
	}
	dev := e.newNode(func(c *Config) {
		c.Auth = AuthConfig{InsecureDev: true, HMACSecret: testSecret, Issuer: "me", Audience: "presence"}
	})
	_, _, tok := getDevToken(t, dev, "user=alice&rooms=lobby")
	c := prod.dial(t, tok, "s")
	c.join("lobby")
}

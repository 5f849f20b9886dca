package node

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// The Go recipe's endpoint (Example_presenceTokenEndpoint) mints tokens
// a node takes: its user joins the rooms the recipe grants, and no other.
func TestTokenRecipeJoins(t *testing.T) {
	e := newEnv(t)
	n := e.newNode()
	srv := httptest.NewServer(presenceTokenHandler(testSecret, func(*http.Request) (string, string, bool) { return "alice", "7", true }))
	t.Cleanup(srv.Close)
	resp, err := http.Get(srv.URL + "/presence-token")
	if err != nil {
		t.Fatal(err)
	}
	tok, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	c := n.dial(t, string(tok), "s")
	if c.hello.User != "alice" || c.hello.Expires == nil || time.Until(*c.hello.Expires) < 59*time.Minute {
		t.Fatalf("hello: %s", c.hello.raw)
	}
	c.join("team7-design")
	c.join("lobby")
	c.send(map[string]any{"type": "join", "room": "team8-design", "ref": "x"})
	c.expectError(CodeForbidden, "x")
}

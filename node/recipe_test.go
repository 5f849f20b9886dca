package node

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/presence-dev/presence/internal/testkit"
)

// The Go recipe's endpoint (Example_presenceTokenEndpoint) mints tokens
// a node takes: its user joins the rooms the recipe grants, and no other.
func TestTokenRecipeJoins(t *testing.T) {
	e := newEnv(t)
	n := e.newNode()
	srv := httptest.NewServer(presenceTokenHandler(testSecret, func(*http.Request) (string, string, bool) { return "alice", "7", true }))
	t.Cleanup(srv.Close)
	_, _, tok := testkit.Get(t, srv.URL+"/presence-token", nil)
	n.dial(t, tok, "s").expectGrant("alice", "team8-design", "team7-design", "lobby")
}

package node

import (
	"errors"
	"github.com/presence-dev/presence/protocol"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/gorilla/websocket"
)

// refusalClose dials as h says and returns the close the node sent after
// accepting the handshake, and the subprotocol it selected.
func refusalClose(t *testing.T, n *node, query string, h http.Header) (*websocket.CloseError, string) {
	t.Helper()
	ws, resp, err := dialRaw(n.wsURL(query), h)
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.Fatalf("handshake refused (%v, status %d): want it accepted and closed", err, status)
	}
	defer ws.Close()
	_ = ws.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, msg, err := ws.ReadMessage()
	var ce *websocket.CloseError
	if !errors.As(err, &ce) {
		t.Fatalf("read %q, %v: want a close", msg, err)
	}
	return ce, ws.Subprotocol()
}

// A handshake with an Origin and without Authorization (a browser's)
// that fails authentication is accepted and closed with 4401 and the
// refusal; the same handshake without Origin, or with Authorization, is
// refused with 401 as before. A good token with an Origin gets hello.
func TestBrowserAuthRefusalIsReadable(t *testing.T) {
	e := newEnv(t)
	n := e.newNode()
	expired := token(t, "alice", []string{"*"}, -time.Minute)
	browser := func(protocols string) http.Header {
		return http.Header{"Origin": {"https://app.example.com"}, "Sec-Websocket-Protocol": {protocols}}
	}
	before := counterValue(t, n.metrics.rejectedConns.WithLabelValues("auth"))

	cases := []struct {
		name, query string
		h           http.Header
		want        string
	}{
		{"expired token as a subprotocol", "session=s", browser(Subprotocol + ", " + TokenSubprotocolPrefix + expired), "token is expired"},
		{"bad signature in the query", "session=s&access_token=" + expired + "x", http.Header{"Origin": {"https://app.example.com"}}, "token"},
		{"no token", "session=s", browser(Subprotocol), "no token"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ce, proto := refusalClose(t, n, c.query, c.h)
			if ce.Code != protocol.CloseUnauthorized || !strings.Contains(ce.Text, c.want) || strings.HasPrefix(ce.Text, "node: auth: ") {
				t.Fatalf("close %d %q, want %d mentioning %q", ce.Code, ce.Text, protocol.CloseUnauthorized, c.want)
			}
			if offered := c.h.Get("Sec-Websocket-Protocol"); offered != "" && proto != Subprotocol {
				t.Fatalf("selected subprotocol %q, want %q (a browser fails a connection without it)", proto, Subprotocol)
			}
		})
	}
	if got := counterValue(t, n.metrics.rejectedConns.WithLabelValues("auth")) - before; got != float64(len(cases)) {
		t.Fatalf("rejected_connections_total{reason=auth} rose by %v, want %d", got, len(cases))
	}

	// Not a browser: the 401 with its body, as before.
	if code, body := refused(t, n, "session=s", http.Header{"Sec-Websocket-Protocol": {Subprotocol + ", " + TokenSubprotocolPrefix + expired}}); code != http.StatusUnauthorized || !strings.Contains(body, "token is expired") {
		t.Fatalf("without Origin: %d %q, want 401", code, body)
	}
	h := http.Header{"Origin": {"https://app.example.com"}, "Authorization": {"Bearer " + expired}}
	if code, body := refused(t, n, "session=s", h); code != http.StatusUnauthorized || !strings.Contains(body, "token is expired") {
		t.Fatalf("with Origin and Authorization: %d %q, want 401", code, body)
	}
	// A good token from a browser: hello, as ever.
	c := n.dialWith(t, "session=s", browser(Subprotocol+", "+TokenSubprotocolPrefix+token(t, "alice", []string{"*"}, time.Hour)))
	if c.hello.User != "alice" {
		t.Fatalf("hello: %s", c.hello.raw)
	}
}

// A dev node's refusal of a browser without a token or ?user= says so.
func TestBrowserDevRefusalNamesUser(t *testing.T) {
	e := newEnv(t)
	n := e.newNode(func(c *Config) { c.Auth = AuthConfig{InsecureDev: true} })
	ce, _ := refusalClose(t, n, "session=s", http.Header{"Origin": {"http://127.0.0.1:8080"}})
	if ce.Code != protocol.CloseUnauthorized || !strings.Contains(ce.Text, "?user=") || !strings.Contains(ce.Text, PathDevToken) {
		t.Fatalf("close %d %q, want %d naming ?user= and %s", ce.Code, ce.Text, protocol.CloseUnauthorized, PathDevToken)
	}
	if code, body := refused(t, n, "session=s", http.Header{}); code != http.StatusUnauthorized || !strings.Contains(body, "?user=") {
		t.Fatalf("without Origin: %d %s, want 401", code, body)
	}
}

func TestCloseReasonFitsAFrame(t *testing.T) {
	for _, s := range []string{"", "short", strings.Repeat("a", 123), strings.Repeat("a", 200), strings.Repeat("é", 100), "x" + strings.Repeat("€", 60)} {
		got := closeReason(s)
		if len(got) > maxCloseReason || !utf8.ValidString(got) || !strings.HasPrefix(s, got) {
			t.Fatalf("closeReason(%d bytes) = %d bytes %q", len(s), len(got), got)
		}
		if len(s) <= maxCloseReason && got != s {
			t.Fatalf("closeReason cut %q, which fits", s)
		}
		if len(s) > maxCloseReason && len(got) < maxCloseReason-3 {
			t.Fatalf("closeReason cut %d bytes to %d: more than a rune", len(s), len(got))
		}
	}
	// Every refusal the authenticator makes fits once cut, and FormatCloseMessage takes it.
	if m := websocket.FormatCloseMessage(protocol.CloseUnauthorized, closeReason(strings.Repeat("z", 500))); len(m) > 125 {
		t.Fatalf("close payload of %d bytes", len(m))
	}
}

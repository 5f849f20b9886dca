package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/presence-dev/presence/internal/testkit"
)

// A newcomer's first mistakes, in real Chromium against presenced dev:
// a token endpoint that answers 404, one that answers something that is
// not a JWT, a client with neither a token nor a user, a token the node
// refuses, a URL with no node behind it. Each surfaces once as the
// documented error (clients/js/README.md, "Errors"), and the client
// stops or backs off as documented. The pages pass random: () => 0.999,
// so the backoff before a first hello is 0.999 * min(10 s, 500 ms * 2^n).
func TestBrowserClientConnectErrors(t *testing.T) {
	b := newBrowser(t)
	n := startDev(t)
	pg := newErrorsPage(t, n.addr)
	ws := "ws://" + n.addr + "/v1/ws"

	// A getToken that fails never makes a socket: one error, and tries
	// that back off, still connecting.
	tokenFails := func(t *testing.T, name, query, code, what string) clientError {
		t.Helper()
		tb := b.open(name, pg.url(ws, query), true)
		v := waitErrors(t, tb, 8*time.Second, func(v errorsView) bool { return len(v.Tokens) >= 4 })
		e := v.once(t, code, what)
		v.noSockets(t)
		v.backsOff(t, v.Tokens)
		v.stillTrying(t)
		return e
	}
	t.Run("token endpoint 404, r.ok checked", func(t *testing.T) {
		tokenFails(t, "404-checked", "token=/404-html&check=1", "token_error", "404")
	})
	t.Run("token endpoint 404 read as text: an HTML page as the token", func(t *testing.T) {
		// No bearer.<!DOCTYPE… subprotocol: no WebSocket at all.
		e := tokenFails(t, "404-text", "token=/404-html", "token_not_jwt", "HTML page")
		if !strings.Contains(e.Message, "r.ok") || !strings.Contains(e.Message, "<!DOCTYPE") {
			t.Fatalf("message %q: want it to show the page's start and name r.ok", e.Message)
		}
	})
	t.Run("a token that is not a JWT: JSON", func(t *testing.T) {
		tokenFails(t, "json", "token=/token-json&check=1", "token_not_jwt", ".token")
	})
	t.Run("dev node without user", func(t *testing.T) {
		tb := b.open("no-user", pg.url(ws, ""), true)
		v := waitErrors(t, tb, 8*time.Second, func(v errorsView) bool { return v.Status == "closed" })
		e := v.once(t, "unauthorized", "?user=")
		if e.CloseCode != 4401 || !strings.Contains(e.CloseReason, "dev mode needs a token") || !strings.Contains(e.Hint, "user option") {
			t.Fatalf("error %+v: want close 4401, the node's reason and a hint naming the user option", e)
		}
		// Stopped: one socket, closed with 4401, and none after it.
		waitErrors(t, tb, 3*time.Second, func(v errorsView) bool { return len(v.Closes) == 1 })
		stopped := time.Now().Add(3 * time.Second)
		v = waitErrors(t, tb, 10*time.Second, func(errorsView) bool { return time.Now().After(stopped) })
		if len(v.Sockets) != 1 || len(v.Closes) != 1 || v.Closes[0].Code != 4401 || v.Status != "closed" || len(v.Errors) != 1 {
			t.Fatalf("after the refusal: %s", v)
		}
		tb.noConsoleErrors()
	})
	t.Run("a token the node refuses", func(t *testing.T) {
		tb := b.open("bad-signature", pg.url(ws, "token=/token-foreign&check=1"), true)
		v := waitErrors(t, tb, 10*time.Second, func(v errorsView) bool { return len(v.Sockets) >= 4 })
		e := v.once(t, "unauthorized", "signature")
		if e.CloseCode != 4401 || !strings.Contains(e.Hint, "fresh token was refused too") {
			t.Fatalf("error %+v", e)
		}
		for _, c := range v.Closes {
			if c.Code != 4401 {
				t.Fatalf("closes %+v: want every one 4401", v.Closes)
			}
		}
		v.backsOff(t, v.Sockets)
		v.stillTrying(t)
	})
	t.Run("no node behind the URL", func(t *testing.T) {
		tb := b.open("no-node", pg.url("ws://"+noNode(t)+"/v1/ws", "user=alice"), true)
		v := waitErrors(t, tb, 15*time.Second, func(v errorsView) bool { return len(v.Sockets) >= 4 })
		e := v.once(t, "connect_refused", "3 connections in a row")
		if e.CloseCode != 1006 || !strings.Contains(e.Hint, "token endpoint") {
			t.Fatalf("error %+v", e)
		}
		v.backsOff(t, v.Sockets)
		v.stillTrying(t)
	})
}

// noNode is a proxy with no node behind it: every request gets a 502,
// WebSocket handshakes too (a browser sees close 1006).
func noNode(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no upstream", http.StatusBadGateway)
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// errorsPage serves the page of the connect errors test, the client
// (from the node), and token endpoints that go wrong.
type errorsPage struct{ srv *httptest.Server }

func newErrorsPage(t *testing.T, nodeAddr string) *errorsPage {
	t.Helper()
	foreign, err := testkit.Token([]byte("a-secret-the-node-does-not-know-0123456789"), "alice", []string{"*"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(errorsPageHTML))
	})
	mux.HandleFunc("GET /favicon.ico", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.Handle("GET /v1/client.js", httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: nodeAddr}))
	// What a web server answers for a path it does not have.
	mux.HandleFunc("GET /404-html", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte("<!DOCTYPE HTML PUBLIC \"-//IETF//DTD HTML 2.0//EN\">\n<html><head><title>404 Not Found</title></head><body><h1>Not Found</h1></body></html>\n"))
	})
	mux.HandleFunc("GET /token-json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"token":%q}`, foreign)
	})
	mux.HandleFunc("GET /token-foreign", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte(foreign))
	})
	p := &errorsPage{srv: httptest.NewServer(mux)}
	t.Cleanup(p.srv.Close)
	return p
}

func (p *errorsPage) url(ws, query string) string {
	return p.srv.URL + "/?ws=" + url.QueryEscape(ws) + "&" + query
}

// errorsPageHTML runs one client: ?ws= the node, ?user= dev mode's user,
// ?token= the token endpoint (?check=1: the README's getToken, which
// checks r.ok; without: fetch(…).then(r => r.text())). It records what
// the test reads in window.view().
const errorsPageHTML = `<!doctype html>
<html lang="en">
<meta charset="utf-8">
<title>presence connect errors</title>
<script type="module">
import { createClient } from "/v1/client.js";

const q = new URLSearchParams(location.search);
const log = { errors: [], statuses: [], sockets: [], closes: [], tokens: [] };
// Records every socket the client makes, and how it closed.
function RecordingWebSocket(url, protocols) {
  log.sockets.push({ at: Date.now(), protocols: [].concat(protocols || []) });
  const ws = new WebSocket(url, protocols);
  ws.addEventListener("close", e => log.closes.push({ code: e.code, reason: e.reason }));
  return ws;
}
const opts = { url: q.get("ws"), WebSocket: RecordingWebSocket, random: () => 0.999 };
if (q.has("user")) opts.user = q.get("user");
if (q.has("token")) {
  const endpoint = q.get("token");
  opts.getToken = q.get("check") === "1"
    ? async () => {
        log.tokens.push({ at: Date.now() });
        const r = await fetch(endpoint, { cache: "no-store" });
        if (!r.ok) throw new Error("token endpoint answered " + r.status);
        return r.text();
      }
    : () => { log.tokens.push({ at: Date.now() }); return fetch(endpoint, { cache: "no-store" }).then((r) => r.text()); };
}
const client = createClient(opts);
client.room("errors");
client.on("status", s => log.statuses.push(s));
client.on("error", e => log.errors.push({ code: e.code, message: e.message, closeCode: e.closeCode, closeReason: e.closeReason, hint: e.hint }));
window.view = () => ({ ready: true, status: client.status, ...log });
</script>
</html>
`

type errorsView struct {
	Ready    bool          `json:"ready"`
	Status   string        `json:"status"`
	Errors   []clientError `json:"errors"`
	Statuses []string      `json:"statuses"`
	Sockets  []attempt     `json:"sockets"`
	Closes   []struct {
		Code   int    `json:"code"`
		Reason string `json:"reason"`
	} `json:"closes"`
	Tokens []attempt `json:"tokens"`
}

type clientError struct {
	Code        string `json:"code"`
	Message     string `json:"message"`
	CloseCode   int    `json:"closeCode"`
	CloseReason string `json:"closeReason"`
	Hint        string `json:"hint"`
}

type attempt struct {
	At        int64    `json:"at"` // Date.now() in the page
	Protocols []string `json:"protocols"`
}

func (v errorsView) String() string {
	return fmt.Sprintf("status %s, errors %+v, statuses %v, %d sockets, closes %+v, %d tokens", v.Status, v.Errors, v.Statuses, len(v.Sockets), v.Closes, len(v.Tokens))
}

// once checks that exactly one error came, of code, its message
// mentioning what, and returns it.
func (v errorsView) once(t *testing.T, code, what string) clientError {
	t.Helper()
	if len(v.Errors) != 1 || v.Errors[0].Code != code || !strings.Contains(v.Errors[0].Message, what) {
		t.Fatalf("want one %s error mentioning %q; %s", code, what, v)
	}
	return v.Errors[0]
}

func (v errorsView) noSockets(t *testing.T) {
	t.Helper()
	if len(v.Sockets) != 0 {
		t.Fatalf("the client made sockets: %+v", v.Sockets)
	}
}

// stillTrying checks that the client backs off, not stops: it is
// connecting, never closed.
func (v errorsView) stillTrying(t *testing.T) {
	t.Helper()
	if v.Status != "connecting" || len(v.Statuses) != 0 {
		t.Fatalf("want the client connecting all along (statuses none after connecting); %s", v)
	}
}

// backsOff checks the gaps between tries: at least the backoff before a
// first hello, 0.999 * min(10 s, 500 ms * 2^n) (late timers in a loaded
// browser only make them longer).
func (v errorsView) backsOff(t *testing.T, tries []attempt) {
	t.Helper()
	for i := 1; i < len(tries); i++ {
		gap := time.Duration(tries[i].At-tries[i-1].At) * time.Millisecond
		want := time.Duration(0.999*float64(min(10000, 500<<(i-1)))) * time.Millisecond
		if gap < want-5*time.Millisecond {
			t.Fatalf("try %d came %v after the one before, want at least %v; %s", i, gap, want, v)
		}
	}
}

func waitErrors(t *testing.T, tb *tab, within time.Duration, cond func(errorsView) bool) errorsView {
	t.Helper()
	last, err := pollPage(tb, `window.view ? window.view() : {ready: false}`, within, func(v errorsView) bool { return v.Ready && cond(v) })
	if err != nil {
		t.Fatalf("%s: %v; last %s", tb.name, err, last)
	}
	return last
}

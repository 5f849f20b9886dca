package testkit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/presence-dev/presence/internal/testkit"
)

// echoServer accepts WebSocket connections that carry X-Test: yes,
// offering subprotocol p1, and echoes every message; on "close" it closes
// with code 4001.
func echoServer(t *testing.T) string {
	up := websocket.Upgrader{Subprotocols: []string{"p1"}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Test") != "yes" {
			http.Error(w, "no header", http.StatusForbidden)
			return
		}
		ws, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer ws.Close()
		for {
			mt, msg, err := ws.ReadMessage()
			if err != nil {
				return
			}
			if string(msg) == "close" {
				_ = ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(4001, "bye"), time.Now().Add(time.Second))
				continue // until the client answers the close
			}
			if err := ws.WriteMessage(mt, msg); err != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	return "ws" + strings.TrimPrefix(srv.URL, "http")
}

func header() http.Header {
	return http.Header{"X-Test": {"yes"}, "Sec-Websocket-Protocol": {"p1"}}
}

func str(msg []byte) (string, bool) { return string(msg), true }

func TestWS(t *testing.T) {
	w := testkit.DialWS(t, echoServer(t), header(), str)
	if got := w.Conn.Subprotocol(); got != "p1" {
		t.Fatalf("subprotocol %q, want p1", got)
	}
	w.Send(map[string]int{"n": 1})
	if f := w.Next(5 * time.Second); f != `{"n":1}` {
		t.Fatalf("echo %q", f)
	}
	w.SendRaw(websocket.TextMessage, []byte("a"))
	w.SendRaw(websocket.TextMessage, []byte("b"))
	if f := w.Await(5*time.Second, "b", func(f string) bool { return f == "b" }); f != "b" {
		t.Fatalf("await: %q", f)
	}
	w.SendRaw(websocket.TextMessage, []byte("unread"))
	w.SendRaw(websocket.TextMessage, []byte("close"))
	code, err := w.End(5 * time.Second)
	if code != 4001 || !websocket.IsCloseError(err, 4001) || w.Err() != err {
		t.Fatalf("end: code %d, error %v", code, err)
	}
}

func TestWSDecoderDrops(t *testing.T) {
	w := testkit.DialWS(t, echoServer(t), header(), func(msg []byte) (string, bool) {
		return string(msg), string(msg) != "drop"
	})
	w.SendRaw(websocket.TextMessage, []byte("drop"))
	w.SendRaw(websocket.TextMessage, []byte("keep"))
	if f := w.Next(5 * time.Second); f != "keep" {
		t.Fatalf("got %q, want the dropped message skipped", f)
	}
}

func TestWSEndWithoutCloseFrame(t *testing.T) {
	w := testkit.DialWS(t, echoServer(t), header(), testkit.Bytes)
	_ = w.Conn.NetConn().Close()
	if code, err := w.End(5 * time.Second); code != -1 || err == nil {
		t.Fatalf("end: code %d, error %v; want -1 and an error", code, err)
	}
}

func TestWSRefused(t *testing.T) {
	url := echoServer(t)
	_, resp, err := testkit.DialRaw(url, nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("dial without the header: %v, %v", resp, err)
	}
	_ = resp.Body.Close()
	msg := fatal(t, func(tb testing.TB) { testkit.DialWS(tb, url, nil, testkit.Bytes) })
	if !strings.Contains(msg, "HTTP 403: no header") {
		t.Fatalf("failure %q, want the refusal's status and body", msg)
	}
}

func TestWSFailures(t *testing.T) {
	w := testkit.DialWS(t, echoServer(t), header(), testkit.Bytes)
	msg := fatal(t, func(tb testing.TB) { w.In(tb).Next(20 * time.Millisecond) })
	if msg != "timed out after 20ms waiting for a frame" {
		t.Fatalf("timeout failure %q", msg)
	}
	w.SendRaw(websocket.TextMessage, []byte("close"))
	msg = fatal(t, func(tb testing.TB) { w.In(tb).Await(5*time.Second, "a pong", nil) })
	if !strings.HasPrefix(msg, "connection ended (websocket: close 4001") || !strings.HasSuffix(msg, "while waiting for a pong") {
		t.Fatalf("end failure %q", msg)
	}
}

// fatalTB records a fatal failure and ends its goroutine, as testing.T
// does.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// fatal runs fn on its own goroutine and returns the fatal failure it
// reported, failing t if there was none.
func fatal(t *testing.T, fn func(testing.TB)) string {
	t.Helper()
	tb := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() { defer close(done); fn(tb) }()
	<-done
	if tb.msg == "" {
		t.Fatal("no failure reported")
	}
	return tb.msg
}

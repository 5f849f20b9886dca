package testkit

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// HandshakeTimeout bounds a test client's WebSocket handshake.
const HandshakeTimeout = 10 * time.Second

// frameQueue is how many frames a WS holds unread before its reader
// stops reading (and the server sees a slow consumer).
const frameQueue = 1024

// DialRaw performs a WebSocket handshake with header h. The subprotocols
// offered are those h's Sec-WebSocket-Protocol names (the dialer refuses
// that header among the others).
func DialRaw(url string, h http.Header) (*websocket.Conn, *http.Response, error) {
	d := websocket.Dialer{HandshakeTimeout: HandshakeTimeout, Subprotocols: websocket.Subprotocols(&http.Request{Header: h}),
		EnableCompression: h.Get(DeflateHeader) != ""}
	h = h.Clone()
	h.Del("Sec-Websocket-Protocol")
	h.Del(DeflateHeader)
	return d.Dial(url, h)
}

// DeflateHeader in the header given to DialRaw or DialWS makes the client
// offer permessage-deflate (gorilla refuses the extension header itself).
// It is not sent.
const DeflateHeader = "X-Test-Deflate"

// Decoder turns a message into a frame; ok false drops the message.
type Decoder[F any] func(msg []byte) (f F, ok bool)

// Bytes is the Decoder that keeps every message as it came.
func Bytes(msg []byte) ([]byte, bool) { return msg, true }

// WS is a test WebSocket client. Its reader goroutine answers pings
// (gorilla's default handler), decodes each message into an F and queues
// it on Frames, which is closed when the connection ends. Failures are
// reported to the test it was dialed for, or the one In names.
type WS[F any] struct {
	Conn   *websocket.Conn
	Frames <-chan F
	t      testing.TB
	end    *wsEnd
}

// wsEnd is shared by a WS and its In copies.
type wsEnd struct {
	err error // the reader's error; written before Frames is closed
}

// DialWS dials url with header h (see DialRaw) and starts the reader; a
// refused handshake fails t with its HTTP status and body. The
// connection is closed when t ends.
func DialWS[F any](t testing.TB, url string, h http.Header, decode Decoder[F]) *WS[F] {
	t.Helper()
	ws, resp, err := DialRaw(url, h)
	if err != nil {
		t.Fatalf("dial %s: %v%s", url, err, refusal(resp))
	}
	return NewWS(t, ws, decode)
}

// NewWS starts the reader on ws, a connection dialed otherwise (over TLS,
// say). The connection is closed when t ends.
func NewWS[F any](t testing.TB, ws *websocket.Conn, decode Decoder[F]) *WS[F] {
	t.Cleanup(func() { _ = ws.Close() })
	frames := make(chan F, frameQueue)
	w := &WS[F]{Conn: ws, Frames: frames, t: t, end: &wsEnd{}}
	go w.read(frames, decode)
	return w
}

// refusal describes a refused handshake's response, if there was one.
func refusal(resp *http.Response) string {
	if resp == nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024)) // what was read is all the message needs
	return fmt.Sprintf(" (HTTP %d: %s)", resp.StatusCode, b)
}

func (w *WS[F]) read(frames chan<- F, decode Decoder[F]) {
	defer close(frames)
	for {
		_, msg, err := w.Conn.ReadMessage()
		if err != nil {
			w.end.err = err
			return
		}
		if f, ok := decode(msg); ok {
			frames <- f
		}
	}
}

// In returns w reporting failures to t: the same connection and frames.
// Only one test may use them at a time.
func (w *WS[F]) In(t testing.TB) *WS[F] {
	c := *w
	c.t = t
	return &c
}

// Send writes v as a JSON text message.
func (w *WS[F]) Send(v any) {
	w.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		w.t.Fatalf("send: %v", err)
	}
	w.SendRaw(websocket.TextMessage, b)
}

// SendRaw writes one message of type mt.
func (w *WS[F]) SendRaw(mt int, b []byte) {
	w.t.Helper()
	if err := w.Conn.WriteMessage(mt, b); err != nil {
		w.t.Fatalf("send: %v", err)
	}
}

// SendClose writes a close frame with code and text; the connection ends
// when the server answers it (see End). A connection already ending
// cannot take it, which End then tells.
func (w *WS[F]) SendClose(code int, text string) {
	msg := websocket.FormatCloseMessage(code, text)
	_ = w.Conn.WriteControl(websocket.CloseMessage, msg, time.Now().Add(time.Second))
}

// Next returns the next frame, failing the test if none comes within
// timeout or the connection ends first.
func (w *WS[F]) Next(timeout time.Duration) F {
	w.t.Helper()
	return w.Await(timeout, "a frame", nil)
}

// Await returns the first frame for which match holds (any frame, if
// match is nil), skipping the others, failing the test if none comes
// within timeout or the connection ends first; what names it in the
// failure.
func (w *WS[F]) Await(timeout time.Duration, what string, match func(F) bool) F {
	w.t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		select {
		case f, ok := <-w.Frames:
			if !ok {
				w.t.Fatalf("connection ended (%v) while waiting for %s", w.end.err, what)
			}
			if match == nil || match(f) {
				return f
			}
		case <-deadline.C:
			w.t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
	}
}

// End waits for the connection to end, skipping frames still queued, and
// returns its close code (-1 if it ended without a close frame) and the
// reader's error; it fails the test if the end does not come within
// timeout.
func (w *WS[F]) End(timeout time.Duration) (code int, err error) {
	w.t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		select {
		case _, ok := <-w.Frames:
			if ok {
				continue
			}
			var ce *websocket.CloseError
			if errors.As(w.end.err, &ce) {
				return ce.Code, w.end.err
			}
			return -1, w.end.err
		case <-deadline.C:
			w.t.Fatalf("connection did not end within %v", timeout)
		}
	}
}

// Err returns the reader's error: why the connection ended. It is valid
// once Frames is closed.
func (w *WS[F]) Err() error { return w.end.err }

package node

import (
	"errors"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/gorilla/websocket"
)

// A browser cannot read the status, headers or body of a refused
// WebSocket handshake: its socket only closes with 1006. So a handshake
// that looks like a browser's and fails authentication is accepted and
// closed at once with CloseUnauthorized and the refusal as the reason,
// which a page can read. Every other client keeps getting the 401.

// maxCloseReason is the most a close frame's reason may hold (RFC 6455:
// 125 bytes of payload, 2 of them the code).
const maxCloseReason = 123

// closeGrace bounds the wait for the client's answer to a refusal close.
const closeGrace = time.Second

// fromBrowser reports whether a handshake looks like a browser's: it has
// an Origin (every browser sends one on a WebSocket handshake) and no
// Authorization header (which a browser's WebSocket cannot send).
func fromBrowser(r *http.Request) bool {
	return r.Header.Get("Origin") != "" && r.Header.Get("Authorization") == ""
}

// closeReason cuts s to what a close frame holds, on a rune boundary.
func closeReason(s string) string {
	if len(s) <= maxCloseReason {
		return s
	}
	s = s[:maxCloseReason]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// refuseUpgraded closes a just upgraded connection with code and reason,
// and waits up to closeGrace for the client's close, so that the close
// frame is not lost to a reset of the socket.
func refuseUpgraded(ws *websocket.Conn, code int, reason string) {
	defer ws.Close()
	deadline := time.Now().Add(closeGrace)
	if err := ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, closeReason(reason)), deadline); err != nil {
		return
	}
	_ = ws.SetReadDeadline(deadline)
	for {
		if _, _, err := ws.NextReader(); err != nil {
			return // the client's close, or the deadline
		}
	}
}

// authReason is the reason a refusal close carries: the refusal without
// the "node: auth: " prefix of its error.
func authReason(err error) string {
	var ae *authError
	if errors.As(err, &ae) {
		return ae.reason
	}
	return err.Error()
}

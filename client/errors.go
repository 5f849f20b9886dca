package client

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gorilla/websocket"

	"github.com/presence-dev/presence/protocol"
)

var (
	// ErrClosed is returned by calls on a client that Close ended.
	ErrClosed = errors.New("presence client: closed")
	// ErrDisconnected is returned by a call whose connection ended before
	// the node answered. Rooms, states and watch lists are sent again
	// once the client has reconnected.
	ErrDisconnected = errors.New("presence client: disconnected")
)

// HandshakeError is a refusal before the upgrade: 401 for a bad token
// (Message says why), 400, 403, or 503 from a node that is draining or
// full.
type HandshakeError struct {
	Status  int
	Message string
}

func (e *HandshakeError) Error() string {
	return fmt.Sprintf("presence client: handshake refused with %d: %s", e.Status, e.Message)
}

// TokenError is a failure of the token source.
type TokenError struct{ Err error }

func (e *TokenError) Error() string { return "presence client: token source: " + e.Err.Error() }
func (e *TokenError) Unwrap() error { return e.Err }

// CloseError is the end of a connection by a close frame of the node
// (docs/PROTOCOL.md, "Close codes"): handed to Config.OnDisconnect for
// every connection that ends, and the client's Err after a close that
// ends it (protocol.CloseSessionMoved, protocol.CloseRevoked).
type CloseError struct {
	Code   int
	Reason string
	// RevokedUntil, on protocol.CloseRevoked, is when the client may
	// connect again (zero if the reason does not say).
	RevokedUntil time.Time
}

func (e *CloseError) Error() string {
	return fmt.Sprintf("presence client: connection closed with %d %q", e.Code, e.Reason)
}

// closeErrorOf returns err as a *CloseError, or nil when the connection
// did not end with a close frame (the network dropped: 1006).
func closeErrorOf(err error) *CloseError {
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code == websocket.CloseAbnormalClosure {
		return nil
	}
	e := &CloseError{Code: ce.Code, Reason: ce.Text}
	if ce.Code == protocol.CloseRevoked {
		if t, err := time.Parse(time.RFC3339, strings.TrimPrefix(ce.Text, protocol.RevokedUntilPrefix)); err == nil {
			e.RevokedUntil = t
		}
	}
	return e
}

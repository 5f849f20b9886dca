package load

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/gorilla/websocket"
)

// Refusal is an error frame answering a join or watch (or a command to
// Centrifugo): its code, counted by code.
type Refusal struct{ Code, Msg string }

// Error is the refusal's code and message.
func (r *Refusal) Error() string { return r.Code + ": " + r.Msg }

// CloseReason names how a connection ended, without its addresses (so
// that reasons can be counted).
func CloseReason(err error) string {
	var ce *websocket.CloseError
	switch {
	case errors.As(err, &ce):
		return fmt.Sprintf("close %d", ce.Code)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "EOF"
	}
	msg := err.Error()
	for _, k := range []string{"i/o timeout", "connection reset by peer", "broken pipe", "use of closed network connection"} {
		if strings.Contains(msg, k) {
			return k
		}
	}
	return msg
}

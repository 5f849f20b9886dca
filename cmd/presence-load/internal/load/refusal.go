package load

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/gorilla/websocket"
)

// refusal is an error frame answering the join or watch.
type Refusal struct{ Code, Msg string }

func (r *Refusal) Error() string { return r.Code + ": " + r.Msg }

// closeReason names how a connection ended, without its addresses (so
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

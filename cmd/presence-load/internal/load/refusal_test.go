package load

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/gorilla/websocket"
)

func TestCloseReasonDropsAddresses(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{&websocket.CloseError{Code: 4000}, "close 4000"},
		{errors.New("read tcp 127.0.0.4:37749->127.0.0.1:8091: read: connection reset by peer"), "connection reset by peer"},
		{errors.New("write tcp 127.0.0.1:38819->127.0.0.1:8091: i/o timeout"), "i/o timeout"},
		{fmt.Errorf("x: %w", io.ErrUnexpectedEOF), "EOF"},
	} {
		if got := CloseReason(c.err); got != c.want {
			t.Errorf("closeReason(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}

package client

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/presence-dev/presence/protocol"
)

// A peer that sends a hello and then never reads: a close frame gets no
// answer, so Close gives up waiting for it. The reader stops only then,
// while Close forgets the connection: under -race, that must not be a
// race, and Close still returns.
func TestCloseWithAPeerThatNeverAnswers(t *testing.T) {
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer func() { _ = ws.Close() }()
		hello := protocol.Hello{Type: protocol.TypeHello, V: protocol.Version, User: "amy", Session: "s",
			Limits: protocol.Limits{FrameRate: 10, FrameBurst: 20, PingIntervalMS: 25000}}
		if err := ws.WriteJSON(hello); err != nil {
			return
		}
		select { // never reads, so never answers a close
		case <-stop:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(stop)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, Config{URL: srv.URL, User: "amy", Session: "s"})
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() { _ = c.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not return")
	}
	if err := c.Err(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Err after Close: %v, want ErrClosed", err)
	}
}

package node

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/presence"
)

// TestClientsCloseWhileEventsFanOut: many clients send pings and then
// close frames while the room's events are being written to them. The
// node answers each from the connection's reader goroutine while its
// writer batches frames; both write to the same connection. The node must
// stay up (it once panicked here) and every client must get its close
// answered.
func TestClientsCloseWhileEventsFanOut(t *testing.T) {
	slow(t)
	e := newEnv(t)
	// Joins wait on a store busy with the pumps: give them time.
	n := e.newNode(func(c *Config) { c.StoreTimeout = 10 * time.Second })
	const room, clients, pumps, rounds = "fan", 50, 8, 4
	// Events keep coming: a store of another process joins users to the
	// room and changes their state, so each client's writer is busy.
	ctx, stop := context.WithCancel(context.Background())
	var pump sync.WaitGroup
	for p := range pumps {
		pump.Add(1)
		go func() {
			defer pump.Done()
			for i := 0; ctx.Err() == nil; i++ {
				ref := presence.SessionRef{Room: room, User: fmt.Sprintf("p%d-%d", p, i%20), Session: "s"}
				_, _ = e.store.Claim(ctx, []presence.SessionRef{ref})
				_, _ = e.store.SetState(ctx, ref, []byte(fmt.Sprintf(`{"n":%d}`, i)))
			}
		}()
	}
	defer func() { stop(); pump.Wait() }()

	for round := range rounds {
		// Each client reads every frame as it comes (a client that stops
		// reading is a slow consumer, not this test) and counts events.
		type reader struct {
			c      *client
			events atomic.Int64
			end    chan error
		}
		rs := make([]*reader, clients)
		for i := range rs {
			c := n.dial(t, token(t, fmt.Sprintf("u%d-%d", round, i), []string{"*"}, time.Hour), "s")
			r := &reader{c: c, end: make(chan error, 1)}
			go func() {
				for f := range c.frames {
					switch f.Type {
					case "event":
						r.events.Add(1)
					case "error":
						t.Errorf("client %d: %s", i, f.raw)
					}
				}
				r.end <- c.w.Err() // set once frames is closed
			}()
			c.send(map[string]string{"type": "join", "room": room, "ref": "j"})
			rs[i] = r
		}
		testkit.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
			for i, r := range rs {
				if err := testkit.AtLeast(fmt.Sprintf("events at client %d", i), r.events.Load(), 3); err != nil {
					return err
				}
			}
			return nil
		})
		var wg sync.WaitGroup
		for _, r := range rs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Pings are answered from the reader goroutine too,
				// like the close: each is one more write beside the
				// writer's batches.
				for range 200 {
					_ = r.c.ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(time.Second))
				}
				_ = r.c.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "bye"), time.Now().Add(time.Second))
			}()
		}
		wg.Wait()
		for i, r := range rs {
			select {
			case err := <-r.end:
				if !websocket.IsCloseError(err, websocket.CloseNormalClosure) {
					t.Errorf("round %d client %d ended with %v, want its close answered (1000)", round, i, err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("round %d client %d: no end within 10s", round, i)
			}
		}
	}
	// The node is still serving.
	c := n.dial(t, token(t, "after", []string{"*"}, time.Hour), "s")
	c.join(room)
}

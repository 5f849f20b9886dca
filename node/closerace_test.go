package node

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/presence-dev/presence/presence"
)

// TestClientsCloseWhileEventsFanOut: many clients send pings and then
// close frames while the room's events are being written to them. The
// node answers each from the connection's reader goroutine while its
// writer batches frames; both write to the same connection. The node must stay
// up (it once panicked here) and every client must get its close answered.
func TestClientsCloseWhileEventsFanOut(t *testing.T) {
	e := newEnv(t)
	n := e.newNode()
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
		var cs []*client
		for i := range clients {
			c := n.dial(t, token(t, fmt.Sprintf("u%d-%d", round, i), []string{"*"}, time.Hour), "s")
			c.send(map[string]string{"type": "join", "room": room, "ref": "j"})
			cs = append(cs, c)
		}
		waitFor(t, 15*time.Second, "events reaching the clients", func() bool {
			return len(cs[len(cs)-1].frames) > 2
		})
		var wg sync.WaitGroup
		for _, c := range cs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Pings are answered from the reader goroutine too,
				// like the close: each is one more write beside the
				// writer's batches.
				for range 200 {
					_ = c.ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(time.Second))
				}
				_ = c.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "bye"), time.Now().Add(time.Second))
			}()
		}
		wg.Wait()
		for i, c := range cs {
			err := c.waitEnd()
			if !websocket.IsCloseError(err, websocket.CloseNormalClosure) {
				t.Errorf("round %d client %d ended with %v, want its close answered (1000)", round, i, err)
			}
		}
	}
	// The node is still serving.
	c := n.dial(t, token(t, "after", []string{"*"}, time.Hour), "s")
	c.join(room)
}

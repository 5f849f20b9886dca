package load

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

// Conn is a WebSocket that several goroutines write to and one reads:
// each write goes whole, with a deadline; Ending tells the reader whether
// the connection's end is this tool's own doing (End) or the other side's.
type Conn struct {
	WS     *websocket.Conn
	wmu    sync.Mutex
	ending atomic.Bool
}

// Send writes one text frame.
func (c *Conn) Send(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.WS.SetWriteDeadline(time.Now().Add(10 * time.Second))
	return c.WS.WriteMessage(websocket.TextMessage, b)
}

// End closes the connection as this tool's doing.
func (c *Conn) End() {
	c.ending.Store(true)
	c.WS.Close()
}

// Ending reports whether End was called: a read error after it is not a
// loss.
func (c *Conn) Ending() bool { return c.ending.Load() }

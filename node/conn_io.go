package node

import (
	"context"
	"errors"
	"io"
	"strconv"
	"time"

	"github.com/gorilla/websocket"

	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
)

// A connection's I/O: the read loop, the write path (queueing, batching,
// pings) and the close. The protocol's requests are in conn_verbs.go.

// signal starts a writer unless one is running or the reader has exited.
// The reader's WaitGroup slot is held while done is false, so the Add
// here never races a Wait that has seen zero.
func (c *conn) signal() {
	c.mu.Lock()
	start := !c.writing && !c.done
	if start {
		c.writing = true
		c.d.wg.Add(1)
	}
	c.mu.Unlock()
	if start {
		go c.write()
	}
}

// outFrame is a queued frame: its bytes and, for a frame shared by
// members that negotiated permessage-deflate, the frame prepared (and
// compressed) once for all of them.
type outFrame struct {
	b    []byte
	pm   *websocket.PreparedMessage
	at   time.Time // queued, for a shared frame (frame_write_seconds)
	wave *wave     // the tick's wave that wakes the writer for it, if any
}

// send queues a frame. It never blocks: a client that lets SendQueue
// frames pile up is closed as a slow consumer.
func (c *conn) send(b []byte) { c.enqueue(outFrame{b: b}) }

func (c *conn) enqueue(f outFrame) {
	if c.queueFrame(f, nil) {
		c.signal()
	}
}

// hold queues a frame of a tick's wave w (wave.go) and reports whether
// the caller is to wake the writer: it is not running. A frame a running
// writer will take is not counted in w.
func (c *conn) hold(f outFrame, w *wave) bool {
	return c.queueFrame(f, w)
}

// queueFrame queues f, counted in w if the writer is to be woken with it
// (w nil: the frame wakes it at once), and reports whether the writer is
// to be woken. A slow consumer's close wakes it at once.
func (c *conn) queueFrame(f outFrame, w *wave) bool {
	c.mu.Lock()
	if c.closeCode != 0 || c.done {
		c.mu.Unlock()
		return false
	}
	if len(c.queue) >= c.d.lim.SendQueue {
		c.dropQueueLocked()
		c.closeCode, c.closeText = protocol.CloseSlowConsumer, "slow consumer"
		c.mu.Unlock()
		c.d.log.Warn("node: closing a slow consumer", "user", c.user, "session", c.session)
		c.signal()
		return false
	}
	wake := !c.writing
	if wake && w != nil {
		w.left.Add(1)
		f.wave = w
	}
	c.queue = append(c.queue, f)
	c.mu.Unlock()
	return wake
}

// takeWaves tells the waves of q's frames that their writer took them
// (written or dropped): wave.go.
func takeWaves(q []outFrame) {
	for i := range q {
		if q[i].wave != nil {
			q[i].wave.taken()
			q[i].wave = nil
		}
	}
}

// dropQueueLocked drops the queued frames.
func (c *conn) dropQueueLocked() {
	takeWaves(c.queue)
	c.queue = nil
}

// queued is how many frames wait for the writer: a member taking events
// frames is held under behindFrames by the hub.
func (c *conn) queued() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue)
}

// requestPing asks the writer for a ping; the wheel calls it.
func (c *conn) requestPing() {
	c.mu.Lock()
	c.ping = true
	c.mu.Unlock()
	c.signal()
}

// shutdown asks the writer to send a close frame and stop; frames still
// queued are dropped. The first call wins. keep leaves the sessions to
// their TTL instead of releasing them.
func (c *conn) shutdown(code int, text string, keep bool) {
	if keep {
		c.keep.Store(true)
	}
	c.mu.Lock()
	if c.closeCode == 0 {
		c.closeCode, c.closeText = code, text
		c.dropQueueLocked()
	}
	c.mu.Unlock()
	c.signal()
}

// kill drops the TCP connection; the reader then fails and cleans up.
func (c *conn) kill() { _ = c.ws.NetConn().Close() }

// write writes what is queued until nothing is, then exits. A close ends
// the connection's writing for good: writing stays set.
func (c *conn) write() {
	defer c.d.wg.Done()
	for {
		c.mu.Lock()
		q, ping, code, text, done := c.queue, c.ping, c.closeCode, c.closeText, c.done
		c.queue, c.ping = nil, false
		takeWaves(q)
		if done || (len(q) == 0 && !ping && code == 0) {
			c.writing = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		if code != 0 {
			c.writeClose(code, text)
			return
		}
		if ping && !c.writePing() || !c.writeQueue(q) {
			c.kill()
			return
		}
	}
}

// writeClose writes the close frame; the reader then waits for the
// client's answer, but not forever.
func (c *conn) writeClose(code int, text string) {
	lim := &c.d.lim
	now := time.Now()
	_ = c.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, text), now.Add(lim.WriteTimeout))
	c.mu.Lock()
	_ = c.ws.SetReadDeadline(now.Add(lim.CloseTimeout))
	c.mu.Unlock()
	c.d.metrics.closes.WithLabelValues(strconv.Itoa(code)).Inc()
}

// writePing writes a ping; false: the connection failed.
func (c *conn) writePing() bool {
	lim := &c.d.lim
	// The deadline is set by the first unanswered ping only, so later
	// pings do not push it back. The pong is read between frames, and a
	// frame may wait on the store for StoreTimeout.
	c.mu.Lock()
	if !c.awaiting && c.closeCode == 0 {
		c.awaiting = true
		_ = c.ws.SetReadDeadline(time.Now().Add(lim.PongTimeout + c.d.storeTimeout))
	}
	c.mu.Unlock()
	return c.ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(c.d.lim.WriteTimeout)) == nil
}

// writeQueue writes the frames taken off the queue; false: the
// connection failed.
func (c *conn) writeQueue(q []outFrame) bool {
	// On a batching connection all queued frames go out in one write.
	// (Not a single large frame: gorilla writes it as two, but copying
	// it into a batch would hold a frame-sized buffer per writer while
	// a slow client blocks it: 1.4 GB at 15,000 members of a churning
	// room.)
	bc, _ := c.ws.NetConn().(*batchConn)
	if bc != nil && len(q) > 1 {
		bc.begin()
	} else {
		bc = nil
	}
	// One deadline for what was queued: setting it is a timer update,
	// a tenth of the cost of a frame when a tick writes to every member.
	_ = c.ws.SetWriteDeadline(time.Now().Add(c.d.lim.WriteTimeout))
	for _, f := range q {
		if err := c.writeFrame(f); err != nil {
			if bc != nil {
				_ = bc.flush()
			}
			return false
		}
	}
	if bc != nil && bc.flush() != nil {
		return false
	}
	for _, f := range q {
		if !f.at.IsZero() {
			c.d.metrics.frameWrite.Observe(time.Since(f.at).Seconds())
		}
	}
	return true
}

// writeFrame writes one frame; a prepared one compressed (write
// compression is on only for it: the rest, replies and per-member
// frames, are not worth a compressor each).
func (c *conn) writeFrame(f outFrame) error {
	if f.pm == nil {
		return c.ws.WriteMessage(websocket.TextMessage, f.b)
	}
	c.ws.EnableWriteCompression(true)
	err := c.ws.WritePreparedMessage(f.pm)
	c.ws.EnableWriteCompression(false)
	return err
}

// onPong clears the pong deadline, unless a close is under way and the
// deadline is the close's.
func (c *conn) onPong(string) error {
	c.mu.Lock()
	if c.closeCode == 0 {
		c.awaiting = false
		_ = c.ws.SetReadDeadline(time.Time{})
	}
	c.mu.Unlock()
	return nil
}

// readLoop starts reading the connection's frames.
func (c *conn) readLoop() {
	c.ws.SetReadLimit(int64(c.d.lim.MaxFrameBytes))
	c.ws.SetPongHandler(c.onPong)
	c.read()
}

// read reads one frame and handles it, then reads on in a fresh
// goroutine, until the connection ends; it then cleans up. The reader
// holds the connection's WaitGroup slot from goroutine to goroutine.
//
// Why a fresh goroutine: handling a frame (a join's store calls) grows a
// goroutine's stack past 4 KiB, and the runtime halves a stack only when
// under a quarter of it is used: a reader parked in its read (over 1.2
// KiB of frames, plus the runtime's guard) would keep 8 KiB for the
// connection's life. Idle connections wait on a new goroutine's stack
// instead: 4 KiB less each, for a goroutine start per frame.
func (c *conn) read() {
	mt, data, err := c.readFrame()
	if err != nil {
		c.cleanup(err)
		c.d.wg.Done()
		return
	}
	c.handle(mt, data)
	go c.read()
}

// errInflatedTooBig ends a connection whose compressed frame inflates past
// MaxFrameBytes.
var errInflatedTooBig = errors.New("node: a frame inflates past the frame limit")

// readFrame reads one message. gorilla's read limit counts the bytes on
// the wire, so a compressed frame is also held to MaxFrameBytes once
// inflated: a few KB must not become gigabytes in the node.
func (c *conn) readFrame() (int, []byte, error) {
	mt, r, err := c.ws.NextReader()
	if err != nil {
		return 0, nil, err
	}
	max := int64(c.d.lim.MaxFrameBytes)
	data, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		return 0, nil, err
	}
	if int64(len(data)) > max {
		_ = c.ws.WriteControl(websocket.CloseMessage,
			websocket.FormatCloseMessage(websocket.CloseMessageTooBig, "frame too big"), time.Now().Add(c.d.lim.WriteTimeout))
		return 0, nil, errInflatedTooBig
	}
	return mt, data, nil
}

// cleanup runs once, on the reader goroutine, when the connection ends.
func (c *conn) cleanup(err error) {
	d := c.d
	if c.expiry != nil {
		c.expiry.Stop()
	}
	d.registry.remove(c)
	for _, room := range c.rooms {
		d.rooms.remove(room, c)
	}
	for _, room := range c.follows {
		d.rooms.remove(room, c)
	}
	for _, room := range c.watches {
		d.watches.unwatch(room, c)
	}
	c.follows, c.watches = nil, nil
	c.mu.Lock()
	c.done, c.queue = true, nil
	c.mu.Unlock()
	c.signal()
	if errors.Is(err, websocket.ErrReadLimit) {
		// gorilla has sent 1009. Read off the rest of the oversized frame
		// before closing: closing with unread input sends a reset, which
		// may destroy the close frame before the client reads it.
		d.metrics.closes.WithLabelValues(strconv.Itoa(protocol.CloseTooBig)).Inc()
		d.metrics.rejectedFrames.WithLabelValues("too_big").Inc()
		nc := c.ws.NetConn()
		_ = nc.SetReadDeadline(time.Now().Add(d.lim.CloseTimeout))
		var buf [512]byte
		for {
			if _, e := nc.Read(buf[:]); e != nil {
				break
			}
		}
	}
	c.kill()

	// Sessions: a drained connection keeps them for its TTL, anything else
	// (clean close, error, dead TCP, limit) releases them and the grace
	// applies.
	keep := c.keep.Load()
	for _, room := range c.rooms {
		ref := presence.SessionRef{Room: room, User: c.user, Session: c.session}
		ctx, cancel := context.WithTimeout(d.ctx, d.storeTimeout)
		released, rerr := d.sessions.unhold(ctx, ref, c, !keep)
		cancel()
		switch {
		case rerr != nil:
			d.log.Warn("node: release failed; retried until the store answers", "room", room, "user", c.user, "session", c.session, "err", rerr)
		case released:
			d.metrics.leaves.WithLabelValues("close").Inc()
		case keep:
			d.metrics.leaves.WithLabelValues("kept").Inc()
		}
	}
	c.rooms = nil
	d.counts.open.Add(-1)
	d.counts.active.Add(-1)
}

package node

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/presence"
)

// permessage-deflate (docs/PROTOCOL.md, "Compression"): shared events
// frames go out compressed to clients that offer it, the same entries as
// to those that do not; a client's compressed frame is held to the frame
// limit once inflated.

// countingConn counts the bytes a client reads off the wire.
type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// dialCounted dials user into n, offering permessage-deflate or not, and
// counts the bytes it reads.
func dialCounted(t *testing.T, n *node, user string, deflate bool) (*client, *atomic.Int64) {
	t.Helper()
	read := new(atomic.Int64)
	d := websocket.Dialer{EnableCompression: deflate, NetDialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{Conn: c, n: read}, nil
	}}
	h := http.Header{}
	h.Set("Authorization", "Bearer "+token(t, user, []string{"*"}, time.Hour))
	ws, _, err := d.Dial(n.wsURL("session=s"), h)
	if err != nil {
		t.Fatal(err)
	}
	w := testkit.NewWS(t, ws, decodeFrame)
	c := &client{t: t, w: w, ws: w.Conn, frames: w.Frames}
	c.hello = c.expect("hello")
	return c, read
}

// readEntrySeqs reads c's frames until its events frames have carried want
// entries, and returns their seqs in order.
func readEntrySeqs(t *testing.T, c *client, want int) []uint64 {
	t.Helper()
	var seqs []uint64
	deadline := time.After(20 * time.Second)
	for len(seqs) < want {
		select {
		case f, ok := <-c.frames:
			if !ok {
				t.Fatalf("connection ended after %d of %d entries", len(seqs), want)
			}
			if f.Type != "events" {
				continue
			}
			for _, e := range f.Events {
				var entry []json.RawMessage
				var seq uint64
				if json.Unmarshal(e, &entry) != nil || len(entry) == 0 || json.Unmarshal(entry[0], &seq) != nil {
					t.Fatalf("bad entry %s", e)
				}
				seqs = append(seqs, seq)
			}
		case <-deadline:
			t.Fatalf("%d of %d entries after 20s", len(seqs), want)
		}
	}
	return seqs
}

func TestSharedEventsFramesGoOutCompressed(t *testing.T) {
	e := newEnv(t)
	n := e.newNode(func(c *Config) { c.BatchFrom, c.FanoutTick = 1, 20*time.Millisecond })
	room := "big"
	zipped, zippedRead := dialCounted(t, n, "zipped", true)
	plain, plainRead := dialCounted(t, n, "plain", false)
	for _, c := range []*client{zipped, plain} {
		c.send(map[string]any{"type": "join", "room": room, "batch": true, "ref": "j"})
		c.expect("snapshot")
	}
	// The first to join sees the other's online; count from there.
	readEntrySeqs(t, zipped, 1)
	zipped0, plain0 := zippedRead.Load(), plainRead.Load()
	ctx := context.Background()
	const users = 200
	refs := make([]presence.SessionRef, users)
	for i := range refs {
		refs[i] = presence.SessionRef{Room: room, User: fmt.Sprintf("u%03d", i), Session: "s"}
	}
	if _, err := e.store.Claim(ctx, refs); err != nil {
		t.Fatal(err)
	}
	state := json.RawMessage(fmt.Sprintf(`{"bio":%q}`, strings.Repeat("presence ", 60)))
	for _, ref := range refs {
		if _, err := e.store.SetState(ctx, ref, state); err != nil {
			t.Fatal(err)
		}
	}
	// Both see the same entries, in the same order (onlines, then
	// updates); one of them read them compressed.
	a, b := readEntrySeqs(t, zipped, 2*users), readEntrySeqs(t, plain, 2*users)
	if !slices.Equal(a, b) {
		t.Fatalf("the compressed member saw seqs %v…, the plain one %v…", a[:min(len(a), 5)], b[:min(len(b), 5)])
	}
	za, pb := zippedRead.Load()-zipped0, plainRead.Load()-plain0
	t.Logf("%d entries: %d bytes read compressed, %d plain", len(a), za, pb)
	if za*3 > pb {
		t.Fatalf("the compressed member read %d bytes, the plain one %d: want under a third", za, pb)
	}
}

func TestAnInflatingFrameIsHeldToTheFrameLimit(t *testing.T) {
	e := newEnv(t)
	n := e.newNode()
	h := http.Header{}
	h.Set("Authorization", "Bearer "+token(t, "amy", []string{"*"}, time.Hour))
	h.Set(testkit.DeflateHeader, "1")
	join := func(room string, pad int) []byte {
		return []byte(`{"type":"join","room":"` + room + `","ref":"j"` + strings.Repeat(" ", pad) + `}`)
	}
	// Under the limit once inflated: served.
	c := n.dialWith(t, "session=s", h)
	c.ws.EnableWriteCompression(true)
	c.sendRaw(websocket.TextMessage, join("fits", DefaultMaxFrameBytes-100))
	c.expect("snapshot")
	// A few hundred bytes on the wire that inflate to a megabyte: the
	// connection is closed as for any frame over the limit, and the join
	// it carried is not made.
	c.sendRaw(websocket.TextMessage, join("bomb", 1<<20))
	c.expectClose(websocket.CloseMessageTooBig)
	if got, err := e.store.Count(context.Background(), "bomb"); err != nil || got != 0 {
		t.Fatalf("room bomb has %d members (%v), want 0", got, err)
	}
}

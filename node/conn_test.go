package node

import (
	"github.com/presence-dev/presence/protocol"
	"testing"
	"time"
)

func TestSlowConsumerIsClosed(t *testing.T) {
	d := &connDeps{lim: Limits{SendQueue: 2}, log: quiet}
	c := &conn{d: d, user: "u", writing: true} // as if a writer were busy: frames stay queued
	c.send([]byte("a"))
	c.send([]byte("b"))
	if len(c.queue) != 2 || c.closeCode != 0 {
		t.Fatalf("queue %d, close %d", len(c.queue), c.closeCode)
	}
	c.send([]byte("c"))
	if c.closeCode != protocol.CloseSlowConsumer || c.queue != nil {
		t.Fatalf("after overflow: close %d, queue %d; want 4000 and the queue dropped", c.closeCode, len(c.queue))
	}
	c.send([]byte("d"))
	if c.queue != nil {
		t.Fatal("queued after the close")
	}
}

func TestRateLimiterRefills(t *testing.T) {
	epoch := time.Now()
	d := &connDeps{lim: Limits{FrameRate: 2, FrameBurst: 3}, mono: func() int64 { return int64(time.Since(epoch)) }}
	c := &conn{d: d, tokens: 3, last: d.mono()}
	for i := range 3 {
		if !c.allow() {
			t.Fatalf("frame %d of the burst refused", i)
		}
	}
	if c.allow() {
		t.Fatal("frame beyond the burst allowed")
	}
	c.last -= int64(time.Second) // a second passes: two tokens
	first, second, third := c.allow(), c.allow(), c.allow()
	if !first || !second || third {
		t.Fatal("refill is not 2 per second")
	}
	c.last -= int64(time.Hour)
	c.allow()
	if c.tokens > 2 {
		t.Fatalf("tokens %v above the burst", c.tokens)
	}
}

package node

import (
	"bytes"
	"net"
	"testing"
)

// writeCounter is a net.Conn that records each write call.
type writeCounter struct {
	net.Conn
	writes [][]byte
}

func (w *writeCounter) Write(p []byte) (int, error) {
	w.writes = append(w.writes, bytes.Clone(p))
	return len(p), nil
}

func TestBatchConnSendsHeldWritesAsOne(t *testing.T) {
	w := &writeCounter{}
	b := &batchConn{Conn: w}
	if _, err := b.Write([]byte("direct")); err != nil || len(w.writes) != 1 {
		t.Fatalf("a write outside a batch: %v, %d writes", err, len(w.writes))
	}
	b.begin()
	for _, s := range []string{"a", "bb", "ccc"} {
		if n, err := b.Write([]byte(s)); err != nil || n != len(s) {
			t.Fatalf("held write: %d %v", n, err)
		}
	}
	if len(w.writes) != 1 {
		t.Fatal("a held write went out before the flush")
	}
	if err := b.flush(); err != nil {
		t.Fatal(err)
	}
	if len(w.writes) != 2 || string(w.writes[1]) != "abbccc" {
		t.Fatalf("writes %q, want the batch as one", w.writes)
	}
	b.begin()
	if err := b.flush(); err != nil || len(w.writes) != 2 {
		t.Fatalf("an empty batch wrote: %v %d", err, len(w.writes))
	}
}

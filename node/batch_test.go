package node

import (
	"bytes"
	"io"
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

// TestBatchConnWritesFromAnotherGoroutine: gorilla's WriteControl (the
// close handler answering a client's close frame on the reader
// goroutine) writes while the writer goroutine batches. Under -race this
// failed before the batch state was locked; without -race it panicked
// with a nil buffer.
func TestBatchConnWritesFromAnotherGoroutine(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	go func() { _, _ = io.Copy(io.Discard, b) }()
	bc := &batchConn{Conn: a}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 2000 {
			_, _ = bc.Write([]byte("control"))
		}
	}()
	for range 2000 {
		bc.begin()
		_, _ = bc.Write([]byte("frame"))
		_ = bc.flush()
	}
	<-done
}

// TestBatchConnCloseSendsWhatIsHeld: a close frame answered during a
// batch is held with it; closing the connection must still send it.
func TestBatchConnCloseSendsWhatIsHeld(t *testing.T) {
	a, b := net.Pipe()
	got := make(chan []byte, 1)
	go func() { all, _ := io.ReadAll(b); got <- all }()
	bc := &batchConn{Conn: a}
	bc.begin()
	_, _ = bc.Write([]byte("frame"))
	_, _ = bc.Write([]byte("close"))
	if err := bc.Close(); err != nil {
		t.Fatal(err)
	}
	if s := string(<-got); s != "frameclose" {
		t.Fatalf("peer read %q, want the held writes before the end", s)
	}
	if err := bc.flush(); err != nil {
		t.Fatalf("flush after close: %v", err)
	}
}

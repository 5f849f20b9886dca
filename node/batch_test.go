package node

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"testing"
	"time"
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
// goroutine) writes while the writer goroutine batches. Every write must
// reach the peer once and whole, and the writer's frames in their order;
// a control write may overtake a held batch (batchConn's comment), so the
// control frames are checked as a set. This holds with or without -race;
// -race adds that the batch state is locked.
func TestBatchConnWritesFromAnotherGoroutine(t *testing.T) {
	const n, size = 2000, 6 // frames per goroutine; "c0042." and "f0042."
	a, b := net.Pipe()
	got := make(chan []byte, 1)
	go func() { all, _ := io.ReadAll(b); got <- all }()
	bc := &batchConn{Conn: a}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range n {
			_, _ = bc.Write(fmt.Appendf(nil, "c%04d.", i))
		}
	}()
	for i := range n {
		bc.begin()
		_, _ = bc.Write(fmt.Appendf(nil, "f%04d.", i))
		if err := bc.flush(); err != nil {
			t.Fatalf("flush %d: %v", i, err)
		}
	}
	<-done
	if err := bc.Close(); err != nil {
		t.Fatal(err)
	}
	all := <-got
	if len(all) != 2*n*size {
		t.Fatalf("peer read %d bytes, want %d (%d whole frames from each goroutine)", len(all), 2*n*size, n)
	}
	controls, frames := map[int]bool{}, 0
	for off := 0; off < len(all); off += size {
		tok := all[off : off+size]
		var kind byte
		var i int
		if _, err := fmt.Sscanf(string(tok), "%c%04d.", &kind, &i); err != nil || tok[size-1] != '.' {
			t.Fatalf("byte %d: %q is not a whole frame (%v)", off, tok, err)
		}
		switch {
		case kind == 'f' && i == frames:
			frames++
		case kind == 'f':
			t.Fatalf("byte %d: batch frame %d after %d frames: out of order", off, i, frames)
		case kind == 'c' && !controls[i]:
			controls[i] = true
		default:
			t.Fatalf("byte %d: %q unexpected (a duplicate or a foreign write)", off, tok)
		}
	}
	if frames != n || len(controls) != n {
		t.Fatalf("peer got %d batch frames and %d control writes, want %d of each", frames, len(controls), n)
	}
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

// deadlineRecorder is a net.Conn that records each write deadline set.
type deadlineRecorder struct {
	net.Conn
	set []time.Time
}

func (d *deadlineRecorder) SetWriteDeadline(t time.Time) error {
	d.set = append(d.set, t)
	return nil
}

func (d *deadlineRecorder) Write(p []byte) (int, error) { return len(p), nil }

// TestWriteDeadlinesMoveOncePerSlack: the deadline in force is never
// before the one asked for and at most deadlineSlack after it, and it is
// moved only when a frame's deadline passes it; none (zero) is passed on
// at once.
func TestWriteDeadlinesMoveOncePerSlack(t *testing.T) {
	d := &deadlineRecorder{}
	b := &batchConn{Conn: d}
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	asked := []time.Time{}
	for i := range 40 { // a frame every 100 ms, each asking for +10 s
		at := base.Add(time.Duration(i)*100*time.Millisecond + 10*time.Second)
		asked = append(asked, at)
		if err := b.SetWriteDeadline(at); err != nil {
			t.Fatal(err)
		}
		if in := d.set[len(d.set)-1]; in.Before(at) || in.Sub(at) > deadlineSlack {
			t.Fatalf("frame %d asked for %v, the deadline in force is %v", i, at, in)
		}
	}
	if n := len(d.set); n > 5 {
		t.Errorf("the deadline moved %d times over 4 s of frames, want at most 5 (once per %v)", n, deadlineSlack)
	}
	// An earlier deadline than the one in force is passed on exactly.
	early := asked[0]
	if err := b.SetWriteDeadline(early); err != nil {
		t.Fatal(err)
	}
	if in := d.set[len(d.set)-1]; in.Before(early) || in.Sub(early) > deadlineSlack {
		t.Fatalf("an earlier deadline %v left %v in force", early, in)
	}
	if err := b.SetWriteDeadline(time.Time{}); err != nil || !d.set[len(d.set)-1].IsZero() {
		t.Fatalf("clearing the deadline: %v, in force %v", err, d.set[len(d.set)-1])
	}
	// A batch sets its last frame's deadline once, at the flush, by the
	// same rule.
	b.begin()
	for _, at := range asked[:3] {
		_ = b.SetWriteDeadline(at)
	}
	_, _ = b.Write([]byte("x"))
	n := len(d.set)
	if err := b.flush(); err != nil {
		t.Fatal(err)
	}
	if len(d.set) != n+1 || d.set[n].Before(asked[2]) || d.set[n].Sub(asked[2]) > deadlineSlack {
		t.Fatalf("the flush set %v, want one deadline from %v", d.set[n:], asked[2])
	}
}

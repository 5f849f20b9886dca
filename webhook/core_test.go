package webhook

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"
)

// The core's decisions on an explicit clock: no NATS, no HTTP.

var t0 = time.Date(2026, 11, 29, 19, 0, 0, 0, time.UTC)

func testCore(size int) *core {
	return newCore("eu", coreLimits{batchSize: size, maxWait: 100 * time.Millisecond, horizon: time.Minute,
		minBackoff: time.Second, maxBkf: 8 * time.Second, gapTimeout: 10 * time.Second, maxHeld: 100}, func() float64 { return 0.5 })
}

// ev is stream message sseq: room's event (epoch, seq).
func ev(room string, epoch int64, seq, sseq uint64) *item {
	id := fmt.Sprintf("eu/%s/%d/%d", room, epoch, seq)
	return &item{id: id, data: []byte(`{"id":"` + id + `"}`), room: room, pos: position{epoch, seq}, sseq: sseq, stored: t0, at: t0}
}

// ids returns the ids of a batch's visible items.
func ids(b *batch) []string {
	var out []string
	for _, it := range b.items {
		if it.visible() {
			out = append(out, it.id)
		}
	}
	return out
}

func TestCoreOrdersARoomBySeqAcrossStreamOrder(t *testing.T) {
	c := testCore(10)
	p := position{1, 3}
	c.offer(ev("r", 1, 4, 10), &p, t0)
	c.offer(ev("r", 1, 6, 11), nil, t0) // stored before 5: held
	if b, _ := c.due(t0.Add(time.Second)); !slices.Equal(ids(b), []string{"eu/r/1/4"}) {
		t.Fatalf("first batch %v, want only seq 4 (6 waits for 5)", ids(b))
	}
	s := c.settle(false)
	if s.positions["r"] != (position{1, 4}) || !slices.Equal(s.acks, []uint64{10}) {
		t.Fatalf("settlement %+v", s)
	}
	c.settled(s, t0)
	c.offer(ev("r", 1, 5, 12), nil, t0)
	b, _ := c.due(t0.Add(time.Second))
	if !slices.Equal(ids(b), []string{"eu/r/1/5", "eu/r/1/6"}) {
		t.Fatalf("second batch %v", ids(b))
	}
}

func TestCoreAcksRedeliveriesButNotWhatItHolds(t *testing.T) {
	c := testCore(10)
	p := position{1, 3}
	if acks := c.offer(ev("r", 1, 2, 5), &p, t0); !slices.Equal(acks, []uint64{5}) {
		t.Fatalf("seq 2 under position 3: acks %v, want it acknowledged", acks)
	}
	c.offer(ev("r", 1, 4, 6), nil, t0)
	if acks := c.offer(ev("r", 1, 4, 6), nil, t0); len(acks) != 0 {
		t.Fatalf("a second copy of a held message was acknowledged: %v", acks)
	}
}

func TestCoreGivesAGapUpWithAMarker(t *testing.T) {
	c := testCore(10)
	p := position{1, 3}
	c.offer(ev("r", 1, 6, 10), &p, t0)
	if b, _ := c.due(t0.Add(5 * time.Second)); b != nil {
		t.Fatalf("delivered across an open gap: %v", ids(b))
	}
	// Past the gap timeout the lane is told to read again from its ack
	// floor, once; the gap is given up a gap timeout later.
	if !c.tick(t0.Add(10 * time.Second)) {
		t.Fatal("a gap past the gap timeout asked for no reading again")
	}
	if c.tick(t0.Add(15 * time.Second)) {
		t.Fatal("a gap asked for a second reading again")
	}
	if b, wake := c.due(t0.Add(15 * time.Second)); b != nil || !wake.Equal(t0.Add(20*time.Second)) {
		t.Fatalf("before the gap is given up: batch %v, wake %v, want none until %v", b, wake, t0.Add(20*time.Second))
	}
	c.tick(t0.Add(20 * time.Second))
	b, _ := c.due(t0.Add(21 * time.Second))
	got := ids(b)
	if !slices.Equal(got, []string{"eu/r/1/5/gap", "eu/r/1/6"}) {
		t.Fatalf("after the gap timeout: %v, want a gap marker at seq 5, then 6", got)
	}
	var m Marker
	if err := json.Unmarshal(b.items[0].data, &m); err != nil || m.Kind != KindResync || m.Reason != ResyncGap || m.Seq != 5 {
		t.Fatalf("marker %s: %+v %v", b.items[0].data, m, err)
	}
	// 4 and 5 arriving late are acknowledged, not delivered.
	if acks := c.offer(ev("r", 1, 4, 11), nil, t0); !slices.Equal(acks, []uint64{11}) {
		t.Fatalf("late seq 4: %v", acks)
	}
}

// A gap filled after the lane read again closes; a later gap of the room
// gets its own reading again.
func TestCoreGapFilledAfterReadingAgain(t *testing.T) {
	c := testCore(10)
	p := position{1, 3}
	c.offer(ev("r", 1, 5, 10), &p, t0)
	if !c.tick(t0.Add(10 * time.Second)) {
		t.Fatal("no reading again")
	}
	c.offer(ev("r", 1, 4, 9), nil, t0.Add(11*time.Second))
	c.offer(ev("r", 1, 7, 12), nil, t0.Add(11*time.Second))
	if !c.tick(t0.Add(21 * time.Second)) {
		t.Fatal("a new gap of the room asked for no reading again")
	}
	b, _ := c.due(t0.Add(22 * time.Second))
	if got := ids(b); !slices.Equal(got, []string{"eu/r/1/4", "eu/r/1/5"}) {
		t.Fatalf("after the gap was filled: %v, want 4 and 5, no marker", got)
	}
}

func TestCoreMarksANewEpoch(t *testing.T) {
	c := testCore(10)
	p := position{1, 3}
	c.offer(ev("r", 2, 1, 10), &p, t0)
	b, _ := c.due(t0.Add(time.Second))
	if got := ids(b); !slices.Equal(got, []string{"eu/r/2/0/new_epoch", "eu/r/2/1"}) {
		t.Fatalf("new epoch: %v", got)
	}
	c.settled(c.settle(false), t0)
	if acks := c.offer(ev("r", 1, 4, 11), nil, t0); !slices.Equal(acks, []uint64{11}) {
		t.Fatalf("an event of the old epoch after the new one: %v, want it acknowledged", acks)
	}
}

func TestCoreBatchesAndKeepsTheBatchAcrossRetries(t *testing.T) {
	c := testCore(2)
	for i := uint64(1); i <= 3; i++ {
		c.offer(ev("r", 1, i, i), nil, t0)
	}
	b, _ := c.due(t0)
	if len(ids(b)) != 2 {
		t.Fatalf("batch of %v, want 2 (the batch size)", ids(b))
	}
	id, body := b.id, string(b.body)
	if v := c.failed(result{status: 500}, t0); v != retryLater {
		t.Fatalf("verdict %v", v)
	}
	if again, wake := c.due(t0.Add(100 * time.Millisecond)); again != nil || !wake.Equal(t0.Add(750*time.Millisecond)) {
		t.Fatalf("retried before its backoff: %v, wake %v", again, wake)
	}
	again, _ := c.due(t0.Add(time.Second))
	if again.id != id || string(again.body) != body {
		t.Fatal("a retry changed the batch's id or body")
	}
}

func TestCoreDeadLettersAtTheHorizonAndOwesAMarker(t *testing.T) {
	c := testCore(10)
	c.offer(ev("r", 1, 1, 1), nil, t0)
	c.due(t0.Add(time.Second))
	for now := t0.Add(time.Second); ; now = now.Add(8 * time.Second) {
		v := c.failed(result{status: 500}, now)
		if v == deadLetter {
			if now.Before(t0.Add(time.Minute)) {
				t.Fatalf("dead-lettered at %v, before the horizon", now.Sub(t0))
			}
			break
		}
		if c.batch.next.After(t0.Add(time.Minute)) {
			t.Fatalf("next attempt %v past the horizon", c.batch.next.Sub(t0))
		}
	}
	s := c.settle(true)
	if s.owe["r"] != (position{1, 1}) || s.positions["r"] != (position{1, 1}) {
		t.Fatalf("dead-letter settlement %+v", s)
	}
	c.settled(s, t0.Add(2*time.Minute))
	c.offer(ev("r", 1, 2, 2), nil, t0.Add(2*time.Minute))
	b, _ := c.due(t0.Add(3 * time.Minute))
	if got := ids(b); !slices.Equal(got, []string{"eu/r/1/1/dead_letter", "eu/r/1/2"}) {
		t.Fatalf("after a dead letter: %v, want the marker first", got)
	}
	if s := c.settle(false); !slices.Equal(s.paid, []string{"r"}) {
		t.Fatalf("delivered marker not paid: %+v", s)
	}
}

func TestCoreGoneDisablesUntilEnabled(t *testing.T) {
	c := testCore(10)
	c.offer(ev("r", 1, 1, 1), nil, t0)
	c.due(t0.Add(time.Second))
	if v := c.failed(result{status: 410}, t0); v != disable {
		t.Fatalf("410: %v", v)
	}
	if b, _ := c.due(t0.Add(time.Hour)); b != nil {
		t.Fatal("a disabled lane attempted")
	}
	c.enable(t0.Add(time.Hour))
	if b, _ := c.due(t0.Add(time.Hour)); b == nil {
		t.Fatal("no attempt once enabled")
	}
}

func TestCoreSilentEventsMoveThePositionWithoutARequest(t *testing.T) {
	c := testCore(10)
	it := ev("r", 1, 1, 1)
	it.data = nil // the filter leaves it out
	c.offer(it, nil, t0)
	b, _ := c.due(t0)
	if b == nil || b.visible != 0 {
		t.Fatalf("batch %+v, want one with nothing to send", b)
	}
	if s := c.settle(false); s.positions["r"] != (position{1, 1}) {
		t.Fatalf("settlement %+v", s)
	}
}

func TestCoreStreamResetMarksRoomsMetWithoutAPosition(t *testing.T) {
	c := testCore(10)
	c.resetSince = t0
	c.offer(ev("r", 1, 7, 1), nil, t0)
	b, _ := c.due(t0.Add(time.Second))
	if got := ids(b); !slices.Equal(got, []string{"eu/r/1/6/stream_reset", "eu/r/1/7"}) {
		t.Fatalf("%v", got)
	}
}

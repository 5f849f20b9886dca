package storm

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/presence-dev/presence/presence"
)

func testLimiter(rate float64) *JoinLimiter {
	l := NewJoinLimiter(JoinLimit{Rate: rate, MinRate: rate / 10, Latency: 100 * time.Millisecond,
		MinRetry: 250 * time.Millisecond, MaxRetry: 20 * time.Second})
	l.rnd = func() float64 { return 0.5 } // no jitter: hints are exact
	return l
}

// Joins are admitted at the rate; the clients refused are told to come
// back spread over the time the backlog takes to drain, not together.
func TestJoinLimiterSpreadsRefusedClients(t *testing.T) {
	l := testLimiter(100)
	t0 := time.Unix(1000, 0)
	admitted := 0
	var hints []time.Duration
	for range 1000 { // a storm: 1,000 joins at once
		if ok, d := l.Admit(t0); ok {
			admitted++
		} else {
			hints = append(hints, d)
		}
	}
	if admitted != 100 { // the burst: a second's worth
		t.Fatalf("admitted %d at once, want the burst of 100", admitted)
	}
	// The k-th refused returns after k/rate, at least MinRetry.
	if hints[0] != 250*time.Millisecond || hints[99] != time.Second || hints[899] != 9*time.Second {
		t.Fatalf("hints %v, %v, %v: want 250ms (the floor), 1s and 9s", hints[0], hints[99], hints[899])
	}
	if !slices.IsSorted(hints) {
		t.Fatal("hints are not in the order of refusal")
	}
	// A second later 100 more are admitted, and the backlog owed shrank by
	// as many: the next refused client is told 8.8 s, not 9.81.
	admitted = 0
	t1 := t0.Add(time.Second)
	for range 200 {
		if ok, _ := l.Admit(t1); ok {
			admitted++
		}
	}
	if admitted != 100 { // the bucket refilled, and holds no more than a burst
		t.Fatalf("admitted %d a second later, want 100", admitted)
	}
	l2 := testLimiter(100)
	for range 1000 {
		l2.Admit(t0)
	}
	for range 100 { // the refilled burst
		l2.Admit(t0.Add(time.Second))
	}
	if _, d := l2.Admit(t0.Add(time.Second)); d < 7900*time.Millisecond || d > 8100*time.Millisecond {
		t.Fatalf("hint a second later %v, want about 8s (900 owed less 100 drained)", d)
	}
	// Jitter stays within ±20 %, and the hint within MaxRetry.
	l3 := testLimiter(10)
	for i := range 1000 {
		l3.rnd = func() float64 { return float64(i%10) / 10 }
		if _, d := l3.Admit(t0); d > 20*time.Second {
			t.Fatalf("hint %v over MaxRetry", d)
		}
	}
}

// The rate follows the store: slow or failing joins cut it, down
// to MinRate; calls in time raise it back to Rate.
func TestJoinLimiterFollowsTheStore(t *testing.T) {
	l := testLimiter(1000)
	t0 := time.Unix(1000, 0)
	l.Observe(t0, time.Second, nil)
	if r := l.Rate(); r != 700 {
		t.Fatalf("rate after a slow call %v, want 700", r)
	}
	l.Observe(t0.Add(time.Millisecond), time.Second, nil) // within Latency of the cut: one cut per window
	if r := l.Rate(); r != 700 {
		t.Fatalf("rate after a second slow call at once %v, want still 700", r)
	}
	at := t0
	for range 50 {
		at = at.Add(200 * time.Millisecond)
		l.Observe(at, 0, errors.New("timeout"))
	}
	if r := l.Rate(); r != 100 {
		t.Fatalf("rate after failures %v, want MinRate 100", r)
	}
	for range 60 { // 6 s of calls in time: +90/s each second
		at = at.Add(100 * time.Millisecond)
		l.Observe(at, time.Millisecond, nil)
	}
	if r := l.Rate(); r < 630 || r > 650 {
		t.Fatalf("rate 6s after recovery %v, want about 640", r)
	}
	for range 100 {
		at = at.Add(100 * time.Millisecond)
		l.Observe(at, time.Millisecond, nil)
	}
	if r := l.Rate(); r != 1000 {
		t.Fatalf("rate after recovery %v, want Rate 1000", r)
	}
}

// fakeExtending records Extend calls.
type fakeExtending struct {
	mu    sync.Mutex
	calls [][]presence.SessionRef
	fail  error
}

func (f *fakeExtending) Extend(_ context.Context, refs []presence.SessionRef) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, slices.Clone(refs))
	if f.fail != nil {
		return 0, f.fail
	}
	return len(refs), nil
}

// A client retrying is extended once per Again, in batches; the queue is
// bounded; a failed call lets the next refusal queue its sessions again.
func TestExtenderCoalescesRetries(t *testing.T) {
	st := &fakeExtending{}
	e := NewExtender(st, ExtendConfig{Every: time.Second, Again: 10 * time.Second, Batch: 2, Max: 3, Timeout: time.Second}, slog.New(slog.DiscardHandler))
	ref := func(u string) presence.SessionRef { return presence.SessionRef{Room: "r", User: u, Session: "s"} }
	t0 := time.Unix(1000, 0)
	ctx := context.Background()
	for _, u := range []string{"a", "b", "a", "c", "d"} { // a twice; d over Max
		e.Add(t0, ref(u))
	}
	e.Flush(ctx, t0)
	if len(st.calls) != 2 || len(st.calls[0])+len(st.calls[1]) != 3 {
		t.Fatalf("calls %v, want a, b and c in batches of 2", st.calls)
	}
	e.Add(t0.Add(5*time.Second), ref("a")) // retried inside Again: already kept
	e.Flush(ctx, t0.Add(5*time.Second))
	if len(st.calls) != 2 {
		t.Fatalf("calls %v, want none for a retry inside Again", st.calls)
	}
	st.fail = errors.New("down")
	e.Add(t0.Add(11*time.Second), ref("a")) // past Again: sent again
	e.Flush(ctx, t0.Add(11*time.Second))
	if len(st.calls) != 3 {
		t.Fatalf("calls %v, want a sent again after Again", st.calls)
	}
	st.fail = nil
	e.Add(t0.Add(12*time.Second), ref("a")) // that call failed: queued at once
	e.Flush(ctx, t0.Add(12*time.Second))
	if len(st.calls) != 4 || st.calls[3][0] != ref("a") {
		t.Fatalf("calls %v, want a sent again after a failure", st.calls)
	}
}

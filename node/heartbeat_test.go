package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/presence-dev/presence/presence"
)

// fakeStore records calls. delay(n) is how long the nth Touch (from 0)
// takes; gate, when set, holds every Touch until closed.
type fakeStore struct {
	mu      sync.Mutex
	touches []touchCall
	log     []string
	delay   func(n int) time.Duration
	gate    chan struct{}
	fail    error
}

type touchCall struct {
	at   time.Time
	refs []presence.SessionRef
}

func (f *fakeStore) Touch(ctx context.Context, refs []presence.SessionRef) ([]presence.Transition, error) {
	f.mu.Lock()
	n := len(f.touches)
	f.touches = append(f.touches, touchCall{at: time.Now(), refs: append([]presence.SessionRef(nil), refs...)})
	f.log = append(f.log, fmt.Sprintf("touch-start %d", n))
	f.mu.Unlock()
	if f.delay != nil {
		time.Sleep(f.delay(n))
	}
	if f.gate != nil {
		<-f.gate
	}
	f.mu.Lock()
	f.log = append(f.log, fmt.Sprintf("touch-end %d", n))
	f.mu.Unlock()
	return nil, f.fail
}

func (f *fakeStore) Release(_ context.Context, r presence.SessionRef) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log = append(f.log, "release "+r.Session)
	return nil
}

func (f *fakeStore) SetState(context.Context, presence.SessionRef, json.RawMessage) (bool, error) {
	return true, nil
}

func (f *fakeStore) Snapshot(context.Context, string, int, int) (presence.Snapshot, error) {
	return presence.Snapshot{}, nil
}

func (f *fakeStore) RunReaper(ctx context.Context) { <-ctx.Done() }

func (f *fakeStore) calls() []touchCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]touchCall(nil), f.touches...)
}

func refN(i int) presence.SessionRef {
	return presence.SessionRef{Room: "r", User: "u", Session: fmt.Sprintf("s%03d", i)}
}

func newTestScheduler(st Store, period time.Duration, slots, batch int) *scheduler {
	return newScheduler(st, period, slots, batch, 5*time.Second, quiet, func(time.Duration, int, error) {})
}

// Every session is refreshed once per period, by one batch per slot, the
// slots a period/N apart: no burst.
func TestSchedulerSpreadsTouchesOverThePeriod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := &fakeStore{}
		s := newTestScheduler(fs, time.Second, 10, 1000)
		for i := range 100 {
			if !s.acquire(refN(i)) {
				t.Fatal("first acquire not first")
			}
		}
		start := time.Now()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { s.run(ctx); close(done) }()
		time.Sleep(3*time.Second + time.Millisecond)
		cancel()
		<-done

		calls := fs.calls()
		if len(calls) != 30 {
			t.Fatalf("%d touches in 3 periods, want 30 (10 slots x 3)", len(calls))
		}
		last := map[presence.SessionRef]time.Time{}
		count := map[presence.SessionRef]int{}
		for i, c := range calls {
			if want := start.Add(time.Duration(i+1) * 100 * time.Millisecond); !c.at.Equal(want) {
				t.Fatalf("touch %d at %v, want %v", i, c.at.Sub(start), want.Sub(start))
			}
			if len(c.refs) != 10 {
				t.Fatalf("touch %d has %d sessions, want 10", i, len(c.refs))
			}
			for _, r := range c.refs {
				if l, ok := last[r]; ok && c.at.Sub(l) != time.Second {
					t.Fatalf("%v refreshed %v after its previous refresh, want exactly the period", r, c.at.Sub(l))
				}
				last[r] = c.at
				count[r]++
			}
		}
		for i := range 100 {
			if count[refN(i)] != 3 {
				t.Fatalf("%v touched %d times, want 3", refN(i), count[refN(i)])
			}
		}
	})
}

// A touch slower than a tick delays the following slots, which are
// caught up at once instead of waiting a whole extra period.
func TestSchedulerCatchesUpAfterASlowTouch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := &fakeStore{delay: func(n int) time.Duration {
			if n == 0 {
				return 350 * time.Millisecond
			}
			return 0
		}}
		s := newTestScheduler(fs, time.Second, 10, 1000)
		for i := range 50 {
			s.acquire(refN(i))
		}
		start := time.Now()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { s.run(ctx); close(done) }()
		time.Sleep(3 * time.Second)
		cancel()
		<-done

		last := map[presence.SessionRef]time.Time{}
		for _, c := range fs.calls() {
			for _, r := range c.refs {
				prev, ok := last[r]
				if !ok {
					prev = start
				}
				if gap := c.at.Sub(prev); gap > time.Second+350*time.Millisecond {
					t.Fatalf("%v went %v without a refresh", r, gap)
				}
				last[r] = c.at
			}
		}
		for i := range 50 {
			if l := last[refN(i)]; start.Add(3*time.Second).Sub(l) > time.Second {
				t.Fatalf("%v last refreshed %v before the end", refN(i), start.Add(3*time.Second).Sub(l))
			}
		}
	})
}

func TestSchedulerBatchesAndBalances(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := &fakeStore{}
		s := newTestScheduler(fs, time.Second, 4, 7)
		for i := range 40 {
			s.acquire(refN(i))
		}
		for i, sl := range s.slots {
			if len(sl) != 10 {
				t.Fatalf("slot %d holds %d sessions, want 10", i, len(sl))
			}
		}
		s.touchSlot(context.Background(), 0)
		if c := fs.calls(); len(c) != 2 || len(c[0].refs) != 7 || len(c[1].refs) != 3 {
			t.Fatalf("batches: %d calls", len(c))
		}
	})
}

func TestSchedulerHoldersShareASession(t *testing.T) {
	fs := &fakeStore{}
	s := newTestScheduler(fs, time.Second, 4, 100)
	ctx := context.Background()
	r := refN(1)
	if err := s.hold(ctx, r); err != nil {
		t.Fatal(err)
	}
	if err := s.hold(ctx, r); err != nil { // a second connection, same session
		t.Fatal(err)
	}
	if len(fs.calls()) != 1 || s.held() != 1 {
		t.Fatalf("two holds: %d touches, %d held; want 1 and 1", len(fs.calls()), s.held())
	}
	if released, err := s.unhold(ctx, r, true); released || err != nil {
		t.Fatalf("first unhold released: %v %v", released, err)
	}
	if released, err := s.unhold(ctx, r, true); !released || err != nil {
		t.Fatalf("last unhold: %v %v", released, err)
	}
	if s.held() != 0 || len(s.slots[0])+len(s.slots[1])+len(s.slots[2])+len(s.slots[3]) != 0 {
		t.Fatal("session still held")
	}
	// Drain: the last holder leaves without a release.
	_ = s.hold(ctx, r)
	if released, _ := s.unhold(ctx, r, false); released {
		t.Fatal("kept session released")
	}
	// A failed first touch holds nothing.
	fs.fail = errors.New("redis down")
	if err := s.hold(ctx, refN(2)); err == nil || s.held() != 0 {
		t.Fatalf("failed hold: %v, %d held", err, s.held())
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fmt.Sprint(fs.log) != "[touch-start 0 touch-end 0 release s001 touch-start 1 touch-end 1 touch-start 2 touch-end 2]" {
		t.Fatalf("store calls: %v", fs.log)
	}
}

// A release waits for a heartbeat touch that copied its session before
// it was dropped; otherwise the touch would revive the released session.
func TestReleaseWaitsForInFlightTouch(t *testing.T) {
	fs := &fakeStore{gate: make(chan struct{})}
	s := newTestScheduler(fs, time.Second, 1, 100)
	r := refN(7)
	s.acquire(r)
	touched := make(chan struct{})
	go func() { s.touchSlot(context.Background(), 0); close(touched) }()
	waitFor(t, 5*time.Second, "the touch to start", func() bool { return len(fs.calls()) == 1 })
	released := make(chan struct{})
	go func() {
		_, _ = s.unhold(context.Background(), r, true)
		close(released)
	}()
	waitFor(t, 5*time.Second, "the session to be dropped", func() bool { return s.held() == 0 })
	time.Sleep(50 * time.Millisecond) // give a broken unhold time to release early
	close(fs.gate)
	<-touched
	<-released
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fmt.Sprint(fs.log) != "[touch-start 0 touch-end 0 release s007]" {
		t.Fatalf("store calls: %v, want the release after the touch", fs.log)
	}
}

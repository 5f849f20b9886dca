package client

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gorilla/websocket"
)

// step is one try of the schedule: how long the link has been down, the
// random number, and the wait expected.
type step struct {
	down time.Duration
	rnd  float64
	want time.Duration
}

// The schedule, figure by figure, at the extremes of its jitter.
func TestScheduleFollowsTheGrace(t *testing.T) {
	const s = time.Second
	for _, c := range []struct {
		name  string
		grace time.Duration
		steps []step
	}{
		{"inside the grace: at most a second apart", 12 * s, []step{
			{0, 0.5, 250 * time.Millisecond}, // first: rnd * 500 ms
			{s, 0, 500 * time.Millisecond},   // then half to all of min(1 s, 500 ms * 2^n)
			{2 * s, 1, s},
			{5 * s, 1, s},
			{10 * s, 1, s},
			{10800 * time.Millisecond, 1, 700 * time.Millisecond}, // the last lands before the grace ends: 11 s - 10.8 s + 0.5 s
			{11 * s, 1, s}, // past grace - margin: full jitter from 1 s
			{12 * s, 1, 2 * s},
			{14 * s, 1, 4 * s},
			{18 * s, 1, 8 * s},
			{26 * s, 1, 10 * s}, // capped
			{36 * s, 0.5, 5 * s},
		}},
		{"a short grace backs off at once", 1500 * time.Millisecond, []step{
			{0, 1, 500 * time.Millisecond}, // inside: grace - margin is 500 ms
			{600 * time.Millisecond, 1, s},
			{1600 * time.Millisecond, 1, 2 * s},
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			sc := schedule{grace: c.grace}
			for i, st := range c.steps {
				if got := sc.next(st.down, false, st.rnd); got != st.want {
					t.Fatalf("step %d (down %v, rnd %v): %v, want %v", i, st.down, st.rnd, got, st.want)
				}
			}
		})
	}
	sc := schedule{}
	for n, want := range []time.Duration{500 * time.Millisecond, s, 2 * s, 4 * s, 8 * s, 10 * s, 10 * s} {
		if got := sc.next(0, true, 1); got != want {
			t.Fatalf("never open, attempt %d: %v, want %v", n, got, want)
		}
	}
	sc.reset()
	if got := sc.next(0, true, 1); got != 500*time.Millisecond {
		t.Fatalf("after reset: %v", got)
	}
	for hint, want := range map[time.Duration][2]time.Duration{0: {750 * time.Millisecond, 1250 * time.Millisecond}, 4 * s: {3 * s, 5 * s}} {
		if lo, hi := retryDelay(hint, 0), retryDelay(hint, 1); lo != want[0] || hi != want[1] {
			t.Fatalf("retryDelay(%v): %v..%v, want %v..%v", hint, lo, hi, want[0], want[1])
		}
	}
}

// The client's own loop keeps to the schedule: with a node that stays
// down, under a fake clock (synctest), the tries come at most a second
// apart until the grace is nearly over, then further apart, never more
// than 10 s; Close stops them.
func TestReconnectLoopKeepsToTheSchedule(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, err := newClient(Config{URL: "ws://node.invalid", Session: "s"})
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var tries []time.Time
		c.dial = func(context.Context, string, http.Header) (*websocket.Conn, *http.Response, error) {
			mu.Lock()
			tries = append(tries, time.Now())
			mu.Unlock()
			return nil, nil, errors.New("connection refused")
		}
		c.sched.grace = 6 * time.Second
		c.rnd = func() float64 { return 0.9 }
		start := time.Now() // the link dropped now
		go func() {
			defer close(c.done)
			c.redial(start, 0)
		}()
		time.Sleep(40 * time.Second) // the fake clock's 40 s
		_ = c.Close()
		mu.Lock()
		defer mu.Unlock()
		if len(tries) < 8 {
			t.Fatalf("%d tries in 40 s", len(tries))
		}
		prev := start
		for i, at := range tries {
			gap, down := at.Sub(prev), prev.Sub(start)
			switch {
			case down < 5*time.Second && gap > time.Second:
				t.Fatalf("try %d, %v after the drop: %v after the one before, inside the grace", i, at.Sub(start), gap)
			case gap > 10*time.Second:
				t.Fatalf("try %d: %v after the one before", i, gap)
			}
			prev = at
		}
		if gap := tries[len(tries)-1].Sub(tries[len(tries)-2]); gap != 9*time.Second {
			t.Fatalf("the last gap %v, want 9 s: 0.9 of the 10 s cap", gap)
		}
	})
}

// Close during a connect attempt ends it quietly: the attempt it cut short
// is not told to OnError as a failed connect.
func TestCloseDuringAConnectTellsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var told []error
		c, err := newClient(Config{URL: "ws://node.invalid", Session: "s", OnError: func(err error) {
			mu.Lock()
			told = append(told, err)
			mu.Unlock()
		}})
		if err != nil {
			t.Fatal(err)
		}
		dialing := make(chan struct{})
		c.dial = func(ctx context.Context, _ string, _ http.Header) (*websocket.Conn, *http.Response, error) {
			close(dialing)
			<-ctx.Done() // a connect that hangs until Close cancels it
			return nil, nil, ctx.Err()
		}
		go func() {
			defer close(c.done)
			c.redial(time.Now(), 0)
		}()
		<-dialing
		_ = c.Close()
		mu.Lock()
		defer mu.Unlock()
		if len(told) != 0 || !errors.Is(c.Err(), ErrClosed) {
			t.Fatalf("OnError told %v, Err %v; want nothing told and ErrClosed", told, c.Err())
		}
	})
}

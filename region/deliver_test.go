package region

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
)

// laneSink holds the publishes of one room at a gate, and records how
// many publishes of each room were under way at once.
type laneSink struct {
	collector
	slow string
	gate chan struct{}

	mu       sync.Mutex
	inflight map[string]int
	most     map[string]int
	held     int // publishes of the slow room that reached the gate
}

func (l *laneSink) Publish(ctx context.Context, ts []presence.Transition) (uint64, error) {
	room := ts[0].Room
	l.mu.Lock()
	l.inflight[room]++
	l.most[room] = max(l.most[room], l.inflight[room])
	if room == l.slow {
		l.held++
	}
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.inflight[room]--
		l.mu.Unlock()
	}()
	if room == l.slow {
		select {
		case <-l.gate:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return l.collector.Publish(ctx, ts)
}

func (l *laneSink) heldAtGate() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held
}

// The deliverer runs each room as a lane: a room whose publish is slow
// (a JetStream ack that takes long) delays only that room's later
// events, which then go in seq order after it; another room's events go
// out meanwhile, instead of waiting for the slow round to end.
func TestASlowRoomDelaysOnlyItsOwnEvents(t *testing.T) {
	rdb, _ := testredis.Client(t)
	sink := &laneSink{slow: "slow", gate: make(chan struct{}), inflight: map[string]int{}, most: map[string]int{}}
	// A lease far longer than the test: nothing is delivered again by the
	// reaper, so what the sink sees is the deliverer's doing alone.
	s := newStore(t, rdb, sink, func(o *Options) { o.AsyncDelivery = true; o.PublishLease = time.Minute })
	startReaper(t, s)
	claim := func(room, user string) {
		t.Helper()
		if _, err := s.Claim(context.Background(), []presence.SessionRef{ref(room, user, "tab")}); err != nil {
			t.Fatal(err)
		}
	}
	claim("slow", "u0")
	testkit.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		return testkit.Want("publishes of the slow room at the gate", sink.heldAtGate(), 1)
	})
	for i := 1; i < 5; i++ {
		claim("slow", fmt.Sprintf("u%d", i))
	}
	claim("fast", "v0")
	testkit.CheckFor(t, 3*time.Second, 5*time.Millisecond, func() error {
		return testkit.Want("the fast room's events delivered while the slow room's publish hangs", len(sink.All()), 1)
	})
	if got := sink.heldAtGate(); got != 1 {
		t.Fatalf("%d publishes of the slow room began while its first was under way, want 1", got)
	}
	close(sink.gate)
	testkit.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		return testkit.Want("events delivered", len(sink.All()), 6)
	})
	var slow []presence.Transition
	for _, tr := range sink.All() {
		if tr.Room == "slow" {
			slow = append(slow, tr)
		}
	}
	var errs []error
	for i, tr := range slow {
		if tr.Seq != uint64(i+1) || tr.User != fmt.Sprintf("u%d", i) {
			errs = append(errs, fmt.Errorf("slow room's %d-th delivered: %s seq %d, want u%d seq %d", i, tr.User, tr.Seq, i, i+1))
		}
	}
	sink.mu.Lock()
	if sink.most["slow"] != 1 {
		errs = append(errs, fmt.Errorf("%d publishes of the slow room under way at once, want 1", sink.most["slow"]))
	}
	sink.mu.Unlock()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// A sink that hangs holds a bounded backlog in the deliverer: once
// outQueue entries wait for their lanes it takes no more, its queue
// fills, and what comes then is left in the outbox for the reaper
// (counted as a publish error) instead of piling up in memory.
func TestAHangingSinkLeavesTheBacklogToTheReaper(t *testing.T) {
	rdb, _ := testredis.Client(t)
	g := &gatedSink{gate: make(chan struct{})}
	s := newStore(t, rdb, g, func(o *Options) { o.AsyncDelivery = true; o.PublishLease = time.Minute })
	startReaper(t, s)
	// More rooms than the lanes and their waiting room hold, in one call.
	var refs []presence.SessionRef
	for i := range deliverParallel + outQueue {
		refs = append(refs, ref(fmt.Sprintf("a%d", i), "u", "tab"))
	}
	if _, err := s.Claim(context.Background(), refs); err != nil {
		t.Fatal(err)
	}
	// Then one delivery more than the queue holds, each its own.
	for i := range outQueue + 1 {
		if _, err := s.Claim(context.Background(), []presence.SessionRef{ref(fmt.Sprintf("b%d", i), "u", "tab")}); err != nil {
			t.Fatal(err)
		}
	}
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		return testkit.AtLeast("deliveries left to the reaper", s.Stats().PublishErrors.Load(), int64(1))
	})
	if n := len(g.All()); n != 0 {
		t.Fatalf("%d delivered through a closed gate", n)
	}
}

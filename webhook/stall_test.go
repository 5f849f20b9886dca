package webhook

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/presence"
)

// Messages that JetStream counts as delivered to the lane's consumer but
// the lane never got (lost in flight on a dropped connection, or taken by
// another client of the same durable, as here) stay invisible until the
// consumer's AckWait, minutes. The lane notices it makes no progress
// while it has lag, and starts over from the consumer's ack floor: the
// events arrive within seconds, in order, and the stall is counted.
func TestStalledLaneStartsOverFromTheAckFloor(t *testing.T) {
	e, r, first, stray, reg := strayBeforeTheLane(t)
	later := []presence.Transition{e.transition("eu", "r1", "u2", presence.Online)}
	e.publish(later...)
	if n := <-stray; n != len(later) {
		t.Fatalf("the stray took %d messages, want %d", n, len(later))
	}
	waitEvents(t, r, 2, 30*time.Second)
	checkContract(t, r, append([]presence.Transition{first}, later...), false)
	if v := counter(t, reg, "presence_webhook_stalls_total"); v < 1 {
		t.Errorf("presence_webhook_stalls_total = %v, want at least 1", v)
	}
}

// A message JetStream counted as delivered to the lane but the lane never
// got, in the middle of a room (taken by a stray client of the durable,
// never acknowledged), opens a gap that lasts past the gap timeout. It is
// still in the stream: the lane reads again from its consumer's ack floor
// before it gives the gap up, and the event itself is delivered, in
// order, with no gap marker.
func TestGapLostInFlightIsReadAgainNotGivenUp(t *testing.T) {
	e, r, first, stray, reg := strayBeforeTheLane(t)
	// The stray asked first: it takes the room's second event, the lane
	// the third, held behind the gap.
	lost := e.transition("eu", "r1", "u2", presence.Online)
	e.publish(lost)
	if n := <-stray; n != 1 {
		t.Fatalf("the stray took %d messages, want 1", n)
	}
	third := e.transition("eu", "r1", "u3", presence.Online)
	e.publish(third)
	testkit.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		for _, ev := range r.events() {
			if ev["id"] == third.ID {
				return nil
			}
		}
		return fmt.Errorf("the third event not accepted (%d events are)", len(r.events()))
	})
	checkContract(t, r, []presence.Transition{first, lost, third}, false)
	for _, it := range r.accepted() {
		if it["kind"] == KindResync {
			t.Errorf("a marker was sent: %v", it)
		}
	}
	if v := counter(t, reg, "presence_webhook_gap_refetches_total"); v < 1 {
		t.Errorf("presence_webhook_gap_refetches_total = %v, want at least 1", v)
	}
}

// strayBeforeTheLane delivers one event of room r1 to a receiver, then
// starts the dispatcher again behind a stray client of the lane's
// durable whose pull request comes first: what is stored next goes to
// the stray (JetStream serves pull requests in turn), which never
// acknowledges it; stray says how many messages it took.
func strayBeforeTheLane(t *testing.T) (*env, *receiver, presence.Transition, chan int, *prometheus.Registry) {
	t.Helper()
	e := newEnv(t, "eu")
	r := newReceiver(t)
	ep := endpoint("a", r.srv.URL)
	ep.GapTimeout = Duration(500 * time.Millisecond)
	d, _ := e.dispatcher(config(t, ep))
	waitLanes(t, e, "a", "eu")
	first := e.transition("eu", "r1", "u1", presence.Online)
	e.publish(first)
	waitEvents(t, r, 1, 20*time.Second)
	d.Close()
	// A stray client of the durable asks first: what is stored next goes
	// to it (JetStream serves pull requests in turn), and it never
	// acknowledges.
	c, err := e.js.Consumer(t.Context(), "PRESENCE_eu", ConsumerName("a"))
	if err != nil {
		t.Fatal(err)
	}
	stray := make(chan int)
	go func() {
		n := 0
		if b, err := c.Fetch(1, jetstream.FetchMaxWait(60*time.Second)); err == nil {
			for range b.Messages() {
				n++
			}
		}
		stray <- n
	}()
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		info, err := c.Info(t.Context())
		if err != nil {
			return err
		}
		return testkit.AtLeast("pull requests waiting, the stray one", info.NumWaiting, 1)
	})
	_, reg := e.dispatcher(config(t, ep))
	testkit.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		info, err := c.Info(t.Context())
		if err != nil {
			return err
		}
		return testkit.AtLeast("pull requests waiting, the stray one and the lane's", info.NumWaiting, 2)
	})
	return e, r, first, stray, reg
}

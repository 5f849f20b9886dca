package node

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testnats"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/region"
)

// A transition as the store returns it (at in local time, the state as
// stored) makes the frame and the events entry that its copy from the bus
// makes, so a member gets the same bytes whichever copy comes first.
func TestAStoredTransitionEncodesAsItsBusCopy(t *testing.T) {
	states := []json.RawMessage{nil, json.RawMessage(`{"a":1}`), json.RawMessage("{ \"typing\" : true,\n \"x\": [1, 2] }"),
		json.RawMessage(`{"html":"<b>&amp;</b>"}`), json.RawMessage(`{"u":"é\u2028"}`)}
	for _, st := range states {
		at := time.UnixMilli(1764444000123).In(time.FixedZone("x", 3600))
		tr := presence.Transition{ID: "eu/r/1764444000000/7", Region: "eu", Room: "r", User: "amy", Kind: presence.Update,
			Reason: presence.State, Sessions: 2, Seq: 7, Epoch: 1764444000000, At: at, Session: "tab1", State: st}
		b, err := bus.EncodeEvent(tr)
		if err != nil {
			t.Fatal(err)
		}
		copyOf, err := bus.DecodeEvent(b)
		if err != nil {
			t.Fatal(err)
		}
		f1, err1 := encodeEvent(tr)
		f2, err2 := encodeEvent(copyOf)
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		if !bytes.Equal(f1, f2) {
			t.Errorf("state %q: frame %s, bus copy's %s", st, f1, f2)
		}
		if e1, e2 := encodeEntry(tr), encodeEntry(copyOf); !bytes.Equal(e1, e2) {
			t.Errorf("state %q: entry %s, bus copy's %s", st, e1, e2)
		}
	}
}

// A member sees a join made on its own node as soon as the store has it,
// while the bus has not delivered it yet; the bus's copy, when it comes,
// is not passed on a second time.
func TestAJoinReachesMembersOnItsNodeBeforeTheBus(t *testing.T) {
	e := newEnv(t)
	gate := make(chan struct{})
	inner := natsSink(testnats.Connect(t, e.ns))
	held := region.SinkFunc(func(ctx context.Context, ts []presence.Transition) (uint64, error) {
		select {
		case <-gate:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		return inner.Publish(ctx, ts)
	})
	st, err := region.New(e.rdb, region.Options{Region: "eu", Timing: testTiming, Sink: held, PublishLease: 10 * time.Second,
		AsyncDelivery: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	nd := e.newNodeOn(st)

	amy := nd.dial(t, token(t, "amy", []string{"room"}, time.Hour), "a1")
	amy.join("room")
	bob := nd.dial(t, token(t, "bob", []string{"room"}, time.Hour), "b1")
	bob.join("room")
	if f := amy.expect("event"); f.Event.Kind != presence.Online || f.Event.User != "bob" {
		t.Fatalf("amy got %s, want bob's online", f.raw)
	}
	if got := e.rec.Of(presence.Online, "room", "bob"); len(got) != 0 {
		t.Fatalf("the bus delivered bob's online already (%v): the sink was to hold it", got)
	}

	close(gate)
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		return e.rec.WantOf(presence.Online, "room", "bob", 1)
	})
	// Once the node has dropped both bus copies (amy's online and bob's),
	// a ping's pong comes next, with no second online before it.
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		return testkit.Want("bus copies passed on already", counterValue(t, nd.metrics.busCopies), 2.0)
	})
	amy.ping()
}

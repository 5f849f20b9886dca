package bus_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testnats"
	"github.com/presence-dev/presence/presence"
)

// recorder is a core subscription that keeps what it receives.
type recorder struct{ testkit.Recorder[*nats.Msg] }

func record(tb testing.TB, nc *nats.Conn, subject string) *recorder {
	tb.Helper()
	r := &recorder{}
	sub, err := nc.Subscribe(subject, r.Add)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		tb.Fatal(err)
	}
	return r
}

func (r *recorder) subjects() []string {
	msgs := r.All()
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.Subject
	}
	return out
}

func TestPublisherStoresOnceAndFansOut(t *testing.T) {
	s := testnats.Start(t)
	eu := newEnvOn(t, testnats.Connect(t, s), "eu")
	us := newEnvOn(t, testnats.Connect(t, s), "us")
	sub := testnats.Connect(t, s)
	all := record(t, sub, "presence.>")
	room42 := record(t, sub, "presence.*.room42.>")
	euOff := record(t, sub, "presence.eu.*.offline.*")

	batch := []presence.Transition{
		tr("eu", "room42", "u1", presence.Online, 1),
		tr("eu", "room42", "u2", presence.Online, 2),
		tr("eu", "room42", "u1", presence.Offline, 3),
	}
	other := []presence.Transition{tr("eu", "room7", "u3", presence.Offline, 1)}
	usBatch := []presence.Transition{tr("us", "room42", "u4", presence.Online, 1)}

	seq, err := eu.pub.Publish(t.Context(), batch)
	if err != nil {
		t.Fatal(err)
	}
	if info := streamInfo(t, eu.stream); info.State.Msgs != 3 || info.State.LastSeq != seq || seq != 3 {
		t.Fatalf("after first publish: seq %d, stream %+v", seq, info.State)
	}
	// A retry of the same ids stores nothing and reports the original
	// sequence of the last one.
	again, err := eu.pub.Publish(t.Context(), batch)
	if err != nil {
		t.Fatal(err)
	}
	if info := streamInfo(t, eu.stream); info.State.Msgs != 3 || again != seq {
		t.Fatalf("retry doubled: seq %d -> %d, stream %+v", seq, again, info.State)
	}
	// A retry that overlaps new transitions stores only the new ones.
	mixed := append(batch[1:], tr("eu", "room42", "u2", presence.Offline, 4))
	if seq, err = eu.pub.Publish(t.Context(), mixed); err != nil || seq != 4 {
		t.Fatalf("mixed retry: %d %v", seq, err)
	}
	if seq, err = eu.pub.Publish(t.Context(), other); err != nil || seq != 5 {
		t.Fatalf("room7: %d %v", seq, err)
	}
	if info := streamInfo(t, eu.stream); info.State.Msgs != 5 || info.State.LastSeq != seq {
		t.Fatalf("stream: %+v", info.State)
	}
	if _, err := us.pub.Publish(t.Context(), usBatch); err != nil {
		t.Fatal(err)
	}

	// Core subscribers see what the stream stored, once each, retries
	// and all: the stream republishes each message it stores.
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.Want("core deliveries", all.Len(), 3+1+1+1) })
	for _, m := range all.All() {
		tr, err := bus.DecodeEvent(m.Data)
		if err != nil {
			t.Errorf("undecodable event on %s: %v", m.Subject, err)
			continue
		}
		if bus.EventSubject(tr) != m.Subject {
			t.Errorf("event %s came on %s", tr, m.Subject)
		}
		if m.Header.Get(jetstream.MsgIDHeader) != tr.ID {
			t.Errorf("Nats-Msg-Id %q, event id %q", m.Header.Get(jetstream.MsgIDHeader), tr.ID)
		}
	}

	want42 := "presence.eu.room42.online.u1 presence.eu.room42.online.u2 presence.eu.room42.offline.u1 " +
		"presence.eu.room42.offline.u2 presence.us.room42.online.u4"
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.Want("room42 deliveries", room42.Len(), 5) })
	if got := strings.Join(room42.subjects(), " "); got != want42 {
		t.Fatalf("presence.*.room42.> got\n%s\nwant\n%s", got, want42)
	}
	wantOff := "presence.eu.room42.offline.u1 presence.eu.room42.offline.u2 presence.eu.room7.offline.u3"
	if got := strings.Join(euOff.subjects(), " "); got != wantOff {
		t.Fatalf("presence.eu.*.offline.* got\n%s\nwant\n%s", got, wantOff)
	}
}

func TestPublisherRejects(t *testing.T) {
	e := newEnv(t, "eu")
	for name, ts := range map[string][]presence.Transition{
		"other region": {tr("us", "r", "u", presence.Online, 1)},
		"bad room":     {tr("eu", "r.1", "u", presence.Online, 1)},
		"bad user":     {tr("eu", "r", "u*", presence.Online, 1)},
		"no id":        {{Region: "eu", Room: "r", User: "u", Kind: presence.Online}},
		"bad kind":     {{ID: "x", Region: "eu", Room: "r", User: "u", Kind: "away"}},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := e.pub.Publish(t.Context(), ts); err == nil || !strings.HasPrefix(err.Error(), "bus: publish") {
				t.Errorf("%s: %v", name, err)
			}
		})
	}
	if info := streamInfo(t, e.stream); info.State.Msgs != 0 {
		t.Fatalf("rejected batches stored %d messages", info.State.Msgs)
	}
	if seq, err := e.pub.Publish(t.Context(), nil); seq != 0 || err != nil {
		t.Fatalf("empty batch: %d %v", seq, err)
	}
	if _, err := bus.NewPublisher(e.js, "global").Publish(t.Context(), []presence.Transition{tr("global", "r", "u", presence.Online, 1)}); err == nil {
		t.Fatal("publisher for the global token published")
	}
}

// The region's stream is gone (its JetStream store was lost): the
// publisher makes it again, with its configuration. A batch numbered
// before the new stream was made is refused whole (its room starts a new
// epoch first); one numbered after is stored once; nothing of a failed
// attempt reaches subscribers.
func TestPublisherRecreatesAMissingStream(t *testing.T) {
	e := newEnv(t, "eu")
	all := record(t, e.nc, "presence.>")
	if err := e.js.DeleteStream(t.Context(), "PRESENCE_eu"); err != nil {
		t.Fatal(err)
	}
	pub := bus.NewPublisher(e.js, "eu", bus.WithStreamConfig(bus.StreamConfig{Region: "eu", MaxAge: 3 * time.Hour}))
	old := []presence.Transition{tr("eu", "r", "u1", presence.Online, 1), tr("eu", "r", "u2", presence.Online, 2)}
	if seq, err := pub.Publish(t.Context(), old); err == nil || seq != 0 || pub.Err() == nil {
		t.Fatalf("a batch numbered before the new stream: %d %v", seq, err)
	}
	st, err := e.js.Stream(t.Context(), "PRESENCE_eu")
	if err != nil {
		t.Fatal(err)
	}
	info := streamInfo(t, st)
	if info.State.Msgs != 0 || info.Config.MaxAge != 3*time.Hour {
		t.Fatalf("recreated stream: %+v %+v", info.State, info.Config)
	}
	floor, err := pub.EpochFloor(t.Context())
	if err != nil || floor != info.Created.UnixMilli() {
		t.Fatalf("epoch floor %d %v, want the stream's creation %d", floor, err, info.Created.UnixMilli())
	}
	renumbered := make([]presence.Transition, len(old))
	for i, t := range old {
		t.Epoch = floor
		t.ID = fmt.Sprintf("eu/r/%d/%d", floor, t.Seq)
		renumbered[i] = t
	}
	seq, err := pub.Publish(t.Context(), renumbered)
	if err != nil || seq != 2 || pub.Err() != nil {
		t.Fatalf("the batch renumbered: %d %v", seq, err)
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.AtLeast("deliveries", all.Len(), 2) })
	if n := all.Len(); n != 2 {
		t.Fatalf("%d deliveries, want 2", n)
	}
}

// EpochFloor is the stream's creation time. A publish that finds the
// stream gone makes it again and moves the floor to the new stream at
// once, refusing its batch of the old numbering.
func TestEpochFloorFollowsTheStream(t *testing.T) {
	e := newEnv(t, "eu")
	first, err := e.pub.EpochFloor(t.Context())
	if err != nil || first != streamInfo(t, e.stream).Created.UnixMilli() {
		t.Fatalf("floor %d %v", first, err)
	}
	if err := e.js.DeleteStream(t.Context(), "PRESENCE_eu"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Millisecond) // a later creation, to the millisecond
	// The publish finds no stream, makes it again and refuses the batch
	// numbered before it.
	b := tr("eu", "r", "u", presence.Online, 1)
	b.Epoch, b.ID = first, fmt.Sprintf("eu/r/%d/1", first)
	if _, err := e.pub.Publish(t.Context(), []presence.Transition{b}); err == nil {
		t.Fatal("a batch of the old numbering was stored in the new stream")
	}
	again, err := e.pub.EpochFloor(t.Context())
	if err != nil || again <= first {
		t.Fatalf("floor after the stream was made again: %d (was %d) %v", again, first, err)
	}
}

// A subscriber of presence.> that answers what it receives (request
// handlers do) cannot break publishing: what it receives was already
// stored and carries no reply subject.
func TestPublisherIgnoresSubscribersThatReply(t *testing.T) {
	e := newEnv(t, "eu")
	sub, err := e.nc.Subscribe("presence.>", func(m *nats.Msg) { _ = m.Respond([]byte("ok")) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	for i := range 20 {
		if _, err := e.pub.Publish(t.Context(), []presence.Transition{tr("eu", "r", fmt.Sprintf("u%d", i), presence.Online, uint64(i+1))}); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	if info := streamInfo(t, e.stream); info.State.Msgs != 20 {
		t.Fatalf("stored %d, want 20", info.State.Msgs)
	}
}

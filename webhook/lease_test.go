package webhook

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A refresh that was stored but whose reply was lost (a timeout) moved
// the lease key's revision on: the next refresh fails its revision check,
// reads the key, finds it still names this dispatcher and keeps the
// lease. A key that names another is not taken over.
func TestLeaseKeptAfterARefreshWhoseReplyWasLost(t *testing.T) {
	e := newEnv(t)
	ttl := 2 * time.Second
	st := newState(e.js, stateConfig{MaxAge: time.Hour, Replicas: 1, LeaseTTL: ttl})
	if _, err := st.bucket(t.Context()); err != nil {
		t.Fatal(err)
	}
	ls := newLeases(st, "one", ttl, slog.New(slog.DiscardHandler))
	l := LaneID{Endpoint: "a", Source: "eu"}
	if !ls.acquire(t.Context(), l, time.Now()) {
		t.Fatal("the free lane was not taken")
	}
	lost := func(id string) {
		t.Helper()
		// What the lost refresh stored: the dispatcher never learnt its revision.
		if _, err := e.js.PublishMsg(t.Context(), &nats.Msg{Subject: ls.subject(laneKey("lease", l)), Data: []byte(id)},
			jetstream.WithMsgTTL(ttl)); err != nil {
			t.Fatal(err)
		}
	}
	lost("one")
	if !ls.refresh(t.Context(), l, time.Now()) {
		t.Fatal("the lease was dropped though its key still names this dispatcher")
	}
	if !ls.refresh(t.Context(), l, time.Now()) {
		t.Fatal("the refresh after the adopted revision failed")
	}
	lost("other")
	if ls.refresh(t.Context(), l, time.Now()) {
		t.Fatal("a lease whose key names another dispatcher was kept")
	}
	kv, err := st.bucket(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if v, err := kv.Get(t.Context(), laneKey("lease", l)); err != nil || string(v.Value()) != "other" {
		t.Fatalf("the lease key = %v, %v; want the other's", v, err)
	}
}

// With NATS gone, a refresh is not waited for past the lease's until: it
// ends by then and the lease is lost, not kept on the strength of a time
// read before the wait (the key expires a quarter TTL later, and another
// dispatcher may take it).
func TestLeaseLostByItsUntilWhenNATSIsGone(t *testing.T) {
	e := newEnv(t)
	ttl := 2 * time.Second
	st := newState(e.js, stateConfig{MaxAge: time.Hour, Replicas: 1, LeaseTTL: ttl})
	if _, err := st.bucket(t.Context()); err != nil {
		t.Fatal(err)
	}
	ls := newLeases(st, "one", ttl, slog.New(slog.DiscardHandler))
	l := LaneID{Endpoint: "a", Source: "eu"}
	if !ls.acquire(t.Context(), l, time.Now()) {
		t.Fatal("the free lane was not taken")
	}
	until := ls.held[l].until
	e.ns.Shutdown()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	// The refresh begins before until, as a tick may.
	kept := ls.refresh(ctx, l, until.Add(-200*time.Millisecond))
	if late := time.Since(until); late > time.Second {
		t.Errorf("the refresh returned %v after the lease's until", late.Round(time.Millisecond))
	}
	if kept {
		t.Error("the lease was kept past its until with NATS gone")
	}
}

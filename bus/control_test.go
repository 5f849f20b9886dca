package bus_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/region"
)

// drops records what the region's nodes are told.
func drops(tb testing.TB, e *env) *testkit.Recorder[bus.Drop] {
	tb.Helper()
	got := &testkit.Recorder[bus.Drop]{}
	nc := connectLike(tb, e)
	if _, err := bus.SubscribeDrops(nc, "eu", func(d bus.Drop) { got.Add(d) }); err != nil {
		tb.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		tb.Fatal(err)
	}
	return got
}

// disconnectEnv is a region's bus and store, its service with the
// disconnect endpoint, and what its nodes are told.
func disconnectEnv(t *testing.T) (*env, *region.Store, *testkit.Recorder[bus.Drop]) {
	t.Helper()
	e := newEnv(t, "eu")
	st := newStore(t, e.pub)
	d, err := bus.NewRegionDisconnect(e.nc, "eu", st)
	if err != nil {
		t.Fatal(err)
	}
	startService(t, e, st, bus.WithDisconnect(d))
	return e, st, drops(t, e)
}

// A disconnect through the service records the revocation in the store,
// then tells every node; one without revoke_until writes nothing.
func TestDisconnectRevokesThenTellsTheNodes(t *testing.T) {
	e, st, got := disconnectEnv(t)
	cl := bus.NewClient(connectLike(t, e), "eu")

	until := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	rep, err := cl.Disconnect(t.Context(), bus.DisconnectRequest{User: "alice", RevokeUntil: &until})
	if err != nil || rep.Region != "eu" || rep.User != "alice" || rep.RevokedUntil == nil || !rep.RevokedUntil.Equal(until) {
		t.Fatalf("disconnect: %+v %v", rep, err)
	}
	revs, err := st.Revocations(t.Context())
	if err != nil || len(revs) != 1 || revs[0].User != "alice" || revs[0].Room != "" || !revs[0].Until.Equal(until) {
		t.Fatalf("revocations: %+v %v", revs, err)
	}
	rep, err = cl.Disconnect(t.Context(), bus.DisconnectRequest{User: "bob", Room: "room42"})
	if err != nil || rep.Room != "room42" || rep.RevokedUntil != nil {
		t.Fatalf("disconnect without revocation: %+v %v", rep, err)
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.Want("drops", got.Len(), 2) })
	all := got.All()
	if all[0].User != "alice" || all[0].Until == nil || !all[0].Until.Equal(until) || all[1] != (bus.Drop{User: "bob", Room: "room42"}) {
		t.Fatalf("drops: %+v", all)
	}
	if revs, _ := st.Revocations(t.Context()); len(revs) != 1 {
		t.Fatalf("a disconnect without revoke_until revoked: %+v", revs)
	}
}

func TestDisconnectRefusesBadRequests(t *testing.T) {
	e, st, got := disconnectEnv(t)
	past := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	far := time.Now().Add(presence.MaxRevocation + time.Hour).UTC().Format(time.RFC3339)
	for _, c := range []struct{ body, want string }{
		{``, "empty request"},
		{`{"user":"u","kick":true}`, `unknown field "kick"`},
		{`{"user":"a.b"}`, "invalid user id"},
		{`{"user":"u","room":"r*"}`, "invalid room id"},
		{`{"user":"u","revoke_until":"tomorrow"}`, "bad request JSON"},
		{`{"user":"u","revoke_until":"` + past + `"}`, "not after now"},
		{`{"user":"u","revoke_until":"` + far + `"}`, "at most 720h0m0s"},
	} {
		data, code, desc := request(t, e.nc, bus.DisconnectSubject("eu"), c.body)
		var er bus.ErrorReply
		if code != "400" || !strings.Contains(desc, c.want) || json.Unmarshal(data, &er) != nil || er.Code != "400" {
			t.Errorf("%s: %s %q %s, want 400 mentioning %s", c.body, code, desc, data, c.want)
		}
	}
	// A good one after them: the bad ones told nobody and wrote nothing.
	if _, code, desc := request(t, e.nc, bus.DisconnectSubject("eu"), `{"user":"u"}`); code != "" {
		t.Fatalf("good request: %s %s", code, desc)
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.Want("drops", got.Len(), 1) })
	if revs, _ := st.Revocations(t.Context()); len(revs) != 0 || got.All()[0].User != "u" {
		t.Fatalf("revocations %+v, drops %+v", revs, got.All())
	}
}

// A region whose NATS is gone answers 503; the revocation asked for is
// recorded all the same, for the nodes' next read.
func TestDisconnectWithoutNATSIs503(t *testing.T) {
	e := newEnv(t, "eu")
	st := newStore(t, e.pub)
	nc := connectLike(t, e)
	d, err := bus.NewRegionDisconnect(nc, "eu", st)
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
	until := time.Now().Add(time.Minute)
	_, err = d.Disconnect(t.Context(), bus.DisconnectRequest{User: "alice", RevokeUntil: &until})
	var qe *bus.QueryError
	if !errors.As(err, &qe) || qe.Code != bus.CodeUnavailable {
		t.Fatalf("err %v, want 503", err)
	}
	if revs, _ := st.Revocations(t.Context()); len(revs) != 1 {
		t.Fatalf("revocations: %+v", revs)
	}
	if _, err := bus.NewRegionDisconnect(nil, "eu", st); err == nil {
		t.Fatal("a disconnecter without NATS")
	}
	if _, err := bus.NewRegionDisconnect(e.nc, "global", st); err == nil {
		t.Fatal("a regional disconnecter of the global view")
	}
}

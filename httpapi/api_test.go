package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/presence"
)

// Every endpoint answers what the micro service answers for the same
// request: one implementation, two transports.
func TestEndpointsAnswerAsTheMicroService(t *testing.T) {
	f := newFixture(t)
	f.claim(ref("room42", "alice", "tab1"), ref("room42", "alice", "tab2"), ref("room42", "bob", "phone"), ref("lobby", "bob", "phone"))
	if ok, err := f.store.SetState(context.Background(), ref("room42", "alice", "tab2"), json.RawMessage(`{"status":"away"}`)); !ok || err != nil {
		t.Fatalf("state: %v %v", ok, err)
	}
	api := func(e string) string { return bus.APISubject("eu", e) }
	for _, c := range []struct {
		path, subject, body string
		post                string
		out                 func() (any, any)
	}{
		{"/v1/rooms/room42/members?offset=0&limit=10", api("members"), `{"room":"room42","limit":10}`, "", pair[presence.Snapshot]},
		{"/v1/rooms/room42/members?offset=1&limit=1", api("members"), `{"room":"room42","offset":1,"limit":1}`, "", pair[presence.Snapshot]},
		{"/v1/rooms/nobody-here/members", api("members"), `{"room":"nobody-here"}`, "", pair[presence.Snapshot]},
		{"/v1/rooms/room42/count", api("count"), `{"room":"room42"}`, "", pair[bus.CountReply]},
		{"/v1/rooms/room42/users/alice", api("user"), `{"room":"room42","user":"alice"}`, "", pair[bus.UserReply]},
		{"/v1/rooms/room42/users/nobody", api("user"), `{"room":"room42","user":"nobody"}`, "", pair[bus.UserReply]},
		{"/v1/users/bob", api("last_seen"), `{"user":"bob"}`, "", pair[bus.LastSeenReply]},
		{"/v1/rooms?limit=1", api("rooms"), `{"limit":1}`, "", pair[bus.RoomsReply]},
		{"/v1/rooms?prefix=room&cursor=lobby", api("rooms"), `{"prefix":"room","cursor":"lobby"}`, "", pair[bus.RoomsReply]},
		{"/v1/rooms:batch-count", api("counts"), `{"rooms":["room42","lobby","empty"]}`, `{"rooms":["room42","lobby","empty"]}`, pair[bus.CountsReply]},
	} {
		var r = f.read.Get(c.path)
		if c.post != "" {
			r = f.read.Post(c.path, c.post)
		}
		if r.Status != http.StatusOK {
			t.Fatalf("%s: %d %s", c.path, r.Status, r.Body)
		}
		viaHTTP, viaNATS := c.out()
		r.JSON(t, viaHTTP)
		f.micro(c.subject, c.body, viaNATS)
		a, b := canon(t, viaHTTP), canon(t, viaNATS)
		if a != b {
			t.Errorf("%s:\nhttp %s\nnats %s", c.path, a, b)
		}
	}
	var snap presence.Snapshot
	f.read.Get("/v1/rooms/room42/members").JSON(t, &snap)
	if snap.Total != 2 || len(snap.Members) != 2 || snap.Members[0].User != "alice" || len(snap.Members[0].Sessions) != 2 ||
		string(snap.Members[0].Sessions[1].State) != `{"status":"away"}` || snap.RoomSeq == 0 || snap.Epoch == 0 {
		t.Fatalf("members: %+v", snap)
	}
	var u bus.UserReply
	f.read.Get("/v1/rooms/room42/users/bob").JSON(t, &u)
	if !u.Online || u.LastSeen == nil || u.Member == nil || u.Member.Sessions[0].ID != "phone" {
		t.Fatalf("bob: %+v", u)
	}
}

func pair[T any]() (any, any) { return new(T), new(T) }

// canon is v's JSON without "at", the snapshot's read time; every other
// time is stored, in whole seconds.
func canon(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	delete(m, "at")
	out, _ := json.Marshal(m)
	return string(out)
}

// Bad input gets a clear JSON error and changes nothing.
func TestBadInputIsRefusedAndChangesNothing(t *testing.T) {
	f := newFixture(t)
	f.claim(ref("room42", "alice", "tab1"))
	long := strings.Repeat("r", 129)
	for _, c := range []struct {
		method, path, body string
		status             int
		want               string
	}{
		{"GET", "/v1/rooms/a.b/count", "", 400, "invalid room id"},
		{"GET", "/v1/rooms/" + long + "/count", "", 400, "longer than 128 bytes"},
		{"GET", "/v1/rooms/r%2A/members", "", 400, "invalid room id"},
		{"GET", "/v1/rooms/room42/users/u%20u", "", 400, "invalid user id"},
		{"GET", "/v1/users/a%3Ab", "", 400, "invalid user id"},
		{"GET", "/v1/rooms/room42/members?offset=-1", "", 400, "offset must be >= 0"},
		{"GET", "/v1/rooms/room42/members?limit=1001", "", 400, "limit must be between 1 and 1000"},
		{"GET", "/v1/rooms/room42/members?limit=-5", "", 400, "limit must be between 1 and 1000"},
		{"GET", "/v1/rooms/room42/members?limit=ten", "", 400, "limit must be an integer"},
		{"GET", "/v1/rooms/room42/members?limit=1&limit=2", "", 400, "given 2 times"},
		{"GET", "/v1/rooms/room42/members?lmit=5", "", 400, `unknown query parameter "lmit"`},
		{"GET", "/v1/rooms/room42/count?x=1", "", 400, "unknown query parameter"},
		{"GET", "/v1/rooms?prefix=a.b", "", 400, "prefix and cursor must be empty or room ids"},
		{"GET", "/v1/rooms?limit=0x10", "", 400, "limit must be an integer"},
		{"POST", "/v1/rooms:batch-count", "", 400, "empty body"},
		{"POST", "/v1/rooms:batch-count", `{"rooms":[]}`, 400, "rooms must hold 1 to 100"},
		{"POST", "/v1/rooms:batch-count", `{"rooms":["a","b*"]}`, 400, "rooms[1]"},
		{"POST", "/v1/rooms:batch-count", `{"rooms":["a"],"x":1}`, 400, `unknown field "x"`},
		{"POST", "/v1/rooms:batch-count", `{"rooms":["a"]} []`, 400, "data after the object"},
		{"POST", "/v1/rooms:batch-count", `{"rooms":[` + strings.Repeat(`"r",`, 100) + `"r"]}`, 400, "got 101"},
		{"POST", "/v1/users/a.b/disconnect", "", 400, "invalid user id"},
		{"POST", "/v1/users/alice/disconnect", `{"revoke_until":"soon"}`, 400, "bad request JSON"},
		{"POST", "/v1/users/alice/disconnect", `{"revoke_until":"2001-01-01T00:00:00Z"}`, 400, "not after now"},
		{"POST", "/v1/users/alice/disconnect", `{"revoke_until":"2999-01-01T00:00:00Z"}`, 400, "at most 720h0m0s"},
		{"POST", "/v1/users/alice/disconnect", `{"revoke":true}`, 400, `unknown field "revoke"`},
		{"POST", "/v1/rooms/r%2Ax/users/alice/disconnect", "", 400, "invalid room id"},
		{"GET", "/v1/rooms/room42", "", 404, "no such endpoint"},
		{"GET", "/v1/rooms/room42/users", "", 404, "no such endpoint"},
		{"GET", "/v1/users/alice/rooms", "", 404, "no such endpoint"},
		{"DELETE", "/v1/rooms/room42/count", "", 405, "/v1/rooms/room42/count takes GET, not \"DELETE\""},
		{"GET", "/v1/users/alice/disconnect", "", 405, "takes POST"},
		{"POST", "/v1/rooms", "", 405, "takes GET"},
	} {
		r := f.admin.Do(c.method, c.path, c.body, nil)
		_, msg := r.Error(t, c.status)
		if !strings.Contains(msg, c.want) {
			t.Errorf("%s %s %s: %q, want it to mention %q", c.method, c.path, c.body, msg, c.want)
		}
		if c.status == 405 && r.Header.Get("Allow") == "" {
			t.Errorf("%s %s: 405 without Allow", c.method, c.path)
		}
	}
	if revs, _ := f.store.Revocations(context.Background()); len(revs) != 0 || f.drops.Len() != 0 {
		t.Fatalf("refused requests revoked %+v, told the nodes %+v", revs, f.drops.All())
	}
	if n, _ := f.store.Count(context.Background(), "room42"); n != 1 {
		t.Fatalf("room42 count %d", n)
	}
}

// A disconnect records its revocation and tells the region's nodes; its
// reply says what it did.
func TestDisconnectEndpoints(t *testing.T) {
	f := newFixture(t)
	until := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	r := f.admin.Post("/v1/users/alice/disconnect", `{"revoke_until":"`+until.Format(time.RFC3339)+`"}`)
	var rep bus.DisconnectReply
	r.JSON(t, &rep)
	if r.Status != 200 || rep.User != "alice" || rep.Room != "" || rep.RevokedUntil == nil || !rep.RevokedUntil.Equal(until) {
		t.Fatalf("user disconnect: %d %s", r.Status, r.Body)
	}
	r = f.admin.Post("/v1/rooms/room42/users/bob/disconnect", "")
	r.JSON(t, &rep)
	if r.Status != 200 || rep.User != "bob" || rep.Room != "room42" || rep.RevokedUntil != nil || !strings.Contains(string(r.Body), `"revoked_until":null`) {
		t.Fatalf("room disconnect: %d %s", r.Status, r.Body)
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.Want("drops", f.drops.Len(), 2) })
	if d := f.drops.All(); d[0].User != "alice" || d[0].Until == nil || d[1] != (bus.Drop{User: "bob", Room: "room42"}) {
		t.Fatalf("drops: %+v", d)
	}
	revs, err := f.store.Revocations(context.Background())
	if err != nil || len(revs) != 1 || revs[0].User != "alice" || !revs[0].Until.Equal(until) {
		t.Fatalf("revocations: %+v %v", revs, err)
	}
}

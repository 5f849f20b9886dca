package bus_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"maps"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/region"
)

func startService(tb testing.TB, e *env, r bus.Reader, opts ...bus.ServiceOption) micro.Service {
	tb.Helper()
	svc, err := bus.StartService(e.nc, "eu", r, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = svc.Stop() })
	return svc
}

// fakeReader stands in for the store where a test needs a backend that
// fails, hangs or panics; calls counts every read.
type fakeReader struct {
	calls atomic.Int64
	err   error
	hang  bool
	panic bool
}

func (f *fakeReader) do(ctx context.Context) error {
	f.calls.Add(1)
	if f.panic {
		panic("backend bug")
	}
	if f.hang {
		<-ctx.Done()
		return ctx.Err()
	}
	return f.err
}

func (f *fakeReader) Snapshot(ctx context.Context, room string, offset, limit int) (presence.Snapshot, error) {
	return presence.Snapshot{Region: "eu", Room: room, Offset: offset}, f.do(ctx)
}

func (f *fakeReader) Count(ctx context.Context, room string) (int, error) { return 0, f.do(ctx) }

func (f *fakeReader) Sessions(ctx context.Context, room, user string) (presence.Member, bool, error) {
	return presence.Member{}, false, f.do(ctx)
}

func (f *fakeReader) LastSeen(ctx context.Context, user string) (time.Time, bool, error) {
	return time.Time{}, false, f.do(ctx)
}

func (f *fakeReader) ListRooms(ctx context.Context, prefix, after string, limit int) ([]presence.RoomCount, string, error) {
	return nil, "", f.do(ctx)
}

func (f *fakeReader) Counts(ctx context.Context, rooms []string) ([]int, error) {
	return make([]int, len(rooms)), f.do(ctx)
}

func TestServiceDiscoverable(t *testing.T) {
	e := newEnv(t, "eu")
	startService(t, e, &fakeReader{})

	var ping micro.Ping
	m, err := e.nc.Request("$SRV.PING.presence", nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(m.Data, &ping); err != nil || ping.Name != "presence" || ping.Version != bus.Version || ping.Metadata["region"] != "eu" {
		t.Fatalf("ping %s: %v", m.Data, err)
	}
	var info micro.Info
	m, err = e.nc.Request("$SRV.INFO.presence", nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(m.Data, &info); err != nil {
		t.Fatal(err)
	}
	subjects := map[string]string{}
	for _, ep := range info.Endpoints {
		subjects[ep.Name] = ep.Subject
	}
	want := map[string]string{"members": "presence-api.eu.members", "count": "presence-api.eu.count", "user": "presence-api.eu.user",
		"last_seen": "presence-api.eu.last_seen", "rooms": "presence-api.eu.rooms", "counts": "presence-api.eu.counts"}
	if !maps.Equal(subjects, want) {
		t.Fatalf("endpoints: %+v", info.Endpoints)
	}
	if _, err := bus.StartService(e.nc, "e.u", &fakeReader{}); err == nil {
		t.Fatal("service for a bad region started")
	}
	if _, err := bus.StartService(e.nc, "eu", nil); err == nil {
		t.Fatal("service without a reader started")
	}
}

func TestServiceEndpoints(t *testing.T) {
	e := newEnv(t, "eu")
	st := newStore(t, e.pub)
	startService(t, e, st)
	c := t.Context()

	if _, err := st.Claim(c, []presence.SessionRef{ref("room42", "u1", "tab1"), ref("room42", "u1", "tab2"), ref("room42", "u2", "tab1"), ref("room42", "u3", "tab1")}); err != nil {
		t.Fatal(err)
	}
	if ok, err := st.SetState(c, ref("room42", "u1", "tab2"), json.RawMessage(`{"status":"away"}`)); !ok || err != nil {
		t.Fatalf("SetState: %v %v", ok, err)
	}
	// u3 closed cleanly: still a member, the session listed, for the grace.
	if err := st.Release(c, ref("room42", "u3", "tab1")); err != nil {
		t.Fatal(err)
	}

	var snap presence.Snapshot
	query(t, e.nc, "members", `{"room":"room42"}`, &snap)
	if snap.Region != "eu" || snap.Room != "room42" || snap.Total != 3 || len(snap.Members) != 3 || snap.RoomSeq != 5 {
		t.Fatalf("members: %+v", snap)
	}
	if info := streamInfo(t, e.stream); snap.StreamSeq != info.State.LastSeq {
		t.Fatalf("snapshot stream seq %d, stream last %d", snap.StreamSeq, info.State.LastSeq)
	}
	u1 := snap.Members[0]
	states := map[string]string{}
	for _, s := range u1.Sessions {
		states[s.ID] = string(s.State)
	}
	if u1.User != "u1" || len(states) != 2 || states["tab2"] != `{"status":"away"}` || states["tab1"] != "" ||
		snap.Members[2].User != "u3" || len(snap.Members[2].Sessions) != 1 {
		t.Fatalf("members: %+v", snap.Members)
	}
	query(t, e.nc, "members", `{"room":"room42","offset":1,"limit":1}`, &snap)
	if snap.Total != 3 || snap.Offset != 1 || len(snap.Members) != 1 || snap.Members[0].User != "u2" {
		t.Fatalf("page: %+v", snap)
	}
	query(t, e.nc, "members", `{"room":"empty"}`, &snap)
	if snap.Total != 0 || snap.Members == nil || len(snap.Members) != 0 {
		t.Fatalf("empty room: %+v", snap)
	}
	// members is always a list, never null.
	data, _, _ := request(t, e.nc, bus.APISubject("eu", "members"), `{"room":"empty"}`)
	if !strings.Contains(string(data), `"members":[]`) {
		t.Fatalf("empty room JSON: %s", data)
	}

	var cnt bus.CountReply
	query(t, e.nc, "count", `{"room":"room42"}`, &cnt)
	if cnt != (bus.CountReply{Region: "eu", Room: "room42", Count: 3}) {
		t.Fatalf("count: %+v", cnt)
	}

	var u bus.UserReply
	query(t, e.nc, "user", `{"room":"room42","user":"u1"}`, &u)
	if !u.Online || u.Member == nil || len(u.Member.Sessions) != 2 || u.Member.User != "u1" || u.LastSeen == nil || time.Since(*u.LastSeen) > time.Minute {
		t.Fatalf("user u1: %+v", u)
	}
	query(t, e.nc, "user", `{"room":"room42","user":"u3"}`, &u)
	if !u.Online || u.Member == nil || len(u.Member.Sessions) != 1 {
		t.Fatalf("user u3 in grace: %+v", u)
	}
	data, code, _ := request(t, e.nc, bus.APISubject("eu", "user"), `{"room":"room42","user":"nobody"}`)
	if code != "" || !strings.Contains(string(data), `"online":false`) || !strings.Contains(string(data), `"member":null`) || !strings.Contains(string(data), `"last_seen":null`) {
		t.Fatalf("unknown user: %s %s", code, data)
	}
	// u1 is online in room42, not in room7; last seen is per region.
	query(t, e.nc, "user", `{"room":"room7","user":"u1"}`, &u)
	if u.Online || u.Member != nil || u.LastSeen == nil {
		t.Fatalf("u1 in room7: %+v", u)
	}
}

// last_seen, rooms and counts read the store as the other endpoints do.
func TestServiceRoomsCountsAndLastSeen(t *testing.T) {
	e := newEnv(t, "eu")
	rdb, _ := testredis.Client(t)
	// Nothing refreshes the sessions: the timing outlasts a slow run.
	st, err := region.New(rdb, region.Options{Region: "eu", Sink: e.pub, Timing: presence.Timing{SessionTTL: time.Minute,
		Heartbeat: 15 * time.Second, OfflineGrace: 30 * time.Second, ReapInterval: time.Second, LastSeenInterval: 15 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	startService(t, e, st)
	c := t.Context()
	if _, err := st.Claim(c, []presence.SessionRef{ref("room42", "u1", "tab1"), ref("room42", "u2", "tab1"), ref("room42", "u3", "tab1")}); err != nil {
		t.Fatal(err)
	}
	var u bus.UserReply
	query(t, e.nc, "user", `{"room":"room42","user":"u1"}`, &u)

	var ls bus.LastSeenReply
	query(t, e.nc, "last_seen", `{"user":"u1"}`, &ls)
	if ls.Region != "eu" || ls.User != "u1" || ls.LastSeen == nil || !ls.LastSeen.Equal(*u.LastSeen) {
		t.Fatalf("last seen: %+v, user reply %v", ls, u.LastSeen)
	}
	data, _, _ := request(t, e.nc, bus.APISubject("eu", "last_seen"), `{"user":"nobody"}`)
	if !strings.Contains(string(data), `"last_seen":null`) {
		t.Fatalf("nobody's last seen: %s", data)
	}

	if _, err := st.Claim(c, []presence.SessionRef{ref("room7", "u9", "tab1"), ref("lobby", "u9", "tab1")}); err != nil {
		t.Fatal(err)
	}
	var rooms bus.RoomsReply
	query(t, e.nc, "rooms", `{"limit":2}`, &rooms)
	if len(rooms.Rooms) != 2 || rooms.Rooms[0] != (presence.RoomCount{Room: "lobby", Count: 1}) || rooms.Rooms[1].Room != "room42" || rooms.NextCursor != "room42" {
		t.Fatalf("rooms: %+v", rooms)
	}
	query(t, e.nc, "rooms", `{"cursor":"room42"}`, &rooms)
	if len(rooms.Rooms) != 1 || rooms.Rooms[0] != (presence.RoomCount{Room: "room7", Count: 1}) || rooms.NextCursor != "" {
		t.Fatalf("rooms after room42: %+v", rooms)
	}
	query(t, e.nc, "rooms", `{"prefix":"zzz"}`, &rooms)
	if rooms.Rooms == nil || len(rooms.Rooms) != 0 {
		t.Fatalf("rooms of no prefix: %+v", rooms)
	}
	var counts bus.CountsReply
	query(t, e.nc, "counts", `{"rooms":["room42","empty","room7"]}`, &counts)
	if len(counts.Rooms) != 3 || counts.Rooms[0].Count != 3 || counts.Rooms[1] != (presence.RoomCount{Room: "empty"}) || counts.Rooms[2].Count != 1 {
		t.Fatalf("counts: %+v", counts)
	}
}

func TestServiceBadRequests(t *testing.T) {
	e := newEnv(t, "eu")
	r := &fakeReader{}
	startService(t, e, r)
	for _, c := range []struct {
		endpoint, body, want string
	}{
		{"members", ``, "empty request"},
		{"members", `not json`, "bad request JSON"},
		{"members", `{"room":"r"} {}`, "data after the object"},
		{"members", `{"room":"r","limt":5}`, `unknown field "limt"`},
		{"members", `{"room":"r","limit":"5"}`, "bad request JSON"},
		{"members", `{"room":"r","limit":1.5}`, "bad request JSON"},
		{"members", `{}`, "invalid room id"},
		{"members", `{"room":"a.b"}`, "invalid room id"},
		{"members", `{"room":"r","offset":-1}`, "offset must be >= 0"},
		{"members", `{"room":"r","limit":1001}`, "limit must be between 1 and 1000"},
		{"members", `{"room":"r","limit":-3}`, "limit must be between 1 and 1000"},
		{"count", `[]`, "bad request JSON"},
		{"count", `{"room":"r*"}`, "invalid room id"},
		{"user", `{"room":"r"}`, "invalid user id"},
		{"user", `{"room":"r>","user":"u u"}`, "invalid room id"},
		{"user", `{"room":"r","user":"` + strings.Repeat("u", 65) + `"}`, "longer than 64 bytes"},
		{"last_seen", `{}`, "invalid user id"},
		{"last_seen", `{"user":"u","room":"r"}`, `unknown field "room"`},
		{"rooms", `{"prefix":"a.b"}`, "prefix and cursor must be empty or room ids"},
		{"rooms", `{"cursor":"a b"}`, "prefix and cursor must be empty or room ids"},
		{"rooms", `{"limit":1001}`, "limit must be between 1 and 1000"},
		{"rooms", `{"limit":-1}`, "limit must be between 1 and 1000"},
		{"counts", `{"rooms":[]}`, "rooms must hold 1 to 100 room ids, got 0"},
		{"counts", `{}`, "rooms must hold 1 to 100 room ids, got 0"},
		{"counts", `{"rooms":[` + strings.Repeat(`"r",`, 100) + `"r"]}`, "got 101"},
		{"counts", `{"rooms":["ok","r*"]}`, "rooms[1]: presence: invalid room id"},
	} {
		t.Run(c.endpoint+" "+c.body, func(t *testing.T) {
			data, code, desc := request(t, e.nc, bus.APISubject("eu", c.endpoint), c.body)
			var er bus.ErrorReply
			if code != "400" || !strings.Contains(desc, c.want) || json.Unmarshal(data, &er) != nil || er.Code != "400" || er.Error != desc {
				t.Errorf("%s %s: code %q desc %q body %s, want 400 mentioning %s", c.endpoint, c.body, code, desc, data, c.want)
			}
		})
	}
	if n := r.calls.Load(); n != 0 {
		t.Fatalf("bad requests reached the backend %d times", n)
	}
}

func TestServiceBackendErrors(t *testing.T) {
	e := newEnv(t, "eu")
	for name, c := range map[string]struct {
		r    *fakeReader
		want string
	}{
		"error": {&fakeReader{err: errors.New("redis: connection refused")}, "backend error"},
		"hang":  {&fakeReader{hang: true}, "timed out after 200ms"},
		"panic": {&fakeReader{panic: true}, "internal error"},
	} {
		t.Run(name, func(t *testing.T) {
			svc := startService(t, e, c.r, bus.WithRequestTimeout(200*time.Millisecond), bus.WithLogger(slog.New(slog.DiscardHandler)))
			for _, q := range []struct{ endpoint, body string }{
				{"members", `{"room":"r"}`}, {"count", `{"room":"r"}`}, {"user", `{"room":"r","user":"u"}`},
				{"last_seen", `{"user":"u"}`}, {"rooms", `{}`}, {"counts", `{"rooms":["r"]}`},
			} {
				start := time.Now()
				data, code, desc := request(t, e.nc, bus.APISubject("eu", q.endpoint), q.body)
				if code != "500" || !strings.Contains(desc, c.want) {
					t.Errorf("%s %s: code %q desc %q body %s", name, q.endpoint, code, desc, data)
				}
				// The backend detail stays in the log, not in the reply.
				if strings.Contains(desc, "redis") || time.Since(start) > 2*time.Second {
					t.Errorf("%s %s: desc %q after %v", name, q.endpoint, desc, time.Since(start))
				}
			}
			_ = svc.Stop()
		})
	}
}

package global_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/global"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/presence"
)

// serveRegion runs r's query service with its disconnect endpoint, as
// the region's nodes do.
func (r *regionEnv) serveRegion(t *testing.T) {
	t.Helper()
	d, err := bus.NewRegionDisconnect(r.nc, r.name, r.store)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := bus.StartService(r.nc, r.name, r.store, bus.WithDisconnect(d), bus.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
}

// ask sends a request that must succeed and decodes its reply.
func ask(t *testing.T, nc *nats.Conn, subject, body string, out any) {
	t.Helper()
	m, err := nc.Request(subject, []byte(body), 10*time.Second)
	if err != nil {
		t.Fatalf("%s %s: %v", subject, body, err)
	}
	if code := m.Header.Get("Nats-Service-Error-Code"); code != "" {
		t.Fatalf("%s %s: %s %s", subject, body, code, m.Header.Get("Nats-Service-Error"))
	}
	if err := json.Unmarshal(m.Data, out); err != nil {
		t.Fatalf("%s reply %s: %v", subject, m.Data, err)
	}
}

// The global view lists its rooms and counts many at once from its own
// state, and asks the regions what only they know: last seen, and
// disconnects, which every region answering carries out.
func TestGlobalRoomsCountsLastSeenAndDisconnect(t *testing.T) {
	w := newWorld(t, "us", "eu", "us")
	eu, us := w.regions["eu"], w.regions["us"]
	eu.serveRegion(t)
	us.serveRegion(t)
	// "ap" is expected but runs no node: asked, it cannot answer.
	w.aggregator("us", func(c *global.AggregatorConfig) { c.Regions = []string{"eu", "us", "ap"} })
	nc := w.sc.Connect(t, "eu")
	waitService(t, nc)

	eu.join(t, ref("lobby", "alice", "tab"))
	us.join(t, ref("lobby", "bob", "tab"), ref("team-1", "bob", "tab"))
	cl := global.NewClient(nc)
	for room, want := range map[string]int{"lobby": 2, "team-1": 1} {
		testkit.CheckFor(t, 15*time.Second, 10*time.Millisecond, func() error {
			n, err := cl.Count(context.Background(), room)
			if err != nil {
				return err
			}
			return testkit.Want("the global "+room+"'s count", n, want)
		})
	}

	var rooms bus.RoomsReply
	ask(t, nc, bus.APISubject(bus.GlobalRegion, bus.EndpointRooms), `{"limit":1}`, &rooms)
	if rooms.Region != "global" || len(rooms.Rooms) != 1 || rooms.Rooms[0] != (presence.RoomCount{Room: "lobby", Count: 2}) || rooms.NextCursor != "lobby" {
		t.Fatalf("rooms: %+v", rooms)
	}
	ask(t, nc, bus.APISubject(bus.GlobalRegion, bus.EndpointRooms), `{"cursor":"lobby"}`, &rooms)
	if len(rooms.Rooms) != 1 || rooms.Rooms[0].Room != "team-1" || rooms.NextCursor != "" {
		t.Fatalf("rooms after lobby: %+v", rooms)
	}
	var counts bus.CountsReply
	ask(t, nc, bus.APISubject(bus.GlobalRegion, bus.EndpointCounts), `{"rooms":["team-1","none","lobby"]}`, &counts)
	if len(counts.Rooms) != 3 || counts.Rooms[0].Count != 1 || counts.Rooms[1].Count != 0 || counts.Rooms[2].Count != 2 {
		t.Fatalf("counts: %+v", counts)
	}

	// Last seen comes from bob's region, whichever region's room is asked.
	var u bus.UserReply
	ask(t, nc, bus.APISubject(bus.GlobalRegion, bus.EndpointUser), `{"room":"lobby","user":"bob"}`, &u)
	if !u.Online || u.LastSeen == nil || time.Since(*u.LastSeen) > time.Minute || strings.Join(u.Regions, ",") != "us" {
		t.Fatalf("bob: %+v", u)
	}
	var ls bus.LastSeenReply
	ask(t, nc, bus.APISubject(bus.GlobalRegion, bus.EndpointLastSeen), `{"user":"nobody"}`, &ls)
	if ls.LastSeen != nil {
		t.Fatalf("nobody: %+v", ls)
	}

	until := time.Now().Add(time.Hour).Truncate(time.Second)
	var rep bus.DisconnectReply
	ask(t, nc, bus.DisconnectSubject(bus.GlobalRegion), `{"user":"bob","revoke_until":"`+until.UTC().Format(time.RFC3339)+`"}`, &rep)
	if rep.Region != "global" || rep.RevokedUntil == nil || !rep.RevokedUntil.Equal(until) || len(rep.Regions) != 3 {
		t.Fatalf("disconnect: %+v", rep)
	}
	for _, r := range rep.Regions {
		if (r.Region == "ap") != (r.Error != nil) || (r.Error != nil && r.Error.Code != bus.CodeUnavailable) {
			t.Fatalf("region results: %+v", rep.Regions)
		}
	}
	for _, r := range []*regionEnv{eu, us} {
		revs, err := r.store.Revocations(context.Background())
		if err != nil || len(revs) != 1 || revs[0].User != "bob" || !revs[0].Until.Equal(until) {
			t.Fatalf("%s revocations: %+v %v", r.name, revs, err)
		}
	}
	// A bad request is refused before any region is asked.
	m, err := nc.Request(bus.DisconnectSubject(bus.GlobalRegion), []byte(`{"user":"b.b"}`), 5*time.Second)
	if err != nil || m.Header.Get("Nats-Service-Error-Code") != bus.CodeBadRequest {
		t.Fatalf("bad disconnect: %v %v", err, m.Header)
	}
}

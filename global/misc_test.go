package global_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/global"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/presence"
)

// Bad publications are dropped and counted; so is garbage written into
// the global stream, which also makes the writer re-read it. Nothing
// crashes and the view goes on.
func TestMalformedInputIsDroppedAndCounted(t *testing.T) {
	w := newWorld(t, "us", "eu", "us")
	agg, _ := w.aggregator("us")
	waitLeader(t, agg)
	t.Cleanup(func() { dump(t, "agg", agg) })
	nc := w.sc.Connect(t, "eu")
	junk := []struct{ subject, body string }{
		{bus.SyncDeltaSubject("eu"), `not json`},
		{bus.SyncDeltaSubject("eu"), `{"v":2,"kind":"delta","region":"eu","gen":1,"inst":"x","seq":1,"rooms":[]}`},
		{bus.SyncDeltaSubject("eu"), `{"v":1,"kind":"delta","region":"us","gen":1,"inst":"x","seq":1,"rooms":[]}`},
		{bus.SyncDeltaSubject("eu"), `{"v":1,"kind":"delta","region":"eu","gen":0,"inst":"x","seq":1,"rooms":[]}`},
		{bus.SyncDeltaSubject("eu"), `{"v":1,"kind":"delta","region":"eu","gen":1,"inst":"x","seq":1,"rooms":[{"room":"a.b"}]}`},
		{bus.SyncFullSubject("eu"), `{"v":1,"kind":"full","region":"eu","gen":1,"inst":"x","seq":1,"part":3,"parts":2,"rooms":[]}`},
		{bus.SyncFullSubject("eu"), `{"v":1,"kind":"full","region":"eu","gen":1,"inst":"x","seq":1,"part":1,"parts":99999999,"rooms":[]}`},
		{bus.SyncFullSubject("eu"), `[]`},
		{"presence-sync.eu.other", `{}`}, // not subscribed: not counted
	}
	for _, j := range junk {
		if err := nc.Publish(j.subject, []byte(j.body)); err != nil {
			t.Fatal(err)
		}
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.Want("malformed publications counted", agg.Stats().Malformed.Load(), 8) })

	// An impostor with a valid delta from an unknown generation only makes
	// the aggregator ask eu for a full.
	_ = nc.Publish(bus.SyncDeltaSubject("eu"), []byte(`{"v":1,"kind":"delta","region":"eu","gen":999,"inst":"x","seq":5,"rooms":[{"room":"room","set":{"ghost":["s"]}}]}`))

	// Garbage in the global stream itself.
	js, _ := jetstream.New(nc)
	if _, err := js.Publish(context.Background(), "presence-sync.global.junk.online.u1", []byte(`{"v":1}`)); err != nil {
		t.Fatal(err)
	}

	var got testkit.Recorder[presence.Transition]
	sub, err := bus.WatchRoom(nc, bus.GlobalRegion, "room", got.Add)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	w.awaitInterest(nc, bus.RoomFilter(bus.GlobalRegion, "room"))
	w.regions["eu"].join(t, ref("room", "u1", "s1"))
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if ts := got.All(); len(ts) != 1 || ts[0].User != "u1" {
			return fmt.Errorf("transitions %v, want u1's online only", ts)
		}
		return nil
	})
	// The garbage moved the stream's last sequence: u1's online, written
	// after it, shows the writer took it into account (by reading it, or
	// by a rejected write and a re-read).
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.AtLeast("the stream's garbage counted", agg.Stats().Malformed.Load(), 9) })
	if slices.Contains(agg.Regions("room", "ghost"), "eu") {
		t.Error("the impostor's delta was applied")
	}
}

// An edge node follows a room's global view as it follows a region's:
// watch presence.global.<room>.>, take the members snapshot, apply what
// comes after it.
func TestEdgeFollowsTheGlobalView(t *testing.T) {
	w := newWorld(t, "us", "eu", "us")
	agg, _ := w.aggregator("us")
	waitLeader(t, agg)
	eu, us := w.regions["eu"], w.regions["us"]
	eu.join(t, ref("room", "a", "s1"), ref("room", "b", "s2"))
	us.join(t, ref("room", "c", "s3"))
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		n, err := agg.Count(context.Background(), "room")
		if err != nil {
			return err
		}
		return testkit.Want("members", n, 3)
	})

	edge := w.sc.Connect(t, "eu")
	waitService(t, edge)
	var (
		mu      sync.Mutex
		members = map[string]bool{}
		base    uint64
		early   []presence.Transition
		synced  bool
	)
	apply := func(tr presence.Transition) {
		if tr.Seq <= base {
			return
		}
		base = tr.Seq
		if tr.Kind == presence.Online {
			members[tr.User] = true
		} else if tr.Kind == presence.Offline {
			delete(members, tr.User)
		}
	}
	sub, err := bus.WatchRoom(edge, bus.GlobalRegion, "room", func(tr presence.Transition) {
		mu.Lock()
		defer mu.Unlock()
		if !synced {
			early = append(early, tr)
			return
		}
		apply(tr)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	w.awaitInterest(edge, bus.RoomFilter(bus.GlobalRegion, "room"))
	snap, err := global.NewClient(edge).Snapshot(context.Background(), "room", 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	for _, m := range snap.Members {
		members[m.User] = true
	}
	base, synced = snap.RoomSeq, true
	for _, tr := range early {
		apply(tr)
	}
	mu.Unlock()
	if snap.Total != 3 || snap.RoomSeq != 3 || snap.Epoch == 0 || snap.StreamSeq == 0 {
		t.Fatalf("snapshot %+v", snap)
	}

	us.join(t, ref("room", "d", "s4"))
	eu.leave(t, ref("room", "a", "s1"))
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(members) != 3 || !members["d"] || members["a"] {
			return fmt.Errorf("the edge's members %v, want three, d and not a", members)
		}
		return nil
	})
	if n, _ := agg.Count(context.Background(), "room"); n != 3 {
		t.Fatalf("count %d", n)
	}
}

func TestQueryErrors(t *testing.T) {
	w := newWorld(t, "us", "eu", "us")
	w.aggregator("us")
	nc := w.sc.Connect(t, "eu")
	waitService(t, nc)
	for _, c := range []struct{ endpoint, body, want string }{
		{bus.EndpointMembers, ``, "empty request"},
		{bus.EndpointMembers, `{"room":"r","bogus":1}`, "unknown field"},
		{bus.EndpointMembers, `{"room":"a.b"}`, "invalid room id"},
		{bus.EndpointMembers, `{"room":"r","limit":5000}`, "limit must be between 1 and 1000"},
		{bus.EndpointMembers, `{"room":"r","offset":-1}`, "offset must be >= 0"},
		{bus.EndpointCount, `{"room":"r"} {}`, "data after the object"},
		{bus.EndpointUser, `{"room":"r","user":"u*"}`, "invalid user id"},
	} {
		t.Run(c.endpoint+" "+c.body, func(t *testing.T) {
			m, err := nc.Request(bus.APISubject(bus.GlobalRegion, c.endpoint), []byte(c.body), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if code, desc := m.Header.Get("Nats-Service-Error-Code"), m.Header.Get("Nats-Service-Error"); code != bus.CodeBadRequest || !strings.Contains(desc, c.want) {
				t.Errorf("%s %s: code %q description %q, want 400 mentioning %q", c.endpoint, c.body, code, desc, c.want)
			}
		})
	}
	_, err := global.NewClient(nc).Snapshot(context.Background(), "a.b", 0, 10)
	var qe *global.QueryError
	if !errors.As(err, &qe) || qe.Code != bus.CodeBadRequest {
		t.Fatalf("client error %v", err)
	}
	n, err := global.NewClient(nc).Count(context.Background(), "empty")
	if err != nil || n != 0 {
		t.Fatalf("count of an empty room: %d %v", n, err)
	}
	// The service is discoverable as the regional ones are.
	m, err := nc.Request("$SRV.INFO.presence", nil, 5*time.Second)
	if err != nil || !strings.Contains(string(m.Data), `"region":"global"`) {
		t.Fatalf("$SRV.INFO: %v %s", err, m.Data)
	}
}

// When a region's active publisher stops, another node's takes over with
// a higher generation; the global view does not notice.
func TestPublisherFailoverIsNoGlobalTransition(t *testing.T) {
	w := newWorld(t, "us", "eu", "us")
	agg, _ := w.aggregator("us")
	rec := w.record("us")
	eu := w.regions["eu"]
	spare := eu.addPublisher(t, nil)
	eu.join(t, ref("room", "u1", "s1"), ref("room", "u2", "s2"))
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.Want("members online in the global view", len(rec.members("room")), 2) })
	active := eu.pubs[0]
	if !active.Active() || spare.Active() {
		t.Fatalf("active %v spare %v", active.Active(), spare.Active())
	}
	genOf := func() uint64 {
		for _, s := range agg.RegionStatuses() {
			if s.Region == "eu" {
				return s.Gen
			}
		}
		return 0
	}
	before := genOf()
	active.Close()
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if !spare.Active() {
			return errors.New("the spare is not active")
		}
		return testkit.AtLeast("the aggregator's generation", genOf(), before+1)
	})
	holds(t, grace+2*cadence, rec.exactly(2))
	if n := len(rec.events()); n != 2 || regionState(agg, "eu") != global.RegionLive {
		t.Fatalf("%d transitions, eu %s", n, regionState(agg, "eu"))
	}
}

func TestConfigValidation(t *testing.T) {
	nc := &nats.Conn{}
	var js jetstream.JetStream = fakeJS{}
	src := fakeSource{}
	pubBase := global.PublisherConfig{Region: "eu", Source: src, NATS: nc, JetStream: js}
	for _, c := range []struct {
		edit  func(*global.PublisherConfig)
		field string
	}{
		{func(c *global.PublisherConfig) { c.Region = "global" }, "region"},
		{func(c *global.PublisherConfig) { c.Region = "e.u" }, "region"},
		{func(c *global.PublisherConfig) { c.Source = nil }, "source"},
		{func(c *global.PublisherConfig) { c.NATS = nil }, "nats"},
		{func(c *global.PublisherConfig) { c.JetStream = nil }, "jetstream"},
		{func(c *global.PublisherConfig) { c.Cadence = time.Millisecond }, "cadence"},
		{func(c *global.PublisherConfig) { c.FullEvery = -1 }, "full every"},
		{func(c *global.PublisherConfig) { c.ReadTimeout = time.Minute }, "read timeout"},
		{func(c *global.PublisherConfig) { c.PageSize = 20000 }, "page size"},
		{func(c *global.PublisherConfig) { c.LeaseTTL = 500 * time.Millisecond }, "lease TTL"},
		{func(c *global.PublisherConfig) { c.LeaseBucket = "a:b" }, "lease bucket"},
		{func(c *global.PublisherConfig) { c.Storage = 7 }, "storage"},
	} {
		t.Run("publisher "+c.field, func(t *testing.T) {
			cfg := pubBase
			c.edit(&cfg)
			_, err := global.NewRegionPublisher(cfg)
			checkConfigErr(t, err, c.field)
		})
	}
	if _, err := global.NewRegionPublisher(pubBase); err != nil {
		t.Fatalf("valid publisher config: %v", err)
	}
	d := pubBase.WithDefaults()
	if d.Cadence != 3*time.Second || d.FullEvery != 40 || d.LeaseTTL != 9*time.Second || d.LeaseBucket != "PRESENCE_sync_eu" || d.Instance == "" {
		t.Fatalf("publisher defaults %+v", d)
	}

	aggBase := global.AggregatorConfig{NATS: nc, JetStream: js}
	for _, c := range []struct {
		edit  func(*global.AggregatorConfig)
		field string
	}{
		{func(c *global.AggregatorConfig) { c.NATS = nil }, "nats"},
		{func(c *global.AggregatorConfig) { c.JetStream = nil }, "jetstream"},
		{func(c *global.AggregatorConfig) { c.Cadence = time.Millisecond }, "cadence"},
		{func(c *global.AggregatorConfig) { c.Grace = 5 * time.Second }, "grace"},
		{func(c *global.AggregatorConfig) { c.DownAfter = 5 * time.Second }, "down after"},
		{func(c *global.AggregatorConfig) { c.DropAfter = 15 * time.Second }, "drop after"},
		{func(c *global.AggregatorConfig) { c.OfflineRetention = time.Millisecond }, "offline retention"},
		{func(c *global.AggregatorConfig) { c.LeaseTTL = time.Millisecond }, "lease TTL"},
		{func(c *global.AggregatorConfig) { c.Replicas = 7 }, "replicas"},
		{func(c *global.AggregatorConfig) { c.MaxFullBytes = 1000 }, "max full bytes"},
		{func(c *global.AggregatorConfig) { c.Regions = []string{"eu", "eu"} }, "regions"},
		{func(c *global.AggregatorConfig) { c.Regions = []string{"global"} }, "regions"},
		{func(c *global.AggregatorConfig) { c.LeaseBucket = "a.b" }, "lease bucket"},
	} {
		t.Run("aggregator "+c.field, func(t *testing.T) {
			cfg := aggBase
			c.edit(&cfg)
			_, err := global.NewAggregator(cfg)
			checkConfigErr(t, err, c.field)
		})
	}
	if _, err := global.NewAggregator(aggBase); err != nil {
		t.Fatalf("valid aggregator config: %v", err)
	}
	ad := aggBase.WithDefaults()
	if ad.Grace != 9*time.Second || ad.DownAfter != 15*time.Second || ad.DropAfter != time.Minute || ad.OfflineRetention != 24*time.Hour || ad.LeaseTTL != 9*time.Second || ad.Replicas != 1 || ad.MaxFullBytes != 32<<20 {
		t.Fatalf("aggregator defaults %+v", ad)
	}
}

func checkConfigErr(t *testing.T, err error, field string) {
	t.Helper()
	var ce *presence.ConfigError
	if !errors.As(err, &ce) || ce.Field != field || !strings.HasPrefix(err.Error(), "presence: config: "+field+": ") {
		t.Errorf("got %v, want a config error on %s", err, field)
	}
}

type fakeJS struct{ jetstream.JetStream }

type fakeSource struct{}

func (fakeSource) Rooms(context.Context) ([]string, error) { return nil, nil }
func (fakeSource) Snapshot(context.Context, string, int, int) (presence.Snapshot, error) {
	return presence.Snapshot{}, nil
}

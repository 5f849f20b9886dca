package global_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"math/big"
	mrand "math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/global"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/region"
)

// BenchmarkGlobalLag measures how long a regional transition takes to
// become a global one, as an edge node in another cluster receives it:
// joins from the regional online to the global online, departures from
// the regional offline to the global offline minus the global grace
// (which is the point of a departure's delay). b.N is the number of
// users; run it with -benchtime 200x.
//
//	go test ./global -run '^$' -bench GlobalLag -benchtime 200x
func BenchmarkGlobalLag(b *testing.B) {
	w := newWorld(b, "us", "eu", "us")
	agg, _ := w.aggregator("us")
	waitLeader(b, agg)
	eu := w.regions["eu"]

	var mu sync.Mutex
	regional := map[string]time.Time{} // kind/user -> regional transition
	var joins, leaves []time.Duration
	f := func(t presence.Transition) {
		mu.Lock()
		regional[string(t.Kind)+"/"+t.User] = time.Now()
		mu.Unlock()
	}
	eu.sink.Store(&f)
	edge := w.sc.Connect(b, "eu")
	var got atomic.Int64
	sub, err := bus.WatchRoom(edge, bus.GlobalRegion, "lag", func(t presence.Transition) {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		at, ok := regional[string(t.Kind)+"/"+t.User]
		if !ok {
			b.Errorf("global %s of %s before its regional one", t.Kind, t.User)
			return
		}
		switch t.Kind {
		case presence.Online:
			joins = append(joins, now.Sub(at))
		case presence.Offline:
			leaves = append(leaves, now.Sub(at)-grace)
		}
		got.Add(1)
	})
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe()
	w.awaitInterest(edge, bus.RoomFilter(bus.GlobalRegion, "lag"))

	rng := mrand.New(mrand.NewPCG(3, 4))
	b.ResetTimer()
	for i := range b.N {
		x := ref("lag", fmt.Sprintf("u%05d", i), "s1")
		eu.join(b, x)
		stay := time.Second + time.Duration(rng.IntN(int(cadence)))
		go func() {
			time.Sleep(stay)
			eu.leave(b, x)
		}()
		// Spread the joins over the cadence's phase.
		time.Sleep(time.Duration(rng.IntN(int(cadence / 2))))
	}
	testkit.CheckFor(b, time.Minute, 10*time.Millisecond, func() error { return testkit.Want("global transitions", got.Load(), int64(2*b.N)) })
	b.StopTimer()
	mu.Lock()
	defer mu.Unlock()
	report := func(name string, ds []time.Duration) {
		slices.Sort(ds)
		p50, p99, mx := ds[len(ds)/2], ds[len(ds)*99/100], ds[len(ds)-1]
		b.ReportMetric(float64(p50.Milliseconds()), name+"-p50-ms")
		b.ReportMetric(float64(p99.Milliseconds()), name+"-p99-ms")
		b.ReportMetric(float64(p99)/float64(cadence), name+"-p99/cadence")
		b.Logf("%s lag over %d: p50 %v p99 %v max %v (cadence %v; target p99 <= %v)", name, len(ds), p50, p99, mx, cadence, 2*cadence)
	}
	report("join", joins)
	report("leave", leaves)
}

// BenchmarkCrossRegionBytes measures the bytes region eu's 10,000
// sessions cost on the gateway connections of a two-cluster supercluster
// (eu, and us with the aggregator), from the servers' own connection
// statistics (Gatewayz), against forwarding every heartbeat. The timing is
// production's default scaled down tenfold: cadence 300ms (3s), heartbeat
// 1.5s (15s), a digest every 40 cadences (the default; there are no
// periodic fulls); 1% of the sessions are replaced every heartbeat. Three windows of the same length
// are measured: the publication (publisher on), the baseline (publisher
// off, one refresh message per session per heartbeat forwarded to a
// subscriber in us), and idle (neither): the supercluster's own chatter.
//
//	go test ./global -run '^$' -bench CrossRegionBytes -benchtime 1x
func BenchmarkCrossRegionBytes(b *testing.B) {
	const (
		sessions  = 10000
		rooms     = 100
		heartbeat = 1500 * time.Millisecond
		window    = 24 * time.Second // 80 cadences, 16 heartbeats, 2 digests
	)
	timing := presence.Timing{SessionTTL: 5 * time.Second, Heartbeat: heartbeat, OfflineGrace: 2 * time.Second, ReapInterval: 100 * time.Millisecond, LastSeenInterval: 2 * heartbeat}
	w := newWorldWith(b, timing, nil, "us", "eu", "us")
	// No region is dropped while its publisher is off for the baseline.
	agg, _ := w.aggregator("us", func(c *global.AggregatorConfig) { c.DropAfter = 10 * time.Minute })
	waitLeader(b, agg)
	eu := w.regions["eu"]

	// 5,000 users with two sessions each, 100 rooms; 8-byte user ids and
	// 16-byte random session ids.
	sess := func() string { return randID(16) }
	var refs []presence.SessionRef
	for i := range sessions / 2 {
		room, user := fmt.Sprintf("room-%03d", i%rooms), fmt.Sprintf("u%07d", i)
		refs = append(refs, ref(room, user, sess()), ref(room, user, sess()))
	}
	for i := 0; i < len(refs); i += 1000 {
		eu.join(b, refs[i:min(i+1000, len(refs))]...)
	}
	testkit.CheckFor(b, time.Minute, 10*time.Millisecond, func() error {
		n := 0
		for r := range rooms {
			for _, ss := range agg.Union(fmt.Sprintf("room-%03d", r)) {
				n += len(ss)
			}
		}
		return testkit.Want("sessions in the global view", n, sessions)
	})

	// Churn: 1% of the sessions replaced every heartbeat.
	churn := func(ctx context.Context) {
		rng := mrand.New(mrand.NewPCG(5, 6))
		t := time.NewTicker(heartbeat)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			for range sessions / 100 {
				i := rng.IntN(len(refs))
				eu.leave(b, refs[i])
				refs[i].Session = sess()
				eu.join(b, refs[i])
			}
		}
	}
	// measure returns payload bytes per second from the servers'
	// gateway statistics, and wire bytes per second from the proxies.
	measure := func(name string, during func(ctx context.Context)) (float64, float64) {
		before, err := w.sc.GatewayBytes()
		if err != nil {
			b.Fatal(err)
		}
		wireBefore := w.sc.WireBytes()
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); during(ctx) }()
		time.Sleep(window)
		after, err := w.sc.GatewayBytes()
		if err != nil {
			b.Fatal(err)
		}
		wire := float64(w.sc.WireBytes()-wireBefore) / window.Seconds()
		cancel()
		wg.Wait()
		rate := float64(after-before) / window.Seconds()
		b.Logf("%-11s %8.0f B/s of payload (Gatewayz), %8.0f B/s on the wire (proxies), over %v", name, rate, wire, window)
		return rate, wire
	}

	b.ResetTimer()
	pub := eu.pubs[0]
	sent, fulls := pub.Stats().Bytes.Load(), pub.Stats().Fulls.Load()
	ours, oursWire := measure("publication", churn)
	sent, fulls = pub.Stats().Bytes.Load()-sent, pub.Stats().Fulls.Load()-fulls
	pub.Close()

	// The baseline: every session's refresh, once per heartbeat, to a
	// subscriber in the aggregator's cluster.
	us := w.sc.Connect(b, "us")
	var recv atomic.Int64
	s, err := us.Subscribe(bus.SyncRoot+".eu.refresh", func(*nats.Msg) { recv.Add(1) })
	if err != nil {
		b.Fatal(err)
	}
	defer s.Unsubscribe()
	_ = us.Flush()
	subject := bus.SyncRoot + ".eu.refresh"
	testkit.CheckFor(b, 10*time.Second, 20*time.Millisecond, func() error {
		_ = eu.nc.Publish(subject, []byte(probeBody))
		_ = eu.nc.Flush()
		time.Sleep(20 * time.Millisecond)
		return testkit.AtLeast("probes the subscriber got from eu", recv.Load(), 1)
	})
	recv.Store(0)
	type refresh struct {
		Room    string `json:"room"`
		User    string `json:"user"`
		Session string `json:"session"`
	}
	bodies := make([][]byte, len(refs))
	for i, x := range refs {
		bodies[i], _ = json.Marshal(refresh{x.Room, x.User, x.Session})
	}
	msgBytes := 0
	for _, body := range bodies {
		// RMSG <account> <subject> <size>\r\n<payload>\r\n on a gateway.
		msgBytes += len(fmt.Sprintf("RMSG $G %s %d\r\n", subject, len(body))) + len(body) + 2
	}
	bursts := int(window / heartbeat)
	forward := func(ctx context.Context) {
		t := time.NewTicker(heartbeat)
		defer t.Stop()
		for range bursts { // at 0, heartbeat, ...: all inside the window
			for _, body := range bodies {
				_ = eu.nc.Publish(subject, body)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}
	base, baseWire := measure("heartbeats", forward)
	idle, idleWire := measure("idle", func(ctx context.Context) { <-ctx.Done() })
	b.StopTimer()

	computed := float64(msgBytes) / heartbeat.Seconds()
	b.Logf("publisher sent %d B of publications (%d fulls) in the window: %.0f B/s", sent, fulls, float64(sent)/window.Seconds())
	b.Logf("forwarding every heartbeat: measured %.0f B/s, computed %.0f B/s (%d messages of %.1f B per heartbeat, %d heartbeats); %d received", base, computed, len(bodies), float64(msgBytes)/float64(len(bodies)), bursts, recv.Load())
	b.Logf("ratio publication/heartbeats, payload: %.4f (1/%.1f); without the idle chatter: %.4f (1/%.1f); target <= 1/10", ours/base, base/ours, (ours-idle)/(base-idle), (base-idle)/(ours-idle))
	b.Logf("ratio publication/heartbeats, wire: %.4f (1/%.1f); without the idle chatter: %.4f (1/%.1f)", oursWire/baseWire, baseWire/oursWire, (oursWire-idleWire)/(baseWire-idleWire), (baseWire-idleWire)/(oursWire-idleWire))
	b.ReportMetric(ours, "publication-B/s")
	b.ReportMetric(base, "heartbeats-B/s")
	b.ReportMetric(idle, "idle-B/s")
	b.ReportMetric(ours/base, "ratio")
	b.ReportMetric(oursWire/baseWire, "wire-ratio")
}

const idAlphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

func randID(n int) string {
	out := make([]byte, n)
	for i := range out {
		k, _ := rand.Int(rand.Reader, big.NewInt(int64(len(idAlphabet))))
		out[i] = idAlphabet[k.Int64()]
	}
	return string(out)
}

// BenchmarkReadRegion measures what a region's active publisher reads
// each cadence: the whole region, 100k sessions (50k users, two sessions
// each) in 1000 rooms, from a real redis-server. roster is the bulk path
// (*region.Store is a RosterSource); paged hides it and reads with
// Snapshot pages, one round trip per room. redis-ms/read is the Redis
// server's CPU time (INFO cpu) per read.
//
//	go test ./global -run '^$' -bench ReadRegion -benchtime 20x
func BenchmarkReadRegion(b *testing.B) {
	rdb, _ := testredis.Client(b)
	st, err := region.New(rdb, region.Options{Region: "eu", Timing: presence.Timing{SessionTTL: 10 * time.Minute, Heartbeat: time.Minute, OfflineGrace: time.Minute, ReapInterval: time.Second, LastSeenInterval: time.Hour}, Sink: region.SinkFunc(func(context.Context, []presence.Transition) (uint64, error) { return 0, nil })})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var refs []presence.SessionRef
	for u := range 50000 {
		room, user := fmt.Sprintf("room-%04d", u%1000), fmt.Sprintf("u%07d", u)
		refs = append(refs, ref(room, user, "a"), ref(room, user, "b"))
	}
	for i := 0; i < len(refs); i += 5000 {
		if _, err := st.Claim(ctx, refs[i:i+5000]); err != nil {
			b.Fatal(err)
		}
	}
	// A seventh of the sessions, spread over every room, carry a state.
	for i := 0; i < len(refs); i += 7 {
		if _, err := st.SetState(ctx, refs[i], []byte(`{"status":"away"}`)); err != nil {
			b.Fatal(err)
		}
	}
	redisCPU := func() float64 {
		info, err := rdb.InfoMap(ctx, "cpu").Result()
		if err != nil {
			b.Fatal(err)
		}
		var sum float64
		for _, k := range []string{"used_cpu_sys", "used_cpu_user"} {
			v, _ := strconv.ParseFloat(info["CPU"][k], 64)
			sum += v
		}
		return sum
	}
	run := func(b *testing.B, src global.RegionSource) {
		cpu0 := redisCPU()
		b.ResetTimer()
		for range b.N {
			t, err := global.ReadRegion(ctx, src, 1000)
			if err != nil {
				b.Fatal(err)
			}
			if len(t.Members) != 1000 || len(t.States) != 1000 {
				b.Fatalf("%d rooms, %d with states", len(t.Members), len(t.States))
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/read")
		b.ReportMetric((redisCPU()-cpu0)*1000/float64(b.N), "redis-ms/read")
	}
	b.Run("roster", func(b *testing.B) { run(b, st) })
	b.Run("paged", func(b *testing.B) { run(b, pagedOnly{st}) })
}

// pagedOnly hides a store's Rosters.
type pagedOnly struct{ global.RegionSource }

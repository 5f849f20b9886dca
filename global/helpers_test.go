package global_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/global"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testnats"
	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/region"
)

var (
	_ global.RegionSource = (*region.Store)(nil)
	_ global.RosterSource = (*region.Store)(nil)
	_ global.ChangeSource = (*region.Store)(nil)
	_ bus.Reader          = (*global.Aggregator)(nil)
)

// Test timing: a cadence of 300ms; the regional timing is short so the
// regional grace and expiry happen within a test.
const (
	cadence   = 300 * time.Millisecond
	grace     = 1200 * time.Millisecond
	downAfter = 1500 * time.Millisecond
	dropAfter = 4 * time.Second
)

// quiet drops the components' logs; tests assert on state instead.
var quiet = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

var regionTiming = presence.Timing{
	SessionTTL:       3 * time.Second,
	Heartbeat:        time.Second,
	OfflineGrace:     time.Second,
	ReapInterval:     100 * time.Millisecond,
	LastSeenInterval: time.Second,
}

// world is a supercluster with one region per cluster, each with its own
// redis-server, store, reaper, heartbeat and publisher.
type world struct {
	t       testing.TB
	sc      *testnats.SuperCluster
	regions map[string]*regionEnv
	home    string // cluster of the global stream and the aggregator lease
	timing  presence.Timing
	pubCfg  func(*global.PublisherConfig)
}

// regionEnv is one region. Sessions in live are refreshed twice per
// heartbeat, as a live node would.
type regionEnv struct {
	name  string
	nc    *nats.Conn
	js    jetstream.JetStream
	store *region.Store
	rdb   *redis.Client
	pubs  []*global.RegionPublisher
	sink  atomic.Pointer[func(presence.Transition)] // sees the regional transitions

	mu   sync.Mutex
	live map[presence.SessionRef]bool
}

func newWorld(t testing.TB, home string, names ...string) *world {
	t.Helper()
	return newWorldWith(t, regionTiming, nil, home, names...)
}

// newWorldWith is newWorld with the regions' timing and a publisher
// configuration hook.
func newWorldWith(t testing.TB, timing presence.Timing, pubCfg func(*global.PublisherConfig), home string, names ...string) *world {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a NATS supercluster and a redis-server per region, and runs for seconds: skipped with -short")
	}
	w := &world{t: t, sc: testnats.StartSuperCluster(t, names...), regions: map[string]*regionEnv{}, home: home, timing: timing, pubCfg: pubCfg}
	for _, n := range names {
		w.regions[n] = w.newRegion(n)
	}
	return w
}

func (w *world) newRegion(name string) *regionEnv {
	t := w.t
	rdb, _ := testredis.Client(t)
	r := &regionEnv{name: name, rdb: rdb, live: map[presence.SessionRef]bool{}}
	st, err := region.New(rdb, region.Options{
		Region: name, Timing: w.timing,
		Sink: region.SinkFunc(func(_ context.Context, ts []presence.Transition) (uint64, error) {
			if f := r.sink.Load(); f != nil {
				for _, t := range ts {
					(*f)(t)
				}
			}
			return 0, nil
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	nc := w.sc.Connect(t, name)
	js, _ := jetstream.New(nc)
	r.nc, r.js, r.store = nc, js, st
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); st.RunReaper(ctx) }()
	go func() {
		defer wg.Done()
		tk := time.NewTicker(w.timing.Heartbeat / 2)
		defer tk.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
				r.mu.Lock()
				refs := make([]presence.SessionRef, 0, len(r.live))
				for ref := range r.live {
					refs = append(refs, ref)
				}
				r.mu.Unlock()
				if len(refs) > 0 {
					_, _ = st.Refresh(ctx, refs)
				}
			}
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	r.addPublisher(t, w.pubCfg)
	return r
}

// addPublisher starts one more publisher for the region (as another
// node would); one of them is active.
func (r *regionEnv) addPublisher(t testing.TB, edit func(*global.PublisherConfig)) *global.RegionPublisher {
	t.Helper()
	cfg := global.PublisherConfig{
		Region: r.name, Source: r.store, NATS: r.nc, JetStream: r.js, Cadence: cadence,
		Placement: &jetstream.Placement{Cluster: r.name}, Storage: jetstream.MemoryStorage, Logger: quiet,
	}
	if edit != nil {
		edit(&cfg)
	}
	p, err := global.NewRegionPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	r.pubs = append(r.pubs, p)
	return p
}

func ref(room, user, session string) presence.SessionRef {
	return presence.SessionRef{Room: room, User: user, Session: session}
}

// join opens a session and keeps it alive.
func (r *regionEnv) join(t testing.TB, refs ...presence.SessionRef) {
	t.Helper()
	if _, err := r.store.Claim(context.Background(), refs); err != nil {
		t.Errorf("touch: %v", err) // not Fatal: called from goroutines too
		return
	}
	r.mu.Lock()
	for _, x := range refs {
		r.live[x] = true
	}
	r.mu.Unlock()
}

// leave closes a session cleanly: the user stays a regional member for
// the regional grace.
func (r *regionEnv) leave(t testing.TB, x presence.SessionRef) {
	t.Helper()
	r.mu.Lock()
	delete(r.live, x)
	r.mu.Unlock()
	if err := r.store.Release(context.Background(), x); err != nil {
		t.Errorf("release: %v", err)
	}
}

// crash stops refreshing a session, as a dead node would: it expires
// after the session TTL.
func (r *regionEnv) crash(x presence.SessionRef) {
	r.mu.Lock()
	delete(r.live, x)
	r.mu.Unlock()
}

// truth is a room's regional members with their session ids.
func (r *regionEnv) truth(t testing.TB, room string) map[string][]string {
	t.Helper()
	v, err := global.ReadRegion(context.Background(), r.store, 1000)
	if err != nil {
		t.Fatal(err)
	}
	return v.Members[room]
}

// union is a room's members over every region, sessions deduplicated.
func (w *world) union(room string) map[string][]string {
	out := map[string][]string{}
	for _, r := range w.regions {
		for u, ss := range r.truth(w.t, room) {
			out[u] = append(out[u], ss...)
		}
	}
	for u, ss := range out {
		sort.Strings(ss)
		out[u] = dedupe(ss)
	}
	return out
}

func dedupe(ss []string) []string {
	out := []string{}
	for i, s := range ss {
		if i == 0 || s != ss[i-1] {
			out = append(out, s)
		}
	}
	return out
}

type aggOpt func(*global.AggregatorConfig)

// aggregator starts an aggregator connected to cluster, with its stream
// and lease in the world's home cluster.
func (w *world) aggregator(cluster string, opts ...aggOpt) (*global.Aggregator, *nats.Conn) {
	w.t.Helper()
	nc := w.sc.Connect(w.t, cluster)
	js, _ := jetstream.New(nc)
	cfg := global.AggregatorConfig{
		NATS: nc, JetStream: js, Cadence: cadence, Grace: grace, DownAfter: downAfter, DropAfter: dropAfter,
		Placement: &jetstream.Placement{Cluster: w.home}, Storage: jetstream.MemoryStorage, Logger: quiet,
	}
	for _, o := range opts {
		o(&cfg)
	}
	a, err := global.NewAggregator(cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(a.Close)
	return a, nc
}

// recorder keeps every global transition a subscriber in some cluster
// receives, in arrival order.
type recorder struct{ testkit.Log }

func (w *world) record(cluster string) *recorder {
	w.t.Helper()
	nc := w.sc.Connect(w.t, cluster)
	rec := &recorder{}
	sub, err := nc.Subscribe(bus.RegionFilter(bus.GlobalRegion), func(m *nats.Msg) {
		if string(m.Data) == probeBody {
			return
		}
		t, err := bus.DecodeEvent(m.Data)
		if err != nil {
			w.t.Errorf("undecodable global event on %s: %v", m.Subject, err)
			return
		}
		rec.Add(t)
	})
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { _ = sub.Unsubscribe() })
	w.awaitInterest(nc, bus.RegionFilter(bus.GlobalRegion))
	return rec
}

func (r *recorder) events() []presence.Transition { return r.All() }

// exactly checks that r holds n transitions, no more: with holds, that
// none follows.
func (r *recorder) exactly(n int) func() error {
	return func() error {
		if ev := r.events(); len(ev) != n {
			return fmt.Errorf("%d global transitions, want %d: %v", len(ev), n, ev)
		}
		return nil
	}
}

// of returns the user's transitions in room as "kind reason" strings.
func (r *recorder) of(room, user string) []string {
	var out []string
	for _, t := range r.events() {
		if t.Room == room && t.User == user {
			out = append(out, string(t.Kind)+" "+string(t.Reason))
		}
	}
	return out
}

// members replays the recorded transitions into a room's membership.
func (r *recorder) members(room string) map[string]bool {
	m := map[string]bool{}
	for _, t := range r.events() {
		if t.Room != room {
			continue
		}
		switch t.Kind {
		case presence.Online:
			m[t.User] = true
		case presence.Offline:
			delete(m, t.User)
		}
	}
	return m
}

// checkOrder fails unless every room's transitions arrived once each, in
// Seq order without gaps within an epoch, each user's alternate between
// online and offline starting with online, and updates come only between
// an online and its offline.
func (r *recorder) checkOrder(t *testing.T) {
	t.Helper()
	type pos struct {
		epoch int64
		seq   uint64
	}
	last := map[string]pos{}
	state := map[string]presence.Kind{}
	ids := map[string]bool{}
	for _, tr := range r.events() {
		if ids[tr.ID] {
			t.Errorf("transition %s received twice", tr.ID)
		}
		ids[tr.ID] = true
		p := last[tr.Room]
		switch {
		case tr.Epoch == p.epoch && tr.Seq != p.seq+1:
			t.Errorf("room %s: seq %d after %d in epoch %d", tr.Room, tr.Seq, p.seq, tr.Epoch)
		case tr.Epoch < p.epoch:
			t.Errorf("room %s: epoch %d after %d", tr.Room, tr.Epoch, p.epoch)
		case tr.Epoch > p.epoch && tr.Seq != 1:
			t.Errorf("room %s: new epoch %d starts at seq %d", tr.Room, tr.Epoch, tr.Seq)
		}
		last[tr.Room] = pos{tr.Epoch, tr.Seq}
		key := tr.Room + "/" + tr.User
		if tr.Kind == presence.Update {
			if state[key] != presence.Online {
				t.Errorf("%s: update of a user who is not a member", key)
			}
			continue
		}
		if prev := state[key]; prev == tr.Kind || (prev == "" && tr.Kind != presence.Online) {
			t.Errorf("%s: %s after %q", key, tr.Kind, prev)
		}
		state[key] = tr.Kind
	}
}

// holds checks that check passes for the whole of d, polling it, and
// fails at the first poll where it does not. Tests use it to watch that
// nothing more happens: d is long enough for anything still due (a grace,
// two cadences) to have come out.
func holds(t testing.TB, d time.Duration, check func() error) {
	t.Helper()
	testkit.Holds(t, d, 20*time.Millisecond, check)
}

// notIn is a poll's condition: user is not in view (named what).
func notIn(view map[string][]string, user, what string) error {
	if s, ok := view[user]; ok {
		return fmt.Errorf("%s still lists %s (sessions %v)", what, user, s)
	}
	return nil
}

// waitLeader waits until exactly one of aggs leads and returns it.
func waitLeader(t testing.TB, aggs ...*global.Aggregator) *global.Aggregator {
	t.Helper()
	var leader *global.Aggregator
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		n := 0
		for _, a := range aggs {
			if a.Leader() {
				n, leader = n+1, a
			}
		}
		return testkit.Want("leaders", n, 1)
	})
	return leader
}

func regionState(a *global.Aggregator, name string) global.RegionState {
	return regionStatus(a, name).State
}

func regionStatus(a *global.Aggregator, name string) global.RegionStatus {
	for _, s := range a.RegionStatuses() {
		if s.Region == name {
			return s
		}
	}
	return global.RegionStatus{}
}

func fmtMembers(m map[string][]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	s := ""
	for _, k := range keys {
		s += fmt.Sprintf("%s%v ", k, m[k])
	}
	return s
}

// dump logs what an aggregator knows, for failing tests.
func dump(t testing.TB, name string, a *global.Aggregator) {
	s := a.Stats()
	t.Logf("%s: leader %v publications %d malformed %d gaps %d resyncs %d transitions %d conflicts %d reloads %d regions %+v",
		name, a.Leader(), s.Publications.Load(), s.Malformed.Load(), s.Gaps.Load(), s.ResyncRequests.Load(),
		s.Transitions.Load(), s.Conflicts.Load(), s.Reloads.Load(), a.RegionStatuses())
}

// probeBody marks probe messages; subscribers skip them (WatchRoom drops
// them as malformed).
const probeBody = "probe"

// awaitInterest waits until messages published on filter in the world's
// home cluster (where the global stream republishes) reach nc: a
// subscription's interest reaches other clusters a moment after it is
// made. It probes with a second subscription to the same filter on nc.
func (w *world) awaitInterest(nc *nats.Conn, filter string) {
	w.t.Helper()
	sub, err := nc.SubscribeSync(filter)
	if err != nil {
		w.t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		w.t.Fatal(err)
	}
	subject := strings.Replace(strings.Replace(filter, ">", "online.probe", 1), "*", "probe", -1)
	home := w.sc.Connect(w.t, w.home)
	defer home.Close()
	testkit.CheckFor(w.t, 10*time.Second, 0, func() error {
		if err := home.Publish(subject, []byte(probeBody)); err != nil {
			w.t.Fatal(err)
		}
		if _, err := sub.NextMsg(50 * time.Millisecond); err != nil {
			return fmt.Errorf("no interest in %s from %s: %w", filter, w.home, err)
		}
		return nil
	})
}

// waitService waits until the global query service answers on nc: the
// aggregator's queue subscriptions reach other clusters a moment after
// it starts.
func waitService(t testing.TB, nc *nats.Conn) {
	t.Helper()
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		_, err := global.NewClient(nc).Count(context.Background(), "probe")
		return err
	})
}

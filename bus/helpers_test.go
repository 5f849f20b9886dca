package bus_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testnats"
	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/region"
)

var (
	_ region.Sink = (*bus.Publisher)(nil)
	_ bus.Reader  = (*region.Store)(nil)
)

var testTiming = testkit.Timing

// env is one region's bus on a real nats-server.
type env struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	stream jetstream.Stream
	pub    *bus.Publisher
}

func newEnv(tb testing.TB, regionName string) *env {
	tb.Helper()
	s := testnats.Start(tb)
	return newEnvOn(tb, testnats.Connect(tb, s), regionName)
}

func newEnvOn(tb testing.TB, nc *nats.Conn, regionName string) *env {
	tb.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	st, err := bus.EnsureStream(ctx(tb), js, bus.StreamConfig{Region: regionName})
	if err != nil {
		tb.Fatal(err)
	}
	return &env{nc: nc, js: js, stream: st, pub: bus.NewPublisher(js, regionName)}
}

func ctx(tb testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	tb.Cleanup(cancel)
	return c
}

// newStore is a region store on a fresh redis-server whose sink is pub.
func newStore(tb testing.TB, pub region.Sink) *region.Store {
	tb.Helper()
	rdb, _ := testredis.Client(tb)
	st, err := region.New(rdb, region.Options{Region: "eu", Sink: pub, Timing: testTiming})
	if err != nil {
		tb.Fatal(err)
	}
	return st
}

// startReaper runs st's reaper until the test ends.
func startReaper(tb testing.TB, st *region.Store) {
	tb.Helper()
	c, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); st.RunReaper(c) }()
	tb.Cleanup(func() { cancel(); <-done })
}

// nSeqs is a poll's condition: seqs holds n sequences; the reason lists
// those delivered.
func nSeqs(seqs []uint64, n int) error {
	if len(seqs) != n {
		return fmt.Errorf("delivered seqs %v, want %d of them", seqs, n)
	}
	return nil
}

func streamInfo(tb testing.TB, s jetstream.Stream) *jetstream.StreamInfo {
	tb.Helper()
	info, err := s.Info(ctx(tb))
	if err != nil {
		tb.Fatal(err)
	}
	return info
}

// request sends a query and returns the reply body, or the micro error
// code and description.
func request(tb testing.TB, nc *nats.Conn, subject string, body string) (data []byte, code, desc string) {
	tb.Helper()
	m, err := nc.Request(subject, []byte(body), 5*time.Second)
	if err != nil {
		tb.Fatalf("request %s %s: %v", subject, body, err)
	}
	return m.Data, m.Header.Get(micro.ErrorCodeHeader), m.Header.Get(micro.ErrorHeader)
}

// query sends a query that must succeed and decodes its reply into out.
func query(tb testing.TB, nc *nats.Conn, endpoint, body string, out any) {
	tb.Helper()
	data, code, desc := request(tb, nc, bus.APISubject("eu", endpoint), body)
	if code != "" {
		tb.Fatalf("%s %s: error %s %s", endpoint, body, code, desc)
	}
	if err := json.Unmarshal(data, out); err != nil {
		tb.Fatalf("%s reply %s: %v", endpoint, data, err)
	}
}

func ref(room, user, session string) presence.SessionRef {
	return presence.SessionRef{Room: room, User: user, Session: session}
}

// tr is a hand-made transition for publisher tests.
func tr(regionName, room, user string, kind presence.Kind, seq uint64) presence.Transition {
	return presence.Transition{
		ID:     fmt.Sprintf("%s/%s/1764444000000/%d", regionName, room, seq),
		Region: regionName, Room: room, User: user, Kind: kind, Reason: presence.Joined,
		Sessions: 1, Seq: seq, Epoch: 1764444000000, At: time.UnixMilli(1764444000000 + int64(seq)),
	}
}

// connectLike opens another connection to e's server.
func connectLike(tb testing.TB, e *env) *nats.Conn {
	tb.Helper()
	nc, err := nats.Connect(e.nc.ConnectedUrl())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

// roomView follows one room by BUS.md with bus.Replay: the snapshot, the
// transitions after it, a fresh snapshot (get) on a new epoch or a
// stream made again.
type roomView struct {
	mu    sync.Mutex
	users map[string]bool
}

func followRoom(tb testing.TB, js jetstream.JetStream, snap presence.Snapshot, get func(context.Context) (presence.Snapshot, error)) *roomView {
	tb.Helper()
	v := &roomView{users: map[string]bool{}}
	apply := func(s presence.Snapshot) {
		v.mu.Lock()
		defer v.mu.Unlock()
		clear(v.users)
		for _, m := range s.Members {
			v.users[m.User] = true
		}
	}
	apply(snap)
	r, err := bus.Replay(context.Background(), js, snap.Region, snap.Room, snap, func(tr presence.Transition) {
		v.mu.Lock()
		defer v.mu.Unlock()
		switch tr.Kind {
		case presence.Online:
			v.users[tr.User] = true
		case presence.Offline:
			delete(v.users, tr.User)
		}
	}, bus.WithResnapshot(get, apply))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(r.Stop)
	return v
}

// members returns the view's users, sorted.
func (v *roomView) members() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Sorted(maps.Keys(v.users))
}

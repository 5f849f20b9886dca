package webhook

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testnats"
	"github.com/presence-dev/presence/presence"
)

// testSecret is the endpoints' key in the tests (32 bytes).
var testSecret = SecretPrefix + base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))

// env is a real nats-server with the region streams, a publisher per
// region, and dispatchers started on demand.
type env struct {
	t   *testing.T
	ns  *server.Server
	nc  *nats.Conn
	js  jetstream.JetStream
	pub map[string]*bus.Publisher
	mu  sync.Mutex
	seq map[string]uint64 // room -> last seq published
}

func newEnv(t *testing.T, regions ...string) *env {
	t.Helper()
	ns := testnats.Start(t)
	return newEnvOn(t, ns, regions...)
}

func newEnvOn(t *testing.T, ns *server.Server, regions ...string) *env {
	t.Helper()
	nc, err := nats.Connect(ns.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(PublishAsyncTimeout))
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, ns: ns, nc: nc, js: js, pub: map[string]*bus.Publisher{}, seq: map[string]uint64{}}
	for _, r := range regions {
		cfg := bus.StreamConfig{Region: r}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if _, err := bus.EnsureStream(ctx, js, cfg); err != nil {
			t.Fatal(err)
		}
		cancel()
		e.pub[r] = bus.NewPublisher(js, r, bus.WithStreamConfig(cfg))
	}
	return e
}

const testEpoch = int64(1764444000000)

// transition is the next transition of room in region: its seq follows
// the last one published.
func (e *env) transition(region, room, user string, kind presence.Kind) presence.Transition {
	e.mu.Lock()
	defer e.mu.Unlock()
	key := region + "/" + room
	e.seq[key]++
	s := e.seq[key]
	reason := presence.Joined
	if kind == presence.Offline {
		reason = presence.Left
	}
	return presence.Transition{ID: fmt.Sprintf("%s/%s/%d/%d", region, room, testEpoch, s), Region: region, Room: room, User: user,
		Kind: kind, Reason: reason, Sessions: 1, Seq: s, Epoch: testEpoch, At: time.Now()}
}

// publish stores ts in their region's stream.
func (e *env) publish(ts ...presence.Transition) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.pub[ts[0].Region].Publish(ctx, ts); err != nil {
		e.t.Fatal(err)
	}
}

// churn publishes n transitions over rooms, alternating online and
// offline per user, and returns them.
func (e *env) churn(region string, rooms, n int) []presence.Transition {
	e.t.Helper()
	var all []presence.Transition
	for i := range n {
		room := fmt.Sprintf("room%d", i%rooms)
		kind := presence.Online
		if (i/rooms)%2 == 1 {
			kind = presence.Offline
		}
		t := e.transition(region, room, fmt.Sprintf("u%d", i%rooms), kind)
		e.publish(t)
		all = append(all, t)
	}
	return all
}

// endpoint is a test endpoint of url: loopback allowed, short timings.
func endpoint(name, url string, sources ...string) Endpoint {
	if len(sources) == 0 {
		sources = []string{"eu"}
	}
	return Endpoint{Name: name, URL: url, Secrets: []string{testSecret}, Sources: sources,
		BatchSize: 10, MaxWait: Duration(20 * time.Millisecond), Timeout: Duration(time.Second),
		MinBackoff: Duration(50 * time.Millisecond), MaxBackoff: Duration(200 * time.Millisecond),
		AllowNetworks: []string{"127.0.0.0/8"}}
}

// config checks a configuration built in a test.
func config(t *testing.T, eps ...Endpoint) *Config {
	t.Helper()
	c := &Config{Endpoints: eps}
	if err := c.check(); err != nil {
		t.Fatal(err)
	}
	return c
}

// dispatcher starts a dispatcher of cfg, closed at cleanup.
func (e *env) dispatcher(cfg *Config, mod ...func(*Options)) (*Dispatcher, *prometheus.Registry) {
	e.t.Helper()
	reg := prometheus.NewRegistry()
	o := Options{JetStream: e.js, Config: cfg, LeaseTTL: 2 * time.Second, Registerer: reg,
		Logger: slog.New(slog.NewTextHandler(testLog{e.t}, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	for _, m := range mod {
		m(&o)
	}
	d, err := New(o)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := d.Start(ctx); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(d.Close)
	return d, reg
}

// testLog writes the dispatcher's log to the test's, only when
// PRESENCE_TEST_LOG is set (it is long).
type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	if os.Getenv("PRESENCE_TEST_LOG") != "" {
		l.t.Log(string(p))
	}
	return len(p), nil
}

// delivery is one request a receiver took.
type delivery struct {
	id     string
	status int
	items  []map[string]any
	at     time.Time
}

// receiver is a real HTTP server that checks every request's signature
// and answers with what answer says (200 when nil).
type receiver struct {
	t   *testing.T
	srv *httptest.Server

	mu     sync.Mutex
	answer func(n int) int
	got    []delivery
}

func newReceiver(t *testing.T) *receiver {
	t.Helper()
	r := &receiver{t: t}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return
	}
	sec, _ := ParseSecret(testSecret)
	if err := Verify(sec, req.Header.Get(HeaderID), req.Header.Get(HeaderTimestamp), req.Header.Get(HeaderSignature), body, time.Now(), 5*time.Minute); err != nil {
		r.t.Errorf("receiver: %v", err)
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	var b struct {
		Type   string           `json:"type"`
		Events []map[string]any `json:"events"`
	}
	if err := json.Unmarshal(body, &b); err != nil || b.Type != BodyType {
		r.t.Errorf("receiver: body %q: %v", body, err)
	}
	r.mu.Lock()
	status := http.StatusOK
	if r.answer != nil {
		status = r.answer(len(r.got))
	}
	r.got = append(r.got, delivery{id: req.Header.Get(HeaderID), status: status, items: b.Events, at: time.Now()})
	r.mu.Unlock()
	w.WriteHeader(status)
}

func (r *receiver) setAnswer(f func(n int) int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.answer = f
}

func (r *receiver) deliveries() []delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]delivery(nil), r.got...)
}

// accepted returns the items of the deliveries answered 2xx, in order.
func (r *receiver) accepted() []map[string]any {
	var out []map[string]any
	for _, d := range r.deliveries() {
		if d.status >= 200 && d.status < 300 {
			out = append(out, d.items...)
		}
	}
	return out
}

// events returns the accepted items that are events (not markers).
func (r *receiver) events() []map[string]any {
	var out []map[string]any
	for _, it := range r.accepted() {
		if it["kind"] != KindResync {
			out = append(out, it)
		}
	}
	return out
}

// checkContract checks what a receiver got against what was published:
// every transition accepted at least once; per room in seq order; an
// event accepted twice only if a dispatcher may have lost the answer (it
// is not allowed at all when dups is false); every delivery that carried
// an event id again was a retry of a batch the receiver had not accepted.
func checkContract(t *testing.T, r *receiver, want []presence.Transition, dups bool) {
	t.Helper()
	wantIDs := map[string]bool{}
	for _, w := range want {
		wantIDs[w.ID] = true
	}
	count := map[string]int{}
	last := map[string]float64{}
	for _, ev := range r.events() {
		id := ev["id"].(string)
		count[id]++
		room := ev["region"].(string) + "/" + ev["room"].(string)
		seq := ev["seq"].(float64)
		if count[id] == 1 && seq <= last[room] {
			t.Errorf("room %s: seq %v delivered after %v", room, seq, last[room])
		}
		last[room] = max(last[room], seq)
		if !wantIDs[id] {
			t.Errorf("event %s delivered but never published", id)
		}
	}
	var missing []string
	for id := range wantIDs {
		if count[id] == 0 {
			missing = append(missing, id)
		}
		if count[id] > 1 && !dups {
			t.Errorf("event %s accepted %d times", id, count[id])
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("%d of %d transitions never accepted, e.g. %v", len(missing), len(want), missing[:min(5, len(missing))])
	}
	accepted := map[string]bool{}
	for _, d := range r.deliveries() {
		if accepted[d.id] && !dups {
			t.Errorf("delivery %s sent again after it was accepted", d.id)
		}
		if d.status >= 200 && d.status < 300 {
			accepted[d.id] = true
		}
	}
}

// waitEvents waits until the receiver accepted n distinct events.
func waitEvents(t *testing.T, r *receiver, n int, within time.Duration) {
	t.Helper()
	testkit.CheckFor(t, within, 10*time.Millisecond, func() error {
		seen := map[any]bool{}
		for _, ev := range r.events() {
			seen[ev["id"]] = true
		}
		return testkit.AtLeast("distinct events accepted", len(seen), n)
	})
}

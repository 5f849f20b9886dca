package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testnats"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/webhook"
)

var hookSecret = webhook.SecretPrefix + base64.StdEncoding.EncodeToString([]byte("e2e-webhook-key-0123456789abcdef"))

// hookItem is one item a hook receiver accepted.
type hookItem struct {
	ID, Kind, Reason, Room, User string
	Seq                          uint64
	Epoch                        int64
}

// hookSink is a real HTTP receiver of a dispatcher process: it checks
// signatures, answers as hold says and keeps what it answered 2xx.
type hookSink struct {
	t        testing.TB
	srv      *httptest.Server
	mu       sync.Mutex
	accepted []hookItem
	requests int
	hold     func(n int) // runs before the answer of request n
	fail     func() bool // true: answer this request 500
}

func newHookSink(t testing.TB) *hookSink {
	h := &hookSink{t: t}
	sec, err := webhook.ParseSecret(hookSecret)
	if err != nil {
		t.Fatal(err)
	}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := webhook.Verify(sec, r.Header.Get(webhook.HeaderID), r.Header.Get(webhook.HeaderTimestamp),
			r.Header.Get(webhook.HeaderSignature), body, time.Now(), time.Minute); err != nil {
			t.Errorf("hook sink: %v", err)
			return
		}
		var b struct{ Events []hookItem }
		if err := json.Unmarshal(body, &b); err != nil {
			t.Errorf("hook sink: %v", err)
		}
		h.mu.Lock()
		n, hold := h.requests, h.hold
		h.requests++
		h.mu.Unlock()
		if hold != nil {
			hold(n)
		}
		if r.Context().Err() != nil {
			return // the dispatcher is gone: this answer reaches nobody
		}
		if h.fail != nil && h.fail() {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		h.mu.Lock()
		h.accepted = append(h.accepted, b.Events...)
		h.mu.Unlock()
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *hookSink) items() []hookItem {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.accepted)
}

// distinct counts the distinct event ids accepted.
func (h *hookSink) distinct() int {
	seen := map[string]bool{}
	for _, it := range h.items() {
		if it.Kind != webhook.KindResync {
			seen[it.ID] = true
		}
	}
	return len(seen)
}

// startHooks runs `presenced webhooks` on natsURL for an endpoint of
// sink and returns it once healthy.
func (e *env) startHooks(natsURL string, sink *hookSink) *proc {
	e.t.Helper()
	cfg := filepath.Join(e.t.TempDir(), "webhooks.yaml")
	body := fmt.Sprintf("sources: [eu]\nendpoints:\n  - name: e2e\n    url: %s\n    secrets: [%s]\n    batch_size: 20\n    max_wait: 20ms\n"+
		"    timeout: 1s\n    min_backoff: 50ms\n    max_backoff: 300ms\n    allow_networks: [127.0.0.0/8]\n", sink.srv.URL, hookSecret)
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		e.t.Fatal(err)
	}
	p := e.start([]string{"webhooks", "--nats", natsURL, "--config", cfg, "--listen", "127.0.0.1:0", "--lease-ttl", "2s"}, false)
	testkit.CheckFor(e.t, 20*time.Second, 10*time.Millisecond, func() error {
		if p.addr == "" {
			m := hooksListening.FindStringSubmatch(p.out.String())
			if m == nil {
				return errors.New("no listening line in the dispatcher's log yet")
			}
			p.addr = m[1]
		}
		return testkit.Want("the dispatcher's health", health(p), http.StatusOK)
	})
	return p
}

// checkHookOrder checks that each room's events were first accepted in
// seq order.
func checkHookOrder(t *testing.T, items []hookItem) {
	t.Helper()
	seen := map[string]bool{}
	last := map[string]uint64{}
	for _, it := range items {
		if it.Kind == webhook.KindResync || seen[it.ID] {
			continue
		}
		seen[it.ID] = true
		if it.Seq <= last[it.Room] {
			t.Errorf("room %s: seq %d first accepted after %d", it.Room, it.Seq, last[it.Room])
		}
		last[it.Room] = it.Seq
	}
}

// The dispatcher is SIGKILLed while a batch is in flight and started
// again: nothing is lost, it resumes from its consumer, and what comes
// twice is at most the batch that was in flight.
func TestE2EWebhookDispatcherKilledMidBatch(t *testing.T) {
	skipIfShort(t, "webhooks: a dispatcher process killed")
	ns := testnats.Start(t)
	e := &env{t: t, nats: ns.ClientURL(), nc: testnats.Connect(t, ns)}
	js, _ := jetstream.New(e.nc)
	if _, err := bus.EnsureStream(context.Background(), js, bus.StreamConfig{Region: "eu"}); err != nil {
		t.Fatal(err)
	}
	pub := bus.NewPublisher(js, "eu")
	sink := newHookSink(t)
	inFlight, release := make(chan struct{}), make(chan struct{})
	sink.hold = func(n int) {
		if n == 2 {
			close(inFlight)
			<-release
		}
	}
	d1 := e.startHooks(e.nats, sink)
	testkit.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		_, err := js.Consumer(context.Background(), "PRESENCE_eu", webhook.ConsumerName("e2e"))
		return err
	})
	seq := map[string]uint64{}
	var ids []string
	for i := range 300 {
		room := fmt.Sprintf("room%d", i%6)
		seq[room]++
		tr := presence.Transition{ID: fmt.Sprintf("eu/%s/1/%d", room, seq[room]), Region: "eu", Room: room, User: fmt.Sprintf("u%d", i),
			Kind: presence.Online, Reason: presence.Joined, Sessions: 1, Seq: seq[room], Epoch: 1, At: time.Now()}
		if _, err := pub.Publish(context.Background(), []presence.Transition{tr}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, tr.ID)
	}
	<-inFlight
	d1.signal(syscall.SIGKILL)
	d1.exit(t, 10*time.Second)
	close(release)
	e.startHooks(e.nats, sink)
	testkit.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		return testkit.Want("distinct events, every one after the restart", sink.distinct(), len(ids))
	})
	items := sink.items()
	checkHookOrder(t, items)
	if extra := len(items) - len(ids); extra > 20 {
		t.Errorf("%d items accepted twice: more than the batch in flight (20)", extra)
	}
}

// NATS restarts (its store kept) while deliveries run, then restarts on
// an empty store (the stream and the dispatcher's state lost) while users
// leave. Everything the stream held is delivered; after the loss the
// endpoint is told to resnapshot the room (a resync marker), and a
// receiver that folds the events and follows the markers ends with the
// users connected; deliveries then stop (no endless redelivery).
func TestE2EWebhookNATSRestartAndStoreLost(t *testing.T) {
	skipIfShort(t, "webhooks: NATS restarted and its store lost")
	w := newWorld(t, shortTiming, 1)
	sink := newHookSink(t)
	w.e.startHooks(w.e.nats, sink)
	testkit.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error { return hookConsumer(t, w) })
	_, stayers := w.mustPeople("stay", "r", 6)
	testkit.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error { return testkit.AtLeast("distinct events, the joins", sink.distinct(), 6) })

	w.stopNATS()
	w.startNATS(false)
	more, morers := w.mustPeople("more", "r", 4)
	testkit.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		return testkit.AtLeast("distinct events, with the joins after the restart", sink.distinct(), 10)
	})

	w.stopNATS()
	for _, m := range more {
		m.leave()
	}
	// The departures are decided while NATS is away: they wait in the
	// room's outbox (presence:{r}:o, region/outbox.go's entries).
	rdb := redis.NewClient(&redis.Options{Addr: w.e.redis})
	defer rdb.Close()
	testkit.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		n := 0
		for _, e := range rdb.LRange(context.Background(), "presence:{r}:o", 0, -1).Val() {
			if f := strings.Split(e, "|"); len(f) > 4 && f[2] == "offline" && slices.Contains(morers, f[4]) {
				n++
			}
		}
		return testkit.Want("the leavers' offlines in the outbox", n, len(morers))
	})
	w.startNATS(true)
	truth := stayers
	client := bus.NewClient(testnats.Connect(t, w.ns), "eu")
	testkit.CheckFor(t, 60*time.Second, 10*time.Millisecond, func() error {
		return testkit.WantSlice("the receiver's fold (who is connected)", foldHooks(t, client, sink.items(), "r"), truth)
	})
	// The endpoint is told in the documented way: a resync marker of the
	// room with a reason docs/WEBHOOKS.md lists for a lost stream.
	markers := 0
	for _, it := range sink.items() {
		if it.Kind != webhook.KindResync {
			continue
		}
		markers++
		if it.Room != "r" || !slices.Contains([]string{webhook.ResyncStreamReset, webhook.ResyncNewEpoch, webhook.ResyncGap}, it.Reason) {
			t.Errorf("marker %+v: not a documented notice of the lost stream", it)
		}
	}
	if markers == 0 {
		t.Error("no resync marker after the stream was made again")
	}
	checkHooksSettle(t, sink, sink.items(), morers)
	if got := foldHooks(t, client, sink.items(), "r"); !slices.Equal(got, truth) {
		t.Errorf("once delivery settled the fold is %v, want %v", got, truth)
	}
}

// checkHooksSettle waits for the deliveries to stop (no endless
// redelivery): no new item for a few seconds, within a deadline. What
// came after the receiver's fold was right (had) may only be an item
// accepted before (a duplicate), a documented resync marker, or the
// departure of one of leavers: their offline events waited in a node's
// outbox and may be published after a marker's snapshot showed them gone.
func checkHooksSettle(t *testing.T, sink *hookSink, had []hookItem, leavers []string) {
	t.Helper()
	n, since := len(had), time.Now()
	testkit.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		if m := len(sink.items()); m != n {
			n, since = m, time.Now()
		}
		if d := time.Since(since); d <= 3*time.Second {
			return fmt.Errorf("%d items, the last %v ago, want none new for 3s", n, d.Round(time.Millisecond))
		}
		return nil
	})
	seen := map[string]bool{}
	for _, it := range had {
		seen[it.ID] = true
	}
	for _, it := range sink.items()[len(had):] {
		switch {
		case seen[it.ID]:
		case it.Kind == webhook.KindResync && slices.Contains([]string{webhook.ResyncStreamReset, webhook.ResyncNewEpoch, webhook.ResyncGap}, it.Reason):
		case it.Kind == string(presence.Offline) && slices.Contains(leavers, it.User):
		default:
			t.Errorf("item %+v delivered after the receiver had everything: not a duplicate, a marker or a departure", it)
		}
	}
}

func hookConsumer(t *testing.T, w *world) error {
	nc := testnats.Connect(t, w.ns)
	js, _ := jetstream.New(nc)
	_, err := js.Consumer(context.Background(), "PRESENCE_eu", webhook.ConsumerName("e2e"))
	return err
}

// foldHooks folds room's accepted items as docs/WEBHOOKS.md says: each
// id once, online adds, offline removes, a resync marker replaces the
// view with a fresh snapshot and later events apply above its room_seq.
func foldHooks(t *testing.T, c *bus.Client, items []hookItem, room string) []string {
	seen := map[string]bool{}
	members := map[string]bool{}
	var floorEpoch int64
	var floorSeq uint64
	for _, it := range items {
		if it.Room != room || seen[it.ID] {
			continue
		}
		seen[it.ID] = true
		switch {
		case it.Kind == webhook.KindResync:
			snap, err := c.Snapshot(context.Background(), room, 0, 1000)
			if err != nil {
				return nil
			}
			members = map[string]bool{}
			for _, m := range snap.Members {
				members[m.User] = true
			}
			floorEpoch, floorSeq = snap.Epoch, snap.RoomSeq
		case it.Epoch < floorEpoch || (it.Epoch == floorEpoch && it.Seq <= floorSeq):
		case it.Kind == string(presence.Online):
			members[it.User] = true
		case it.Kind == string(presence.Offline):
			delete(members, it.User)
		}
	}
	var out []string
	for u := range members {
		out = append(out, u)
	}
	slices.Sort(out)
	return out
}

// hooksListening matches the line a dispatcher logs once it serves
// /healthz and /metrics.
var hooksListening = regexp.MustCompile(`msg="presenced: webhooks http" addr=(\S+)`)

// A configuration that does not load stops the dispatcher at start with
// exit code 2 and the field named; nothing connects.
func TestE2EWebhookBadConfigIsAUsageError(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "webhooks.yaml")
	if err := os.WriteFile(cfg, []byte("endpoints:\n  - name: a\n    url: ftp://h/x\n    secrets: [whsec_x]\n    sources: [eu]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t}
	p := e.start([]string{"webhooks", "--nats", "nats://127.0.0.1:1", "--config", cfg}, false)
	if code := p.exit(t, 10*time.Second); code != 2 {
		t.Fatalf("exit %d, want 2\n%s", code, p.out.String())
	}
	for _, want := range []string{"url", "ftp://h/x", "secret"} {
		if !strings.Contains(p.out.String(), want) {
			t.Errorf("the error does not name %q: %s", want, p.out.String())
		}
	}
}

package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/testnats"
	"github.com/presence-dev/presence/presence"
)

// countingReceiver takes deliveries as fast as it can, verifying each
// signature, and notes when each event id arrived.
type countingReceiver struct {
	srv  *httptest.Server
	mu   sync.Mutex
	seen map[string]time.Time
}

func newCountingReceiver(b *testing.B) *countingReceiver {
	r := &countingReceiver{seen: map[string]time.Time{}}
	sec, _ := ParseSecret(testSecret)
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		now := time.Now()
		if Verify(sec, req.Header.Get(HeaderID), req.Header.Get(HeaderTimestamp), req.Header.Get(HeaderSignature), body, now, time.Minute) != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		var bd struct{ Events []struct{ ID string } }
		_ = json.Unmarshal(body, &bd)
		r.mu.Lock()
		for _, e := range bd.Events {
			if _, ok := r.seen[e.ID]; !ok {
				r.seen[e.ID] = now
			}
		}
		r.mu.Unlock()
	}))
	b.Cleanup(r.srv.Close)
	return r
}

func (r *countingReceiver) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.seen)
}

// publishMany stores n transitions over 100 rooms, in batches of 256.
func (e *env) publishMany(b *testing.B, n int) {
	var batch []presence.Transition
	for i := range n {
		batch = append(batch, e.transition("eu", fmt.Sprintf("room%d", i%100), fmt.Sprintf("u%d", i), presence.Online))
		if len(batch) == 256 || i == n-1 {
			if _, err := e.pub["eu"].Publish(context.Background(), batch); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
}

// Transitions delivered per second by one dispatcher draining a backlog
// of b.N (at least 20,000) from its stream to a receiver on loopback, at
// batch sizes 1 and 100.
func BenchmarkDeliveryThroughput(b *testing.B) {
	for _, size := range []int{1, 100} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			e := newBenchEnv(b)
			r := newCountingReceiver(b)
			ep := endpoint("bench", r.srv.URL)
			ep.BatchSize, ep.MaxPending, ep.Timeout, ep.MaxWait = size, 10000, Duration(5*time.Second), 0
			cfg := &Config{Endpoints: []Endpoint{ep}}
			if err := cfg.check(); err != nil {
				b.Fatal(err)
			}
			d := e.benchDispatcher(b, cfg)
			d.Close() // the lane's consumer exists: what follows is its backlog
			n := max(b.N, 20000)
			e.publishMany(b, n)
			b.ResetTimer()
			start := time.Now()
			d = e.benchDispatcher(b, cfg)
			waitCount(b, r, n, d)
			el := time.Since(start)
			b.StopTimer()
			d.Close()
			b.ReportMetric(float64(n)/el.Seconds(), "transitions/s")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// Stored -> received at 1,000 transitions/s for 20 s, over 100 rooms: the
// time from the stream's acknowledgement of a publish to the receiver
// having the event, p50 and p99, at batch sizes 1 and 100 (max wait
// 500 ms, the default).
func BenchmarkDeliveryLatency(b *testing.B) {
	for _, size := range []int{1, 100} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			e := newBenchEnv(b)
			r := newCountingReceiver(b)
			ep := endpoint("bench", r.srv.URL)
			ep.BatchSize, ep.MaxWait, ep.Timeout = size, Duration(DefaultMaxWait), Duration(5*time.Second)
			cfg := &Config{Endpoints: []Endpoint{ep}}
			if err := cfg.check(); err != nil {
				b.Fatal(err)
			}
			d := e.benchDispatcher(b, cfg)
			defer d.Close()
			time.Sleep(time.Second) // the lane runs
			b.ResetTimer()
			stored := map[string]time.Time{}
			tick := time.NewTicker(10 * time.Millisecond) // 10 per tick: 1,000/s
			defer tick.Stop()
			for i := 0; i < 20000; i += 10 {
				<-tick.C
				var ts []presence.Transition
				for j := range 10 {
					ts = append(ts, e.transition("eu", fmt.Sprintf("room%d", (i+j)%100), "u", presence.Online))
				}
				if _, err := e.pub["eu"].Publish(context.Background(), ts); err != nil {
					b.Fatal(err)
				}
				now := time.Now()
				for _, t := range ts {
					stored[t.ID] = now
				}
			}
			waitCount(b, r, len(stored), d)
			b.StopTimer()
			var lat []time.Duration
			r.mu.Lock()
			for id, at := range r.seen {
				lat = append(lat, max(at.Sub(stored[id]), 0))
			}
			r.mu.Unlock()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50_ms")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99_ms")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// newBenchEnv is newEnv for a benchmark: a nats-server with the eu stream.
func newBenchEnv(b *testing.B) *env {
	b.Helper()
	ns := testnats.Start(b)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	if _, err := bus.EnsureStream(context.Background(), js, bus.StreamConfig{Region: "eu"}); err != nil {
		b.Fatal(err)
	}
	return &env{ns: ns, nc: nc, js: js, pub: map[string]*bus.Publisher{"eu": bus.NewPublisher(js, "eu")}, seq: map[string]uint64{}}
}

func (e *env) benchDispatcher(b *testing.B, cfg *Config) *Dispatcher {
	b.Helper()
	d, err := New(Options{JetStream: e.js, Config: cfg, LeaseTTL: 20 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	for len(d.Status()) == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	return d
}

// waitCount waits until r has n events, failing when none arrives for
// 30 s.
func waitCount(b *testing.B, r *countingReceiver, n int, d *Dispatcher) {
	last, at := -1, time.Now()
	for c := r.count(); c < n; c = r.count() {
		if c != last {
			last, at = c, time.Now()
		}
		if time.Since(at) > 30*time.Second {
			b.Fatalf("stuck at %d of %d: %+v", c, n, d.Status())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

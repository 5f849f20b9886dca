package httpapi

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/presence"
)

// benchRoomSize is the room the members benchmark reads whole.
const benchRoomSize = 1000

// latencies collects the requests' durations of a parallel benchmark.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d []time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d...)
	l.mu.Unlock()
}

// report adds requests per second and the 50th and 99th percentiles.
func (l *latencies) report(b *testing.B, elapsed time.Duration) {
	slices.Sort(l.d)
	if len(l.d) == 0 {
		return
	}
	q := func(p float64) float64 { return float64(l.d[int(p*float64(len(l.d)-1))].Microseconds()) / 1000 }
	b.ReportMetric(float64(len(l.d))/elapsed.Seconds(), "req/s")
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(0, "ns/op")
}

// runParallel runs call from 16 goroutines (GOMAXPROCS x 8 on the
// 2-core machine) and reports its rate and latency.
func runParallel(b *testing.B, call func() error) {
	var l latencies
	b.SetParallelism(8)
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		var mine []time.Duration
		for pb.Next() {
			t0 := time.Now()
			if err := call(); err != nil {
				b.Error(err)
				return
			}
			mine = append(mine, time.Since(t0))
		}
		l.add(mine)
	})
	elapsed := time.Since(start)
	b.StopTimer()
	l.report(b, elapsed)
}

// BenchmarkQueries reads a 1,000-member room's members (the whole room,
// one page) and a room's count over HTTP and over the micro service, in
// the same run against the same Redis and NATS, and from the store
// directly, the floor of both.
func BenchmarkQueries(b *testing.B) {
	f := newBenchFixture(b)
	httpc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	get := func(path string) func() error {
		return func() error {
			req, _ := http.NewRequest(http.MethodGet, f.srv.URL+path, nil)
			req.Header.Set("Authorization", "Bearer "+readSecret)
			resp, err := httpc.Do(req)
			if err != nil {
				return err
			}
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				return fmt.Errorf("%s: %d", path, resp.StatusCode)
			}
			return err
		}
	}
	ask := func(endpoint, body string) func() error {
		return func() error {
			m, err := f.nc.Request(bus.APISubject("eu", endpoint), []byte(body), 10*time.Second)
			if err == nil && m.Header.Get(micro.ErrorCodeHeader) != "" {
				err = fmt.Errorf("%s: %s", endpoint, m.Header.Get(micro.ErrorHeader))
			}
			return err
		}
	}
	// The store alone: what either transport adds to.
	store := func(members bool) func() error {
		return func() error {
			if members {
				_, err := f.store.Snapshot(context.Background(), "big", 0, benchRoomSize)
				return err
			}
			_, err := f.store.Count(context.Background(), "big")
			return err
		}
	}
	b.Run("members-1000/http", func(b *testing.B) { runParallel(b, get("/v1/rooms/big/members?limit=1000")) })
	b.Run("members-1000/micro", func(b *testing.B) { runParallel(b, ask("members", `{"room":"big","limit":1000}`)) })
	b.Run("members-1000/store", func(b *testing.B) { runParallel(b, store(true)) })
	b.Run("count/http", func(b *testing.B) { runParallel(b, get("/v1/rooms/big/count")) })
	b.Run("count/micro", func(b *testing.B) { runParallel(b, ask("count", `{"room":"big"}`)) })
	b.Run("count/store", func(b *testing.B) { runParallel(b, store(false)) })
}

// newBenchFixture is a fixture whose room "big" holds benchRoomSize
// members, each with a session and a state.
func newBenchFixture(b *testing.B) *fixture {
	b.Helper()
	f := newFixture(b)
	ctx := context.Background()
	var refs []presence.SessionRef
	for i := range benchRoomSize {
		refs = append(refs, ref("big", fmt.Sprintf("user-%04d", i), "tab"))
	}
	for i := 0; i < len(refs); i += 500 {
		if _, err := f.store.Claim(ctx, refs[i:i+500]); err != nil {
			b.Fatal(err)
		}
	}
	if n, err := f.store.Count(ctx, "big"); err != nil || n != benchRoomSize {
		b.Fatalf("room big: %d members, %v", n, err)
	}
	return f
}

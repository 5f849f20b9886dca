package main

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/presence-dev/presence/internal/testkit"
)

// dashboardMetrics lists every metric the Grafana dashboard and the
// alert rules query. The deploy module's tests (deploy/, its own Go
// module) parse every query with Prometheus's PromQL parser and hold the
// queries' metrics and this list equal; this test holds the list to
// what the service exports. Together: every query names a real metric.
const dashboardMetrics = "../../deploy/grafana/metrics.txt"

// A node (--global), an aggregator and a webhook dispatcher, on a real
// Redis and NATS, are scraped after a client joined, left, joined and
// hung up, the aggregator heard the region and the dispatcher's endpoint
// failed once and then took the events: every metric the dashboard and
// the alerts query must be in their expositions.
func TestDashboardMetricsAreExported(t *testing.T) {
	skipIfShort(t, "dashboard: scrapes a node and an aggregator")
	e := newEnv(t)
	agg := e.start([]string{"aggregator", "--nats", e.nats, "--cadence", "300ms", "--regions", "eu", "--listen", "127.0.0.1:0"}, false)
	aggAddr := waitAggregatorOK(t, agg)
	n := e.startNodeIn("eu", "--global", "--global-cadence", "300ms")
	sink := newHookSink(t)
	var failed atomic.Bool
	sink.fail = func() bool { return !failed.Swap(true) }
	hooks := e.startHooks(e.nats, sink)

	c := dial(t, n.addr, "alice", "tab")
	c.join("lobby")
	// The metrics added for the dashboard count what happened: one member
	// online in the region (the denominator of events per user per
	// minute) and one online delivered, by kind and reason.
	expectMetrics(t, "http://"+n.addr+"/metrics", "presence_global_publisher_members 1",
		`presence_region_transitions_by_reason_total{kind="online",reason="joined"} 1`, `presence_timing_seconds{setting="session_ttl"} 3`)
	c.send(map[string]any{"type": "leave", "room": "lobby", "ref": "l"})
	c.expect("left")
	c.join("lobby")
	c.cut()

	want := readMetricList(t)
	var missing []string
	err := testkit.Poll(20*time.Second, 100*time.Millisecond, func() error {
		have := scrapeNames(n.addr)
		for _, addr := range []string{aggAddr, hooks.addr} {
			for name := range scrapeNames(addr) {
				have[name] = true
			}
		}
		missing = slices.DeleteFunc(slices.Clone(want), func(m string) bool { return have[m] })
		if len(missing) > 0 {
			return fmt.Errorf("not exported: %v", missing)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%s names metrics none of the node, the aggregator and the dispatcher exports: %v", dashboardMetrics, missing)
	}
}

// readMetricList reads the list: one name a line, # comments.
func readMetricList(t *testing.T) []string {
	t.Helper()
	f, err := os.Open(dashboardMetrics)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var names []string
	for sc := bufio.NewScanner(f); sc.Scan(); {
		if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasPrefix(l, "#") {
			names = append(names, l)
		}
	}
	if len(names) == 0 {
		t.Fatalf("%s lists no metric", dashboardMetrics)
	}
	return names
}

// scrapeNames returns the names of the samples at addr's /metrics
// (histograms as their _bucket, _sum and _count); none if it does not
// answer.
func scrapeNames(addr string) map[string]bool {
	names := map[string]bool{}
	r, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return names
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	for _, l := range strings.Split(string(b), "\n") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if i := strings.IndexAny(l, "{ "); i > 0 {
			names[l[:i]] = true
		}
	}
	return names
}

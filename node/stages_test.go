package node

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/presence"
)

// A join's way through the node is accounted for: its claim, then its
// online's way from the store back to the node off NATS, each observed
// once, with a time no longer than the join took from the client.
func TestAJoinsStagesAreObserved(t *testing.T) {
	e := newEnv(t)
	reg := prometheus.NewRegistry()
	n := e.newNode(func(c *Config) { c.Metrics = reg })
	watcher := n.dial(t, token(t, "bob", []string{"r"}, time.Minute), "tab")
	c := n.dial(t, token(t, "ann", []string{"r"}, time.Minute), "tab")
	began := time.Now()
	watcher.join("r")
	c.join("r")
	if f := watcher.expect("event"); f.Event.Kind != presence.Online || f.Event.User != "ann" {
		t.Fatalf("watcher: %s", f.raw)
	}
	took := time.Since(began).Seconds()
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		for _, name := range []string{"presence_node_join_claim_seconds", "presence_node_event_age_seconds"} {
			// bob's join and ann's.
			count, sum := histogram(t, reg, name)
			if err := testkit.Want(name+" observations", count, uint64(2)); err != nil {
				return err
			}
			// Each is at most the time both joins took (an event's age is
			// by Redis's clock in ms: up to a ms more).
			if sum <= 0 || sum > 2*took+0.002 {
				t.Fatalf("%s observed %.4fs in all", name, sum)
			}
		}
		return nil
	})
}

// histogram returns the count and sum of the registry's histogram name.
func histogram(t *testing.T, reg *prometheus.Registry, name string) (uint64, float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && mf.GetType() == dto.MetricType_HISTOGRAM && len(mf.GetMetric()) == 1 {
			h := mf.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	t.Fatalf("no histogram %s", name)
	return 0, 0
}

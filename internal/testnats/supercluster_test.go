package testnats

import (
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/presence-dev/presence/internal/testkit"
)

func TestSuperClusterIsolateAndHeal(t *testing.T) {
	sc := StartSuperCluster(t, "a", "b", "c")
	na, nb := sc.Connect(t, "a"), sc.Connect(t, "b")
	sub, err := nb.SubscribeSync("x")
	if err != nil {
		t.Fatal(err)
	}
	if err := nb.Flush(); err != nil {
		t.Fatal(err)
	}
	// Interest reaches a a moment after b's flush: publish until it lands.
	roundTrip := func(when string) {
		t.Helper()
		testkit.CheckFor(t, 5*time.Second, 0, func() error {
			if err := na.Publish("x", []byte("1")); err != nil {
				return err
			}
			if _, err := sub.NextMsg(100 * time.Millisecond); err != nil {
				return fmt.Errorf("a -> b %s: %w", when, err)
			}
			return nil
		})
	}
	roundTrip("before the cut")
	if n, err := sc.GatewayBytes(); err != nil || n == 0 || sc.WireBytes() == 0 {
		t.Fatalf("gateway bytes %d (%v), wire bytes %d", n, err, sc.WireBytes())
	}

	sc.Isolate("a")
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		for _, o := range []string{"b", "c"} {
			if sc.connected([]string{"a", o}) == nil {
				return fmt.Errorf("a and %s still have their gateways after Isolate", o)
			}
		}
		return nil
	})
	for {
		if _, err := sub.NextMsg(50 * time.Millisecond); err != nil {
			break // drained what crossed before the cut
		}
	}
	for range 5 {
		_ = na.Publish("x", []byte("2"))
	}
	if m, err := sub.NextMsg(500 * time.Millisecond); err == nil {
		t.Fatalf("a reached b across a cut gateway: %q", m.Data)
	}
	if err := sc.connected([]string{"b", "c"}); err != nil {
		t.Fatalf("b and c lost each other: %v", err)
	}

	sc.Heal("a")
	sc.WaitConnected(t, 20*time.Second)
	roundTrip("after heal")
}

// A route port taken between picking and binding it costs a retry, not
// the test (seen in CI with packages running side by side).
func TestSuperClusterRetriesATakenRoutePort(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	var calls atomic.Int32
	pickPort = func(tb testing.TB) int {
		if calls.Add(1) == 1 {
			return taken.Addr().(*net.TCPAddr).Port
		}
		return freePort(tb)
	}
	t.Cleanup(func() { pickPort = freePort })
	// The cause of each retry, not the wall clock, tells whether the failed
	// listen was noticed at once: a retry after the ready timeout would
	// read "not ready in ...". (A start time bound failed when packages
	// ran side by side.)
	var whys []string
	retried = func(cluster, why string) { whys = append(whys, cluster+": "+why) }
	t.Cleanup(func() { retried = func(string, string) {} })
	StartSuperCluster(t, "a", "b")
	if calls.Load() != 3 {
		t.Fatalf("%d ports picked, want 3 (one retry)", calls.Load())
	}
	if len(whys) != 1 || strings.Contains(whys[0], notReady) {
		t.Fatalf("retries %q, want one, for the failed listen: it was not noticed at once", whys)
	}
	t.Logf("retried: %q", whys)
}

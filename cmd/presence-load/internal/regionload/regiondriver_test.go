package regionload

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/presence-dev/presence/cmd/presence-load/internal/worker"
	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/node"
)

// The test binary is its own region-driver child, as the region mode's
// drivers are this tool's.
func TestMain(m *testing.M) {
	if os.Getenv("REGIONLOAD_TEST_DRIVER") == "1" {
		if err := DriverMain(context.Background(), os.Args[2:], os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(3)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// A driver on a real Redis Cluster answers its parent's requests:
// seed claims its share, flat refreshes it, run keeps it on the
// heartbeat, stat reports it held, close stops it.
func TestDriverSeedsRefreshesAndHolds(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	_, servers := testredis.Cluster(t, 3)
	var addrs []string
	for _, s := range servers {
		addrs = append(addrs, s.Addr)
	}
	t.Setenv("REGIONLOAD_TEST_DRIVER", "1")
	t.Setenv("GORACE", "atexit_sleep_ms=0")
	spec, _ := json.Marshal(driverSpec{Cluster: strings.Join(addrs, ","), Index: 1, Drivers: 2, Sessions: 400, Room: 10,
		Churn: 0.5, Inflight: 2, Slots: node.DefaultHeartbeatSlots, BatchSize: 50})
	d, err := worker.Start("region-driver", string(spec))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	var seeded driverReport
	if err := d.CallWithin(time.Minute, "seed", nil, &seeded); err != nil || seeded.N != 200 {
		t.Fatalf("seed: %+v, %v; want the driver's 200 of 400", seeded, err)
	}
	var flat driverReport
	if err := d.CallWithin(time.Minute, "flat", flatReq{For: 300 * time.Millisecond}, &flat); err != nil || flat.N < 200 || flat.Errors != 0 {
		t.Fatalf("flat: %+v, %v; want every session refreshed at least once, no errors", flat, err)
	}
	if err := d.CallWithin(time.Minute, "run", nil, nil); err != nil {
		t.Fatal(err)
	}
	var st driverReport
	if err := d.CallWithin(time.Minute, "stat", nil, &st); err != nil || st.Held != 200 {
		t.Fatalf("stat: %+v, %v; want 200 held", st, err)
	}
	var stopped driverReport
	// Its totals: the seed's 200 claims are 200 onlines delivered to its
	// sink (the heartbeat has not come round yet: N counts its refreshes).
	if err := d.CallWithin(time.Minute, worker.OpClose, nil, &stopped); err != nil || stopped.Transitions < 200 {
		t.Fatalf("close: %+v, %v; want the seed's 200 transitions", stopped, err)
	}
	if err := d.Call("stat", nil, nil); err == nil {
		t.Fatal("the driver still answers after close")
	}
}

func TestDriverRefusesABadSpec(t *testing.T) {
	for _, args := range [][]string{nil, {"{"}, {`{"cluster":"x","sessions":1}`}, {`{"cluster":"x","sessions":10,"drivers":1,"index":1,"per_room":2,"slots":1,"batch":1}`}} {
		if _, err := parseDriverSpec(args); err == nil {
			t.Errorf("%q: parsed", args)
		}
	}
	if _, err := parseDriverSpec([]string{`{"cluster":"x","sessions":10,"drivers":2,"index":1,"per_room":2,"slots":1,"batch":1}`}); err != nil {
		t.Errorf("a good spec: %v", err)
	}
}

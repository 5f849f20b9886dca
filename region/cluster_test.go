package region

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
)

// On a Redis Cluster every room's keys and its reap index share a slot;
// rooms spread over all masters are reaped, each departure once.
func TestClusterRoomsOnManySlots(t *testing.T) {
	cc, _ := testredis.Cluster(t, 3)
	c := &collector{}
	s := newStore(t, cc, c)
	if !s.cluster {
		t.Fatal("store did not detect the cluster")
	}
	ctx := context.Background()
	if err := s.Preload(ctx); err != nil {
		t.Fatal(err)
	}

	// 30 rooms; check they land on all three masters.
	masters := map[string]bool{}
	var refs []presence.SessionRef
	for i := range 30 {
		room := fmt.Sprintf("room%d", i)
		addr, err := cc.MasterForKey(ctx, s.roomBase(room))
		if err != nil {
			t.Fatal(err)
		}
		masters[addr.Options().Addr] = true
		refs = append(refs, ref(room, "u"+fmt.Sprint(i), "a"), ref(room, "w"+fmt.Sprint(i), "b"))
	}
	if len(masters) != 3 {
		t.Fatalf("rooms landed on %d masters, want 3", len(masters))
	}
	if ts := touch(t, s, refs...); len(ts) != 60 {
		t.Fatalf("joins: %d, want 60", len(ts))
	}
	if n, err := s.Count(ctx, "room7"); err != nil || n != 2 {
		t.Fatalf("count: %d %v", n, err)
	}
	if m := members(t, s, "room7"); len(m) != 2 || m["u7"] != 1 {
		t.Fatalf("members: %v", m)
	}
	// u* leave cleanly; w* are kept alive for a while, then abandoned.
	for i := range 30 {
		release(t, s, ref(fmt.Sprintf("room%d", i), "u"+fmt.Sprint(i), "a"))
	}
	startReaper(t, newStore(t, cc, c))
	startReaper(t, newStore(t, cc, c))
	waitFor(t, 5*time.Second, "30 departures (left)", func() bool {
		n := 0
		for _, tr := range c.All() {
			if tr.Kind == presence.Offline && tr.Reason == presence.Left {
				n++
			}
		}
		return n == 30
	})
	waitFor(t, testTiming.SessionTTL+5*time.Second, "30 departures (expired)", func() bool {
		n := 0
		for _, tr := range c.All() {
			if tr.Kind == presence.Offline && tr.Reason == presence.Expired {
				n++
			}
		}
		return n == 30
	})
	time.Sleep(3 * testTiming.ReapInterval) // other reaper sweeps
	for i := range 30 {
		room := fmt.Sprintf("room%d", i)
		if n := len(c.Of(presence.Offline, room, "u"+fmt.Sprint(i))) + len(c.Of(presence.Offline, room, "w"+fmt.Sprint(i))); n != 2 {
			t.Fatalf("%s: %d offlines, want 2", room, n)
		}
	}
}

// A cluster sweep with nothing due reads every slot's index once.
func BenchmarkClusterIdleSweep(b *testing.B) {
	cc, _ := testredis.Cluster(b, 3)
	s := newStore(b, cc, &collector{})
	ctx := context.Background()
	if err := s.Preload(ctx); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		if _, err := s.Reap(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

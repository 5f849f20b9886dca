package bus_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/region"
)

// Redis restarts empty while a reader follows a room with snapshot +
// replay. A user whose only session was on a node that died meanwhile is
// lost with the data: nobody will announce them. The room's next
// transition opens a new epoch; following BUS.md (a new epoch: take a
// fresh snapshot) the reader ends with exactly who is there.
func TestANewEpochAfterDataLossLeavesNoGhost(t *testing.T) {
	e := newEnv(t, "eu")
	rs := testredis.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	newStore := func() *region.Store {
		st, err := region.New(rdb, region.Options{Region: "eu", Sink: e.pub, Timing: testTiming})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	live, dead := newStore(), newStore()
	startReaper(t, live)
	startService(t, e, live)
	c := context.Background()
	stay := ref("room", "stay", "tab")
	if _, err := live.Claim(c, []presence.SessionRef{stay}); err != nil {
		t.Fatal(err)
	}
	if _, err := dead.Claim(c, []presence.SessionRef{ref("room", "ghost", "tab")}); err != nil {
		t.Fatal(err)
	}

	client := bus.NewClient(e.nc, "eu")
	snap, err := client.Snapshot(c, "room", 0, bus.MaxLimit)
	if err != nil || snap.Total != 2 {
		t.Fatalf("snapshot: %+v %v", snap, err)
	}
	view := followRoom(t, e.js, snap, func(ctx context.Context) (presence.Snapshot, error) {
		return client.Snapshot(ctx, "room", 0, bus.MaxLimit)
	})

	rs.RestartEmpty(t)
	// The live node refreshes (restores, silently); someone joins.
	if _, err := live.Refresh(c, []presence.SessionRef{stay}); err != nil {
		t.Fatal(err)
	}
	if _, err := live.Claim(c, []presence.SessionRef{ref("room", "newbie", "tab")}); err != nil {
		t.Fatal(err)
	}
	want := []string{"newbie", "stay"}
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		return testkit.WantSlice("the reader's view", view.members(), want)
	})
}

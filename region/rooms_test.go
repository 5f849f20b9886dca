package region

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
)

// Every room with members is listed once, in order, over the pages of a
// prefix, with its count; rooms without members are not.
func TestListRoomsPagesTheRegion(t *testing.T) {
	rdb, _ := testredis.Client(t)
	listRoomsOn(t, rdb)
}

func TestListRoomsOnACluster(t *testing.T) {
	slow(t)
	cc, _ := testredis.Cluster(t, 3)
	listRoomsOn(t, cc)
}

func listRoomsOn(t *testing.T, rdb redis.UniversalClient) {
	// Nothing refreshes the sessions: the timing outlasts a slow run.
	s := newStore(t, rdb, &collector{}, func(o *Options) {
		o.Timing = presence.Timing{SessionTTL: time.Minute, Heartbeat: 15 * time.Second, OfflineGrace: 30 * time.Second,
			ReapInterval: time.Second, LastSeenInterval: 15 * time.Second}
	})
	ctx := context.Background()
	var refs []presence.SessionRef
	want := map[string]int{}
	for i := range 25 {
		room := fmt.Sprintf("team-%02d", i)
		for u := range i%3 + 1 {
			refs = append(refs, ref(room, fmt.Sprintf("u%d", u), "tab"))
		}
		want[room] = i%3 + 1
	}
	refs = append(refs, ref("other", "u1", "tab"))
	touch(t, s, refs...)
	// A room whose only member left is in the index, inside the grace, as
	// a member: it is listed; Counts agrees with Count.
	touch(t, s, ref("team-99", "gone", "tab"))
	release(t, s, ref("team-99", "gone", "tab"))
	want["team-99"] = 1

	var got []presence.RoomCount
	pages := 0
	for after := ""; ; {
		page, next, err := s.ListRooms(ctx, "team-", after, 7)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		got = append(got, page...)
		if next == "" {
			break
		}
		after = next
	}
	// 26 rooms of the prefix, 7 a page.
	if pages != 4 || len(got) != len(want) {
		t.Fatalf("%d pages, %d rooms: %v", pages, len(got), got)
	}
	for i, rc := range got {
		if want[rc.Room] != rc.Count || (i > 0 && got[i-1].Room >= rc.Room) {
			t.Fatalf("room %d: %+v, want count %d, in order: %v", i, rc, want[rc.Room], got)
		}
	}
	all, next, err := s.ListRooms(ctx, "", "", 1000)
	if err != nil || next != "" || len(all) != len(want)+1 || all[0].Room != "other" {
		t.Fatalf("all rooms: %v %q %v", all, next, err)
	}
	counts, err := s.Counts(ctx, []string{"team-01", "nowhere", "team-02", "other"})
	if err != nil || !slices.Equal(counts, []int{2, 0, 3, 1}) {
		t.Fatalf("counts: %v %v", counts, err)
	}
}

func TestListRoomsAndCountsRefuseBadInput(t *testing.T) {
	rdb, _ := testredis.Client(t)
	s := newStore(t, rdb, &collector{})
	ctx := context.Background()
	var oe *OpError
	for _, limit := range []int{0, -1, MaxCountsRead + 1} {
		if _, _, err := s.ListRooms(ctx, "", "", limit); !errors.As(err, &oe) {
			t.Errorf("limit %d: %v", limit, err)
		}
	}
	if _, err := s.Counts(ctx, []string{"ok", "a.b"}); !errors.As(err, &oe) {
		t.Errorf("bad room: %v", err)
	}
	if _, err := s.Counts(ctx, make([]string, MaxCountsRead+1)); !errors.As(err, &oe) {
		t.Errorf("too many rooms: %v", err)
	}
	if n, err := s.Counts(ctx, nil); err != nil || len(n) != 0 {
		t.Errorf("no rooms: %v %v", n, err)
	}
}

package region

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
)

// longTiming keeps a test's sessions alive while it reads them.
func longTiming(o *Options) {
	o.Timing = presence.Timing{SessionTTL: time.Minute, Heartbeat: 10 * time.Second, OfflineGrace: 30 * time.Second,
		ReapInterval: 100 * time.Millisecond, LastSeenInterval: 10 * time.Second}
}

// A small room's transaction reads what snapshot.lua reads, page by page:
// members of two holders, second tabs, states (escaped ones too), released
// sessions in their grace, dead entries not yet reaped, states in format
// 3 (read as such by a build of that format), empty rooms.
func TestASmallRoomsTransactionReadsWhatTheScriptReads(t *testing.T) {
	rdb, _ := testredis.Client(t)
	ctx := context.Background()
	a := newStore(t, rdb, &collector{}, longTiming)
	// b's sessions last longer: z's order by until is not user id order.
	b := newStore(t, rdb, &collector{}, longTiming, func(o *Options) { o.Timing.SessionTTL = 3 * time.Minute })
	rng := rand.New(rand.NewPCG(7, 11))
	states := []string{`{"typing":true}`, `{"html":"<b>&</b>"}`, `"é"`, `[1,2,3]`, `{"n":null}`}
	const rooms = 12
	for r := range rooms {
		room := fmt.Sprintf("room%d", r)
		for u := range rng.IntN(40) {
			user := fmt.Sprintf("u%03d", rng.IntN(1000))
			for tab := range 1 + rng.IntN(3) {
				ref := presence.SessionRef{Room: room, User: user, Session: fmt.Sprintf("t%d", tab)}
				st := []*Store{a, b}[(u+tab)%2]
				if _, err := st.Claim(ctx, []presence.SessionRef{ref}); err != nil {
					t.Fatal(err)
				}
				if rng.IntN(3) == 0 {
					if _, err := st.SetState(ctx, ref, json.RawMessage(states[rng.IntN(len(states))])); err != nil {
						t.Fatal(err)
					}
				}
				if rng.IntN(5) == 0 {
					if err := st.Release(ctx, ref); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		if r%3 == 1 {
			// A state in format 3, which a build reading it strips.
			ref := presence.SessionRef{Room: room, User: "fmt3", Session: "t0"}
			if _, err := a.Claim(ctx, []presence.SessionRef{ref}); err != nil {
				t.Fatal(err)
			}
			rdb.HSet(ctx, a.roomKeys(room).st, "fmt3:t0", state3+`{"f":3}`)
		}
		if r%3 == 0 {
			// Dead entries a reaper has not come to yet: left off by both.
			k := a.roomKeys(room)
			rdb.ZAdd(ctx, k.z, redis.Z{Score: 1e9, Member: "zz-dead"})
			rdb.ZAdd(ctx, k.s, redis.Z{Score: 1e9, Member: "zz-dead:x!"}, redis.Z{Score: 1e9, Member: "u001:gone!"})
		}
	}
	pages := [][2]int{{0, 1000}, {0, 3}, {2, 5}, {7, 1}, {100, 10}}
	for r := range rooms + 1 { // and a room that does not exist
		room := fmt.Sprintf("room%d", r)
		for _, pg := range pages {
			want, err := a.snapshotScript(ctx, presence.Snapshot{Region: "eu", Room: room, Offset: pg[0]}, pg[1])
			if err != nil {
				t.Fatal(err)
			}
			a.small.note(room, true, time.Now())
			got, ok, err := a.snapshotTx(ctx, room, pg[0], pg[1])
			if err != nil || !ok {
				t.Fatalf("%s %v: transaction read: ok %v, %v", room, pg, ok, err)
			}
			if d := got.At.Sub(want.At); d < 0 || d > time.Second {
				t.Errorf("%s %v: at %v after the script's %v", room, pg, got.At, want.At)
			}
			got.At, want.At = time.Time{}, time.Time{}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s %v:\ntransaction %+v\nscript      %+v", room, pg, got, want)
			}
		}
	}
}

// A room's first read is the script's; a whole small room it read is
// marked, and read by a transaction from then on. A room with a member
// index (past 512 entries) is the script's again, and unmarked.
func TestOnlyRoomsFoundSmallAreReadByATransaction(t *testing.T) {
	rdb, _ := testredis.Client(t)
	ctx := context.Background()
	s := newStore(t, rdb, &collector{}, longTiming)
	claim := func(room string, n int) {
		refs := make([]presence.SessionRef, n)
		for i := range refs {
			refs[i] = presence.SessionRef{Room: room, User: fmt.Sprintf("u%04d", i), Session: "s"}
		}
		for len(refs) > 0 {
			k := min(len(refs), 100)
			if _, err := s.Claim(ctx, refs[:k]); err != nil {
				t.Fatal(err)
			}
			refs = refs[k:]
		}
	}
	claim("small", 10)
	if s.small.marked("small", time.Now()) {
		t.Fatal("marked before any read")
	}
	if _, err := s.Snapshot(ctx, "small", 0, 1000); err != nil {
		t.Fatal(err)
	}
	if !s.small.marked("small", time.Now()) {
		t.Fatal("a whole room of 10 read by the script is not marked small")
	}
	if _, ok, err := s.snapshotTx(ctx, "small", 0, 1000); err != nil || !ok {
		t.Fatalf("a marked room: ok %v, %v", ok, err)
	}
	claim("small", 600) // the room keeps a member index now
	snap, ok, err := s.snapshotTx(ctx, "small", 0, 1000)
	if err != nil || ok {
		t.Fatalf("a room with a member index read by a transaction: ok %v, %v", ok, err)
	}
	if s.small.marked("small", time.Now()) {
		t.Fatal("a room with a member index is still marked small")
	}
	if snap, err = s.Snapshot(ctx, "small", 0, 1000); err != nil || snap.Total != 600 || len(snap.Members) != 600 {
		t.Fatalf("the script's read after: total %d, %d members, %v", snap.Total, len(snap.Members), err)
	}
	if s.small.marked("small", time.Now()) {
		t.Fatal("a room of 600 sessions marked small")
	}
}

// Marks run out after txMarkFor and start over past txMarks rooms.
func TestSmallRoomMarksAreBounded(t *testing.T) {
	var m smallRooms
	t0 := time.Unix(1000, 0)
	m.note("a", true, t0)
	if !m.marked("a", t0.Add(txMarkFor-time.Millisecond)) || m.marked("a", t0.Add(txMarkFor)) {
		t.Fatal("a mark's life is not txMarkFor")
	}
	for i := range txMarks {
		m.note(fmt.Sprint(i), true, t0)
	}
	if len(m.at) > txMarks {
		t.Fatalf("%d marks kept, at most %d", len(m.at), txMarks)
	}
	m.note("b", false, t0)
	if m.marked("b", t0) {
		t.Fatal("an unmarked room is marked")
	}
}

// A page reaches to the room's end whatever the limit: offset + limit
// may not fit an int.
func TestATransactionsPageTakesAnyLimit(t *testing.T) {
	zs := []redis.Z{{Score: 100, Member: "c"}, {Score: 100, Member: "a"}, {Score: 100, Member: "b"}, {Score: 1, Member: "dead"}}
	snap := txSnapshot("eu", "r", 1, math.MaxInt, 50_000, 50, []any{"7"}, zs, nil, nil)
	if snap.Total != 3 || len(snap.Members) != 2 || snap.Members[0].User != "b" || snap.Members[1].User != "c" || snap.RoomSeq != 7 {
		t.Fatalf("page from 1 of a, b, c: %+v", snap)
	}
}

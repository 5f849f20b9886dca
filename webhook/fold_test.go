package webhook

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/region"
)

// A receiver that folds the webhook events (online adds the user,
// offline removes them) ends with exactly the membership a fresh
// snapshot shows, over a seeded random schedule of joins, clean closes
// (announced after the grace) and sessions left to expire, on a real
// regional store, its stream and its reaper.
func TestFoldEqualsSnapshot(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	e := newEnv(t, "eu")
	rs := testredis.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	st, err := region.New(rdb, region.Options{Region: "eu", Sink: e.pub["eu"], Timing: testkit.Timing})
	if err != nil {
		t.Fatal(err)
	}
	r := newReceiver(t)
	ep := endpoint("fold", r.srv.URL)
	ep.BatchSize = 7
	e.dispatcher(config(t, ep))
	waitLanes(t, e, "fold", "eu")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go st.RunReaper(ctx)
	held := newHeldSessions(ctx, st)
	rooms := []string{"r0", "r1", "r2"}
	for range 120 {
		ref := presence.SessionRef{Room: rooms[rng.IntN(len(rooms))], User: fmt.Sprintf("u%d", rng.IntN(8)), Session: "s"}
		switch op := rng.IntN(3); {
		case !held.has(ref):
			if _, err := st.Claim(ctx, []presence.SessionRef{ref}); err != nil {
				t.Fatal(err)
			}
			held.add(ref)
		case op == 0:
			held.drop(ref) // its node stops refreshing: it expires
		default:
			held.drop(ref)
			if err := st.Release(ctx, ref); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond)
	}
	// First the store settles on the truth (the sessions still held:
	// closes past their grace, dropped ones expired and reaped), then the
	// receiver's fold must equal its snapshots.
	snapshot := func(room string) []string {
		snap, err := st.Snapshot(ctx, room, 0, 1000)
		if err != nil {
			return nil
		}
		var users []string
		for _, m := range snap.Members {
			users = append(users, m.User)
		}
		return users
	}
	testkit.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		for _, room := range rooms {
			if err := testkit.WantSlice(room+"'s snapshot (the sessions held)", snapshot(room), held.users(room)); err != nil {
				return err
			}
		}
		return nil
	})
	testkit.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		for _, room := range rooms {
			if err := testkit.WantSlice(room+"'s fold (its snapshot)", fold(r, room), snapshot(room)); err != nil {
				return err
			}
		}
		return nil
	})
	for _, it := range r.accepted() {
		if it["kind"] == KindResync {
			t.Errorf("a resync marker without a gap or a new epoch: %v", it)
		}
	}
}

// fold applies the accepted events of room, each id once, and returns
// the members, sorted.
func fold(r *receiver, room string) []string {
	seen := map[any]bool{}
	members := map[string]bool{}
	for _, ev := range r.events() {
		if ev["room"] != room || seen[ev["id"]] {
			continue
		}
		seen[ev["id"]] = true
		switch presence.Kind(ev["kind"].(string)) {
		case presence.Online:
			members[ev["user"].(string)] = true
		case presence.Offline:
			delete(members, ev["user"].(string))
		}
	}
	var out []string
	for u := range members {
		out = append(out, u)
	}
	slices.Sort(out)
	return out
}

// heldSessions are the sessions a node refreshes every heartbeat.
type heldSessions struct {
	mu   sync.Mutex
	refs map[presence.SessionRef]bool
}

func newHeldSessions(ctx context.Context, st *region.Store) *heldSessions {
	h := &heldSessions{refs: map[presence.SessionRef]bool{}}
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(testkit.Timing.Heartbeat):
			}
			h.mu.Lock()
			var refs []presence.SessionRef
			for r := range h.refs {
				refs = append(refs, r)
			}
			h.mu.Unlock()
			if len(refs) > 0 {
				_, _ = st.Refresh(ctx, refs)
			}
		}
	}()
	return h
}

func (h *heldSessions) has(r presence.SessionRef) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.refs[r]
}

func (h *heldSessions) add(r presence.SessionRef) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.refs[r] = true
}

func (h *heldSessions) drop(r presence.SessionRef) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.refs, r)
}

// users returns the users holding a session in room, sorted.
func (h *heldSessions) users(room string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for r := range h.refs {
		if r.Room == room {
			out = append(out, r.User)
		}
	}
	slices.Sort(out)
	return out
}

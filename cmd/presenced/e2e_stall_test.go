package main

import (
	"cmp"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/presence"
)

// A stalled node (SIGSTOP: a long GC pause, CPU starvation, a paused VM)
// looks dead to the region: it writes nothing. A session unrefreshed for
// a heartbeat and a half does not hold its user against a clean close,
// so a user whose other tab, on a live node, closes during the stall may
// be announced offline although their tab on the stalled node is fine;
// the node's first heartbeat after the stall brings them back (online).
// This test measures that cost with real processes, and checks what must
// hold whatever the stall: users whose other tab stays are never
// announced offline, every offline is followed by the user's online
// again, no update leaves a member with no session, and the room ends
// with every user on their stalled-node tab.
//
// Groups of users, each with a tab on the node that stalls:
//   - closing: a second tab on the other node closes during the stall,
//     the closes spread evenly over it;
//   - alone: no other tab (the stall itself: sessions expire if it
//     outlasts TTL - heartbeat);
//   - kept: a second tab on the other node that stays open.
//
// CI runs 20 users a group at timing B (the oracle's: TTL 4.5s, heartbeat
// 1.5s, grace 1.2s, reap 250ms) for 1.5 and 2.5 heartbeats;
// PRESENCE_STALL_USERS=N sets the group size and PRESENCE_STALL_TIMING=ab
// runs timing A (TTL 3s, heartbeat 1s, grace 1.5s) too: the figures of
// docs/RELIABILITY.md, "A stalled node".
func TestE2EStalledNode(t *testing.T) {
	skipIfShort(t, "stalls a node for seconds")
	n := 20
	if v, err := strconv.Atoi(os.Getenv("PRESENCE_STALL_USERS")); err == nil && v > 0 {
		n = v
	}
	timings := []stallTiming{stallB}
	if strings.Contains(os.Getenv("PRESENCE_STALL_TIMING"), "a") {
		timings = append([]stallTiming{stallA}, timings...)
	}
	for _, tm := range timings {
		for _, beats := range []float64{1.5, 2.5} {
			t.Run(fmt.Sprintf("%s/stall=%.1fbeats", tm.name, beats), func(t *testing.T) {
				r := runStall(t, tm, time.Duration(beats*float64(tm.beat)), n)
				t.Logf("timing %s (ttl %v, heartbeat %v, grace %v, reap %v), stall %v (%.1f heartbeats), %d users a group:\n%s",
					tm.name, tm.ttl, tm.beat, tm.grace, tm.reap, r.stall, beats, n, r)
			})
		}
	}
}

type stallTiming struct {
	name                   string
	ttl, beat, grace, reap time.Duration
}

var (
	stallA = stallTiming{"A", 3 * time.Second, time.Second, 1500 * time.Millisecond, 250 * time.Millisecond}
	stallB = stallTiming{"B", 4500 * time.Millisecond, 1500 * time.Millisecond, 1200 * time.Millisecond, 250 * time.Millisecond}
)

func (tm stallTiming) args() []string {
	return []string{"--session-ttl", tm.ttl.String(), "--heartbeat", tm.beat.String(),
		"--offline-grace", tm.grace.String(), "--reap-interval", tm.reap.String(), "--last-seen-interval", "3s"}
}

// stallResult is what one stall cost: per group, the users announced
// offline; for the closing group, when in the stall their tab closed.
type stallResult struct {
	stall       time.Duration
	users       int
	wrong       map[string]int            // group -> users announced offline
	reasons     map[string]map[string]int // group -> reason -> offlines
	closedAt    map[string]time.Duration  // closing user -> its close, from the stall's start
	wrongClosed []time.Duration           // those closes, for the users announced offline
}

func (r stallResult) String() string {
	var b strings.Builder
	for _, g := range []string{"closing", "alone", "kept"} {
		fmt.Fprintf(&b, "  %-8s %3d of %d users announced offline %v\n", g, r.wrong[g], r.users, r.reasons[g])
	}
	if len(r.wrongClosed) > 0 {
		sort.Slice(r.wrongClosed, func(i, j int) bool { return r.wrongClosed[i] < r.wrongClosed[j] })
		fmt.Fprintf(&b, "  closing users announced offline closed %v to %v into the stall\n",
			r.wrongClosed[0].Round(time.Millisecond), r.wrongClosed[len(r.wrongClosed)-1].Round(time.Millisecond))
	}
	return b.String()
}

// runStall stalls one of two nodes for stall while the closing group's
// other tabs close, and checks the outcome.
func runStall(t *testing.T, tm stallTiming, stall time.Duration, n int) stallResult {
	e := newEnv(t)
	a, b := e.startNode(tm.args()...), e.startNode(tm.args()...)
	w := e.watch()
	groups := map[string][]string{}
	closers := make([]*client, 0, n)
	var mu sync.Mutex
	for _, g := range []string{"closing", "alone", "kept"} {
		for i := range n {
			u := fmt.Sprintf("%s%03d", g[:1], i)
			groups[g] = append(groups[g], u)
			room := stallRoom(u)
			drain(dial(t, a.addr, u, "a"), room)
			if g != "alone" {
				c := drain(dial(t, b.addr, u, "b"), room)
				if g == "closing" {
					closers = append(closers, c)
				}
			}
		}
	}
	// Every user's online has come (so none is judged as a stall's), and
	// heartbeats spread over their period before the stall.
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		return testkit.Want("onlines before the stall", w.count(presence.Online, ""), 3*n)
	})
	time.Sleep(2 * tm.beat)
	before := len(w.All())
	start := time.Now()
	a.signal(syscall.SIGSTOP)
	res := stallResult{stall: stall, users: n, wrong: map[string]int{}, reasons: map[string]map[string]int{}, closedAt: map[string]time.Duration{}}
	var wg sync.WaitGroup
	for i, c := range closers {
		at := stall * time.Duration(i) / time.Duration(n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Until(start.Add(at)))
			c.w.SendClose(websocket.CloseNormalClosure, "")
			mu.Lock()
			res.closedAt[c.user] = time.Since(start)
			mu.Unlock()
		}()
	}
	time.Sleep(time.Until(start.Add(stall)))
	a.signal(syscall.SIGCONT)
	wg.Wait()
	// Every departure the stall or the closes can cause has come by then;
	// a stalled tab's user announced offline is online again once its
	// node refreshes (within a heartbeat of the SIGCONT, later on a loaded
	// machine).
	time.Sleep(tm.ttl + time.Second + tm.grace + 4*tm.reap)
	testkit.CheckFor(t, 3*tm.ttl, 50*time.Millisecond, func() error {
		return allBack(w.All()[before:])
	})
	judgeStall(t, w.All()[before:], groups, &res)
	wantRooms(t, b.addr, groups)
	return res
}

// inSeqOrder returns ts ordered as BUS.md tells readers to: by room,
// epoch and seq. Two nodes publish for a room (the stalled one the
// online, the other the offline before it), so arrival order is not the
// rooms' order.
func inSeqOrder(ts []presence.Transition) []presence.Transition {
	out := slices.Clone(ts)
	slices.SortStableFunc(out, func(a, b presence.Transition) int {
		return cmp.Or(strings.Compare(a.Room, b.Room), cmp.Compare(a.Epoch, b.Epoch), cmp.Compare(a.Seq, b.Seq))
	})
	return out
}

// reordered counts the users whose onlines and offlines in ts arrived
// in another order than their seqs'.
func reordered(ts []presence.Transition) int {
	last, out := map[string]uint64{}, map[string]bool{}
	for _, tr := range ts {
		if tr.Kind == presence.Update {
			continue
		}
		if tr.Seq < last[tr.User] {
			out[tr.User] = true
		}
		last[tr.User] = max(last[tr.User], tr.Seq)
	}
	return len(out)
}

// allBack reports a user whose last online or offline in ts, in seq
// order, is an offline: not yet back.
func allBack(ts []presence.Transition) error {
	last := map[string]presence.Kind{}
	seen := map[string][]string{}
	for _, tr := range inSeqOrder(ts) {
		seen[tr.User] = append(seen[tr.User], fmt.Sprintf("%s(%s) seq %d", tr.Kind, tr.Reason, tr.Seq))
		if tr.Kind != presence.Update {
			last[tr.User] = tr.Kind
		}
	}
	for u, k := range last {
		if k == presence.Offline {
			return fmt.Errorf("%s is offline, not back: %v", u, seen[u])
		}
	}
	return nil
}

// stallRooms spread the users: a node refreshes a room's sessions
// together, in one of its heartbeat slots, and the rooms' slots spread
// the users' last refreshes over the heartbeat, as in production.
const stallRooms = 10

// stallRoom is user u's room: by the number in its name.
func stallRoom(u string) string {
	i, _ := strconv.Atoi(u[1:])
	return fmt.Sprintf("stall%d", i%stallRooms)
}

// drain joins c to room, then reads and drops every frame it gets: the
// test reads the room's events from NATS.
func drain(c *client, room string) *client {
	c.join(room)
	go func() {
		for range c.frames {
		}
	}()
	return c
}

// judgeStall counts the offlines of each group and checks that each is
// followed, in seq order, by the user's online, that kept users saw none
// and that no update left a member with no session.
func judgeStall(t *testing.T, ts []presence.Transition, groups map[string][]string, res *stallResult) {
	t.Helper()
	if n := reordered(ts); n > 0 {
		t.Logf("%d users' onlines and offlines arrived out of seq order (two nodes publish for a room)", n)
	}
	ts = inSeqOrder(ts)
	for g, users := range groups {
		res.reasons[g] = map[string]int{}
		for _, u := range users {
			var kinds []presence.Kind
			for _, tr := range ts {
				if tr.User != u {
					continue
				}
				if tr.Kind == presence.Update && tr.Sessions == 0 {
					t.Errorf("%s: update %v leaves a member with no session", u, tr)
				}
				if tr.Kind == presence.Offline {
					res.reasons[g][string(tr.Reason)]++
				}
				if tr.Kind != presence.Update {
					kinds = append(kinds, tr.Kind)
				}
			}
			if len(kinds) == 0 {
				continue
			}
			res.wrong[g]++
			if g == "closing" {
				res.wrongClosed = append(res.wrongClosed, res.closedAt[u])
			}
			for i, k := range kinds {
				if want := []presence.Kind{presence.Offline, presence.Online}[i%2]; k != want || len(kinds)%2 != 0 {
					t.Errorf("%s (%s): %v, want offline then online pairs (the stalled node's tab is back)", u, g, kinds)
					break
				}
			}
		}
	}
	if res.wrong["kept"] > 0 {
		t.Errorf("%d users with a tab open on the live node throughout were announced offline", res.wrong["kept"])
	}
}

// wantRooms checks that fresh snapshots list every user with their tab
// on the stalled node only (and the kept ones with both).
func wantRooms(t *testing.T, addr string, groups map[string][]string) {
	t.Helper()
	want := map[string]string{}
	for g, users := range groups {
		for _, u := range users {
			want[u] = "a"
			if g == "kept" {
				want[u] = "a b"
			}
		}
	}
	got := map[string]string{}
	obs := dial(t, addr, "zz-observer", "obs")
	for i := range stallRooms {
		room := fmt.Sprintf("stall%d", i)
		obs.send(map[string]any{"type": "join", "room": room, "detail": "sessions", "ref": room})
		f := obs.w.Await(10*time.Second, "the observer's snapshot of "+room, func(f map[string]any) bool {
			return f["type"] == "snapshot" && f["ref"] == room
		})
		snap, _ := f["snapshot"].(map[string]any)
		members, _ := snap["members"].([]any)
		for _, m := range members {
			mm, _ := m.(map[string]any)
			var ids []string
			ss, _ := mm["sessions"].([]any)
			for _, s := range ss {
				id, _ := s.(map[string]any)["id"].(string)
				ids = append(ids, id)
			}
			sort.Strings(ids)
			if u, _ := mm["user"].(string); u != "zz-observer" {
				got[u] = strings.Join(ids, " ")
			}
		}
	}
	for u, ids := range want {
		if got[u] != ids {
			t.Errorf("%s: sessions %q after the stall, want %q", u, got[u], ids)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d members after the stall, want %d", len(got), len(want))
	}
}

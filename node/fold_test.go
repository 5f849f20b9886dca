package node

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
)

// The invariant of PROTOCOL.md's "Snapshot, then events": for every joined
// room, the view a client builds by applying events to its snapshot equals
// a fresh snapshot taken at the same point (the same room_seq), for
// membership, states and, with detail "sessions", session lists. The
// oracle below checks it for every open connection over a seeded random
// schedule of joins, second tabs, state changes, blips (the link drops and
// the tab reconnects with its session id, to either of two nodes) and
// closes, at checkpoints and once everything has settled.

// view is a room as a client keeps it: user -> session -> state ("" none).
type view map[string]map[string]string

// folder applies one connection's frames to its view of one room, the way
// PROTOCOL.md tells a client to, and records anything the protocol rules
// out (an event out of order, a join of a member, a session listed twice).
type folder struct {
	name     string
	room     string
	sessions bool // joined with detail "sessions"

	mu    sync.Mutex
	view  view
	epoch int64
	seq   uint64   // the room_seq of the snapshot, then of each event applied
	ready bool     // a snapshot came
	ended error    // why the connection ended, once it has
	snaps []string // the snapshots it took: reason@room_seq
	// batches counts events frames, batched entries their events.
	batches, batched int
	errs             []string
}

func newFolder(name, room string, sessions bool, c *client) *folder {
	f := &folder{name: name, room: room, sessions: sessions, view: view{}}
	go func() {
		for fr := range c.frames {
			f.apply(fr)
		}
		f.mu.Lock()
		f.ended = c.w.Err()
		f.mu.Unlock()
	}()
	return f
}

func (f *folder) fail(format string, args ...any) {
	f.errs = append(f.errs, fmt.Sprintf("%s (snapshots %v, view %v): ", f.name, f.snaps, f.view)+fmt.Sprintf(format, args...))
}

func (f *folder) apply(fr frame) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch fr.Type {
	case "snapshot":
		if fr.Room != f.room {
			return
		}
		f.view, f.epoch, f.seq, f.ready = view{}, fr.Snapshot.Epoch, fr.Snapshot.RoomSeq, true
		f.snaps = append(f.snaps, fmt.Sprintf("%s@%d", fr.Reason, fr.Snapshot.RoomSeq))
		for _, m := range fr.Snapshot.Members {
			ss := map[string]string{}
			for _, si := range m.Sessions {
				if !f.sessions && len(si.State) == 0 {
					f.fail("a snapshot without detail lists session %s/%s, which has no state", m.User, si.ID)
				}
				if _, dup := ss[si.ID]; dup {
					f.fail("session %s/%s listed twice", m.User, si.ID)
				}
				ss[si.ID] = string(si.State)
			}
			f.view[m.User] = ss
		}
	case "event":
		f.event(fr.Event, fr.raw)
	case "events":
		if fr.Room != f.room {
			return
		}
		if len(fr.Events) == 0 {
			f.fail("an events frame without events: %s", fr.raw)
		}
		f.batches++
		f.batched += len(fr.Events)
		for _, raw := range fr.Events {
			e, err := decodeEntry(fr, raw)
			if err != nil {
				f.fail("%v", err)
				continue
			}
			f.event(e, string(raw))
		}
	case "error":
		f.fail("error frame %s", fr.raw)
	}
}

// decodeEntry reads one entry of an events frame as the event it stands
// for (docs/PROTOCOL.md, "Batched events").
func decodeEntry(fr frame, raw json.RawMessage) (bus.Event, error) {
	t, err := protocol.DecodeEntry(&protocol.Events{Room: fr.Room, Region: fr.Region, Epoch: fr.Epoch}, raw)
	return bus.Event{Room: t.Room, Region: t.Region, Epoch: t.Epoch, Seq: t.Seq, Kind: t.Kind, Reason: t.Reason,
		User: t.User, Session: t.Session, Sessions: t.Sessions, State: t.State}, err
}

func (f *folder) event(e bus.Event, raw string) {
	if e.Room != f.room || !f.ready {
		f.fail("event before the room's snapshot: %s", raw)
		return
	}
	if e.Epoch != f.epoch || e.Seq <= f.seq {
		f.fail("event %d/%d after %d/%d: out of order or repeated", e.Epoch, e.Seq, f.epoch, f.seq)
	}
	f.seq = e.Seq
	ss, member := f.view[e.User]
	switch {
	case e.Kind == presence.Online:
		if member {
			f.fail("online of a member: %s", raw)
		}
		ss = map[string]string{}
		if f.sessions {
			ss[e.Session] = ""
		}
		f.view[e.User] = ss
	case e.Kind == presence.Offline:
		if !member {
			f.fail("offline of a non-member: %s", raw)
		}
		delete(f.view, e.User)
	case !member:
		f.fail("update of a non-member: %s", raw)
	case e.Reason == presence.State:
		if _, listed := ss[e.Session]; f.sessions && !listed {
			f.fail("state of an unlisted session: %s", raw)
		}
		if !f.sessions && len(e.State) == 0 {
			delete(ss, e.Session)
		} else {
			ss[e.Session] = string(e.State)
		}
	case e.Reason == presence.Joined:
		if _, listed := ss[e.Session]; !f.sessions || listed {
			f.fail("a new session's update, listed %v, detail sessions %v: %s", listed, f.sessions, raw)
		}
		ss[e.Session] = ""
	case e.Reason == presence.Left || e.Reason == presence.Expired:
		if _, listed := ss[e.Session]; f.sessions && !listed {
			f.fail("end of an unlisted session: %s", raw)
		}
		delete(ss, e.Session)
	default:
		f.fail("unknown update: %s", raw)
	}
}

// project is snap as a client at the given detail keeps it.
func project(snap presence.Snapshot, sessions bool) view {
	v := view{}
	for _, m := range snap.Members {
		ss := map[string]string{}
		for _, si := range m.Sessions {
			if sessions || len(si.State) > 0 {
				ss[si.ID] = string(si.State)
			}
		}
		v[m.User] = ss
	}
	return v
}

func (v view) String() string {
	var b strings.Builder
	for _, u := range slices.Sorted(maps.Keys(v)) {
		fmt.Fprintf(&b, "%s{", u)
		for _, s := range slices.Sorted(maps.Keys(v[u])) {
			fmt.Fprintf(&b, "%s=%s ", s, v[u][s])
		}
		b.WriteString("} ")
	}
	return b.String()
}

// tab is one browser tab of the schedule: a user and a session id kept
// across reconnects, its state, and its connection while it has one.
type tab struct {
	user, session string
	state         string // "" none
	c             *client
	f             *folder
}

type foldRun struct {
	t     *testing.T
	e     *env
	nodes []*node
	rng   *rand.Rand
	room  string
	tabs  []*tab
	// observers stay connected throughout, one at each detail.
	observers []*folder
}

var foldStates = []string{"", `"away"`, `"here"`, `{"typing":true}`}

func TestFoldedViewsEqualFreshSnapshots(t *testing.T) {
	if testing.Short() {
		t.Skip("a random schedule of a few hundred steps")
	}
	seeds := []uint64{1, 2}
	if s := os.Getenv("PRESENCE_FOLD_SEEDS"); s != "" {
		seeds = nil
		for _, f := range strings.Fields(s) {
			n, err := strconv.ParseUint(f, 10, 64)
			if err != nil {
				t.Fatalf("PRESENCE_FOLD_SEEDS: %v", err)
			}
			seeds = append(seeds, n)
		}
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			e := newEnv(t)
			// Rooms of 3 local members or more batch for the members that
			// take events frames (half of the joins ask), so both ways of
			// delivery, and the switch between them, run in the schedule.
			// Even seeds also run a budget so small that the batched
			// members take turns (a few frames a second: every 150-500
			// ms, three to ten turns).
			batched := func(c *Config) {
				c.BatchFrom, c.FanoutTick = 3, 50*time.Millisecond
				if seed%2 == 0 {
					c.FanoutBudget = 20
				}
			}
			r := &foldRun{t: t, e: e, nodes: []*node{e.newNode(batched), e.newNode(batched)}, rng: rand.New(rand.NewPCG(seed, 10)), room: "fold"}
			for u := range 4 {
				for s := range 2 {
					r.tabs = append(r.tabs, &tab{user: fmt.Sprintf("u%d", u), session: fmt.Sprintf("t%d", s)})
				}
			}
			for i, sessions := range []bool{true, false} {
				c := r.nodes[i].dial(t, token(t, fmt.Sprintf("obs%d", i), []string{"*"}, time.Hour), "o")
				r.observers = append(r.observers, r.join(c, fmt.Sprintf("observer %d", i), sessions, i == 0))
			}
			for step := range 120 {
				r.step()
				if step%15 == 14 {
					r.check("checkpoint")
				}
			}
			// Everything settles: released sessions' graces end, and each
			// ending reaches every view.
			e.waitRedisPast(e.redisNow().Add(testTiming.OfflineGrace + 2*time.Second))
			r.check("settled")
			// The batched path must have run, or the oracle proved nothing
			// of it.
			nBatches, nBatched := 0, 0
			for _, f := range append(slices.Clone(r.observers), r.allTabFolders()...) {
				f.mu.Lock()
				nBatches, nBatched = nBatches+f.batches, nBatched+f.batched
				f.mu.Unlock()
			}
			if nBatches == 0 {
				t.Fatal("no events frame reached any connection: batching never ran")
			}
			t.Logf("%d events frames carried %d events", nBatches, nBatched)
		})
	}
}

// join joins the room on c and starts folding its frames.
func (r *foldRun) join(c *client, name string, sessions, batch bool) *folder {
	req := map[string]any{"type": "join", "room": r.room, "ref": "j", "batch": batch}
	if sessions {
		req["detail"] = protocol.DetailSessions
	}
	c.send(req)
	return newFolder(name, r.room, sessions, c)
}

// open connects tab to a random node, joins at a random detail and, as a
// client does after a reconnect, sends its state again (or, half the
// time, relies on the store keeping it through the grace).
func (r *foldRun) open(tb *tab) {
	n := r.nodes[r.rng.IntN(len(r.nodes))]
	h := http.Header{}
	h.Set("Authorization", "Bearer "+token(r.t, tb.user, []string{"*"}, time.Hour))
	if r.rng.IntN(2) == 0 {
		h.Set(testkit.DeflateHeader, "1") // shared events frames come compressed
	}
	tb.c = n.dialWith(r.t, "session="+tb.session, h)
	tb.f = r.join(tb.c, tb.user+"/"+tb.session, r.rng.IntN(2) == 0, r.rng.IntN(2) == 0)
	if tb.state != "" && r.rng.IntN(2) == 0 {
		tb.c.send(map[string]any{"type": "state", "room": r.room, "state": rawJSON(tb.state), "ref": "s"})
	}
}

type rawJSON string

func (j rawJSON) MarshalJSON() ([]byte, error) {
	if j == "" {
		return []byte("null"), nil
	}
	return []byte(j), nil
}

func (r *foldRun) step() {
	tb := r.tabs[r.rng.IntN(len(r.tabs))]
	if tb.c != nil {
		tb.f.mu.Lock()
		ended := tb.f.ended
		tb.f.mu.Unlock()
		if ended != nil {
			r.t.Fatalf("%s: the node ended the connection: %v", tb.f.name, ended)
		}
	}
	switch op := r.rng.IntN(10); {
	case tb.c == nil:
		if tb.f == nil || r.rng.IntN(3) == 0 { // a closed tab opens again now and then
			r.open(tb)
		}
	case op < 4: // a state change
		tb.state = foldStates[r.rng.IntN(len(foldStates))]
		tb.c.send(map[string]any{"type": "state", "room": r.room, "state": rawJSON(tb.state), "ref": "s"})
	case op < 7: // a blip: the link drops, the tab reconnects with its session id
		_ = tb.c.ws.NetConn().Close()
		_ = tb.c.waitEnd()
		r.open(tb)
	case op < 8: // the tab closes for good (until it opens again, as a new page)
		tb.c.closeNormally()
		tb.c, tb.state = nil, ""
	default: // time passes: sometimes long enough for a grace to end
		d := time.Duration(r.rng.IntN(300)) * time.Millisecond
		if r.rng.IntN(5) == 0 {
			d = testTiming.OfflineGrace + time.Second
		}
		time.Sleep(d) // lets the schedule's clock run; nothing waits on its outcome
	}
}

// allTabFolders returns the folders of every tab that ever opened; a
// reopened tab's earlier folders are gone.
func (r *foldRun) allTabFolders() []*folder {
	var fs []*folder
	for _, tb := range r.tabs {
		if tb.f != nil {
			fs = append(fs, tb.f)
		}
	}
	return fs
}

// folders returns the folders of every open connection.
func (r *foldRun) folders() []*folder {
	fs := slices.Clone(r.observers)
	for _, tb := range r.tabs {
		if tb.c != nil {
			fs = append(fs, tb.f)
		}
	}
	return fs
}

// check waits until every open connection's view is at the point of a
// fresh snapshot and compares them there. A view that differs from the
// snapshot at the same room_seq is a violation, unless the room moves on:
// a read leaves out a session overdue by more than the read slack before
// the reaper has ended it (the reaper's event then follows), so only a
// difference that stays while the room stands still fails.
func (r *foldRun) check(when string) {
	r.t.Helper()
	var stuckSeq uint64
	var stuckSince time.Time
	err := testkit.Poll(15*time.Second, 20*time.Millisecond, func() error {
		snap, err := r.e.store.Snapshot(context.Background(), r.room, 0, 1000)
		if err != nil {
			r.t.Fatalf("%s: snapshot: %v", when, err)
		}
		joined := r.joinedSeqs()
		behind, mismatch := "", ""
		for _, f := range r.folders() {
			f.mu.Lock()
			if len(f.errs) > 0 {
				r.t.Fatalf("%s: %s\nthe room's transitions:\n%s", when, strings.Join(f.errs, "\n"), r.history())
			}
			if f.ended != nil { // the schedule ended it otherwise
				r.t.Fatalf("%s: %s: the node ended the connection: %v", when, f.name, f.ended)
			}
			at := f.ready && f.epoch == snap.Epoch && f.seq <= snap.RoomSeq
			for s := f.seq + 1; at && s <= snap.RoomSeq; s++ {
				// A client without detail is never sent a new session's
				// update: it is at the snapshot's point without it.
				at = !f.sessions && joined[s]
			}
			switch {
			case !at:
				if behind == "" {
					behind = fmt.Sprintf("%s at epoch %d room_seq %d", f.name, f.epoch, f.seq)
				}
			case mismatch == "":
				if want := project(snap, f.sessions); want.String() != f.view.String() {
					mismatch = fmt.Sprintf("%s at room_seq %d:\n view     %v\n snapshot %v", f.name, snap.RoomSeq, f.view, want)
				}
			}
			f.mu.Unlock()
		}
		switch {
		case behind == "" && mismatch == "":
			return nil
		case mismatch != "" && snap.RoomSeq != stuckSeq:
			stuckSeq, stuckSince = snap.RoomSeq, time.Now()
		case mismatch != "" && time.Since(stuckSince) > 3*time.Second:
			r.t.Fatalf("%s: a folded view differs from a fresh snapshot at the same point: %s", when, mismatch)
		}
		if mismatch != "" {
			return fmt.Errorf("a mismatch: %s", mismatch)
		}
		return fmt.Errorf("%s, behind the room's epoch %d room_seq %d", behind, snap.Epoch, snap.RoomSeq)
	})
	if err != nil {
		r.t.Fatalf("%s: views did not reach the room's point: %v", when, err)
	}
}

// joinedSeqs returns the seqs of the room's new-session updates on the
// bus.
func (r *foldRun) joinedSeqs() map[uint64]bool {
	out := map[uint64]bool{}
	for _, t := range r.e.rec.All() {
		if t.Room == r.room && t.Kind == presence.Update && t.Reason == presence.Joined {
			out[t.Seq] = true
		}
	}
	return out
}

// A tab sets a state and its link drops; it comes back inside the grace
// and does not send the state again. The state survives for every reader:
// a page open throughout saw nothing, and the tab itself and a page opened
// afterwards both see it, at either detail.
func TestStateSurvivesABlipWithoutBeingSentAgain(t *testing.T) {
	e := newEnv(t)
	n := e.newNode()
	all := []string{"*"}
	obs := n.dial(t, token(t, "obs", all, time.Hour), "o")
	obs.join("room")
	tab := n.dial(t, token(t, "amy", all, time.Hour), "tab")
	tab.join("room")
	if f := obs.expect("event"); f.Event.Kind != presence.Online || f.Event.User != "amy" {
		t.Fatalf("amy's online: %s", f.raw)
	}
	tab.send(map[string]any{"type": "state", "room": "room", "state": map[string]string{"status": "away"}, "ref": "s"})
	tab.replyAndOwnEvent("state_set", presence.Update)
	if f := obs.expect("event"); f.Event.Kind != presence.Update || string(f.Event.State) != `{"status":"away"}` {
		t.Fatalf("amy's state: %s", f.raw)
	}

	_ = tab.ws.NetConn().Close()                                                                                                                                  // the link drops
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.Want("sessions held, the dropped link released", n.keeper.held(), 1) }) // obs's
	tab = n.dial(t, token(t, "amy", all, time.Hour), "tab")
	for _, snap := range []presence.Snapshot{tab.join("room").Snapshot, tab.joinDetail("room", "").Snapshot} {
		if s := findSession(snap, "amy", "tab"); string(s.State) != `{"status":"away"}` {
			t.Fatalf("amy's own view after the blip: %+v", snap)
		}
	}
	fresh := n.dial(t, token(t, "fay", all, time.Hour), "f")
	if s := findSession(fresh.joinDetail("room", "").Snapshot, "amy", "tab"); string(s.State) != `{"status":"away"}` {
		t.Fatal("a page opened after the blip does not see amy away")
	}
	if f := obs.expect("event"); f.Event.User != "fay" || f.Event.Kind != presence.Online {
		t.Fatalf("the page open throughout: %s, want only fay's online", f.raw)
	}
	e.waitRedisPast(e.redisNow().Add(testTiming.OfflineGrace + time.Second + 2*testTiming.ReapInterval))
	e.quiesce("room")
	if ts := e.rec.Of("", "room", "amy"); len(ts) != 2 || ts[0].Kind != presence.Online || ts[1].Reason != presence.State {
		t.Fatalf("amy's transitions: %v, want her online and her one state", ts)
	}
}

// history lists the room's transitions on the bus, for a failure report.
func (r *foldRun) history() string {
	var b strings.Builder
	for _, t := range r.e.rec.All() {
		if t.Room == r.room {
			fmt.Fprintf(&b, "  %s session=%s at=%s\n", t, t.Session, t.At.Format("15:04:05.000"))
		}
	}
	return b.String()
}

package global

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/presence-dev/presence/presence"
)

// The decision rules, on a core driven by hand-made publications and an
// explicit clock.

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

type coreRig struct {
	t    *testing.T
	c    *core
	now  time.Time
	gen  map[string]uint64
	seq  map[string]uint64
	next uint64 // stream sequence of the next applied transition
	all  []intent
}

func newRig(t *testing.T, regions ...string) *coreRig {
	cfg := AggregatorConfig{
		Cadence: 100 * time.Millisecond, Grace: 300 * time.Millisecond,
		DownAfter: 500 * time.Millisecond, DropAfter: 2 * time.Second, Regions: regions,
	}
	return &coreRig{t: t, c: newCore(cfg, t0, &AggregatorStats{}), now: t0, gen: map[string]uint64{}, seq: map[string]uint64{}}
}

// full sends a one-part full snapshot of region as a new publisher
// generation when gen is true.
func (r *coreRig) full(region string, view regionView, newGen bool) []intent {
	if newGen || r.gen[region] == 0 {
		r.gen[region]++
	}
	r.seq[region]++
	touched, _ := r.c.publication(&publication{V: 1, Kind: kindFull, Region: region, Gen: r.gen[region], Inst: "i", Seq: r.seq[region], Part: 1, Parts: 1, Rooms: view.Ops()}, r.now)
	return r.settle(touched)
}

func (r *coreRig) delta(region string, ops ...roomOps) []intent {
	r.seq[region]++
	touched, ask := r.c.publication(&publication{V: 1, Kind: kindDelta, Region: region, Gen: r.gen[region], Inst: "i", Seq: r.seq[region], Rooms: ops}, r.now)
	if ask {
		r.t.Fatalf("delta %d of %s asked for a resync", r.seq[region], region)
	}
	return r.settle(touched)
}

// advance moves the clock, keeping the given regions alive with empty
// deltas every cadence, and returns what the ticks called for.
func (r *coreRig) advance(d time.Duration, alive ...string) []intent {
	var out []intent
	for end := r.now.Add(d); r.now.Before(end); {
		r.now = r.now.Add(25 * time.Millisecond)
		if r.now.Sub(t0)%(100*time.Millisecond) == 0 {
			for _, reg := range alive {
				out = append(out, r.delta(reg)...)
			}
		}
		out = append(out, r.settle(r.c.tick(r.now))...)
	}
	return out
}

// settle evaluates and applies the intents as the leader would.
func (r *coreRig) settle(touched touchSet) []intent {
	its := r.c.evaluate(touched, r.now)
	for _, it := range its {
		epoch, seq := r.c.ann.next(it.room, r.now)
		r.next++
		t := presence.Transition{Room: it.room, User: it.user, Kind: it.kind, Epoch: epoch, Seq: seq, Session: it.session}
		if it.state != "" {
			t.State = []byte(it.state)
		}
		r.c.ann.apply(t, r.next, r.now)
		if it.kind == presence.Offline {
			r.c.forget(it.room, it.user)
		}
	}
	r.all = append(r.all, its...)
	return its
}

func set(room string, users map[string][]string) roomOps { return roomOps{Room: room, Set: users} }
func del(room string, users ...string) roomOps           { return roomOps{Room: room, Del: users} }

func want(t *testing.T, what string, got []intent, want ...string) {
	t.Helper()
	var g []string
	for _, it := range got {
		line := fmt.Sprintf("%s %s/%s %s %d", it.kind, it.room, it.user, it.reason, it.sessions)
		if it.kind == presence.Update {
			line += fmt.Sprintf(" %s=%s", it.session, it.state)
		}
		g = append(g, line)
	}
	if !slices.Equal(g, want) {
		t.Fatalf("%s: got %q, want %q", what, g, want)
	}
}

func TestCoreJoinLeaveAfterGrace(t *testing.T) {
	r := newRig(t, "eu")
	want(t, "empty full", r.full("eu", regionView{}, false))
	want(t, "join", r.delta("eu", set("r", map[string][]string{"u1": {"s1"}})), "online r/u1 joined 1")
	want(t, "refresh of the same", r.delta("eu", set("r", map[string][]string{"u1": {"s1"}})))
	want(t, "leave", r.delta("eu", del("r", "u1")))
	want(t, "inside the grace", r.advance(275*time.Millisecond, "eu"))
	want(t, "grace over", r.advance(50*time.Millisecond, "eu"), "offline r/u1 left 0")
	want(t, "nothing more", r.advance(time.Second, "eu"))
}

func TestCoreRegionMoveIsANonEvent(t *testing.T) {
	r := newRig(t, "eu", "ap")
	r.full("eu", regionView{"r": {"u1": {"s1"}}}, false)
	r.full("ap", regionView{}, false)
	want(t, "history", r.all, "online r/u1 joined 1")
	want(t, "leaves eu", r.delta("eu", del("r", "u1")))
	want(t, "in between", r.advance(200*time.Millisecond, "eu", "ap"))
	want(t, "appears in ap with the same session", r.delta("ap", set("r", map[string][]string{"u1": {"s1"}})))
	want(t, "afterwards", r.advance(time.Second, "eu", "ap"))
	if got := r.c.sessions("r", "u1"); !slices.Equal(got, []string{"s1"}) {
		t.Fatalf("sessions %v", got)
	}
}

func TestCoreTwoTabsInTwoRegionsAreOneMember(t *testing.T) {
	r := newRig(t, "eu", "ap")
	r.full("eu", regionView{"r": {"u1": {"tab1"}}}, false)
	want(t, "second tab elsewhere", r.full("ap", regionView{"r": {"u1": {"tab2"}}}, false))
	want(t, "history", r.all, "online r/u1 joined 1")
	if got := r.c.sessions("r", "u1"); !slices.Equal(got, []string{"tab1", "tab2"}) {
		t.Fatalf("sessions %v", got)
	}
	// The same session seen in both during a handover counts once.
	r.delta("ap", set("r", map[string][]string{"u1": {"tab1", "tab2"}}))
	if got := r.c.sessions("r", "u1"); !slices.Equal(got, []string{"tab1", "tab2"}) {
		t.Fatalf("sessions %v", got)
	}
	want(t, "one tab closes", r.delta("eu", del("r", "u1")))
	want(t, "still there", r.advance(time.Second, "eu", "ap"))
}

func TestCoreGraceMemberCountsAsPresent(t *testing.T) {
	r := newRig(t, "eu")
	r.full("eu", regionView{"r": {"u1": {"s1"}}}, false)
	want(t, "regional grace: no sessions", r.delta("eu", set("r", map[string][]string{"u1": {}})))
	want(t, "held by the regional grace", r.advance(time.Second, "eu"))
	if !r.c.ann.member("r", "u1") {
		t.Fatal("u1 not a member")
	}
}

func TestCoreDownRegionIsHeldThenDropped(t *testing.T) {
	r := newRig(t, "eu", "ap")
	r.full("eu", regionView{"r": {"only-eu": {"s1"}, "both": {"s2"}}}, false)
	r.full("ap", regionView{"r": {"both": {"s3"}}}, false)
	r.all = nil
	// eu falls silent: down after 500ms (held), dropped after 2s.
	want(t, "down but held", r.advance(1900*time.Millisecond, "ap"))
	if s := r.c.state(r.c.regions["eu"], r.now); s != RegionDown {
		t.Fatalf("eu is %s", s)
	}
	want(t, "dropped", r.advance(200*time.Millisecond, "ap"), "offline r/only-eu region_lost 0")
	want(t, "nothing more", r.advance(time.Second, "ap"))
	// eu comes back: a full from its publisher.
	want(t, "heal", r.full("eu", regionView{"r": {"only-eu": {"s1"}, "both": {"s2"}}}, false), "online r/only-eu joined 1")
	want(t, "settled", r.advance(time.Second, "eu", "ap"))
}

func TestCoreHeldRegionBringsNobodyOnline(t *testing.T) {
	r := newRig(t, "eu")
	r.full("eu", regionView{}, false)
	r.advance(600 * time.Millisecond) // eu is down now
	// A delta still in order (it was late): applied, but eu is not live
	// until heard again... it is heard by this very delta.
	want(t, "late delta revives", r.delta("eu", set("r", map[string][]string{"u1": {"s1"}})), "online r/u1 joined 1")
	// A region out of sync is held: its users neither come nor go.
	r.seq["eu"]++ // a lost delta
	touched, ask := r.c.publication(&publication{V: 1, Kind: kindDelta, Region: "eu", Gen: r.gen["eu"], Inst: "i", Seq: r.seq["eu"] + 1, Rooms: []roomOps{del("r", "u1"), set("r", map[string][]string{"u2": {"s2"}})}}, r.now)
	if !ask || len(touched) != 0 {
		t.Fatalf("gap: ask %v touched %v", ask, touched)
	}
	want(t, "held while out of sync", r.advance(400*time.Millisecond))
	if r.c.stats.Gaps.Load() != 1 {
		t.Fatalf("gaps %d", r.c.stats.Gaps.Load())
	}
	want(t, "resynced", r.full("eu", regionView{"r": {"u2": {"s2"}}}, false), "online r/u2 joined 1")
	want(t, "u1 left while we were out of sync", r.advance(400*time.Millisecond, "eu"), "offline r/u1 left 0")
}

// pub sends one publication as any publisher would, forged or not.
func (r *coreRig) pub(region string, gen uint64, inst, kind string, seq uint64, ops ...roomOps) (touchSet, bool) {
	p := &publication{V: 1, Kind: kind, Region: region, Gen: gen, Inst: inst, Seq: seq, Rooms: ops}
	if kind == kindFull {
		p.Part, p.Parts = 1, 1
	}
	return r.c.publication(p, r.now)
}

// A region's current publisher keeps it while it publishes: another one,
// whatever its generation, is ignored until the current one has been
// silent for two cadences (a real successor only starts once its
// predecessor's lease ran out, so it never waits longer than that).
func TestCoreGenerations(t *testing.T) {
	r := newRig(t, "eu")
	r.full("eu", regionView{"r": {"u1": {"s1"}}}, false)
	old := r.gen["eu"]
	// A newer generation while the current publisher speaks: ignored,
	// and nobody is asked for anything.
	touched, ask := r.pub("eu", old+1, "new", kindFull, 1, set("r", map[string][]string{"u2": {"s2"}}))
	if touched != nil || ask {
		t.Fatalf("a second publisher displaced a live one: %v %v", touched, ask)
	}
	// The current one stops (its node died): two cadences later its
	// successor's delta shows a gap, and its full takes the region over.
	want(t, "silent for less than two cadences", r.advance(175*time.Millisecond))
	if touched, _ := r.pub("eu", old+1, "new", kindDelta, 2); touched != nil {
		t.Fatal("a delta of the successor applied before its full")
	}
	r.advance(50 * time.Millisecond)
	if _, ask := r.pub("eu", old+1, "new", kindDelta, 3); !ask {
		t.Fatal("the successor was not asked for a full once its predecessor fell silent")
	}
	touched, _ = r.pub("eu", old+1, "new", kindFull, 4, set("r", map[string][]string{"u1": {"s1"}, "u2": {"s2"}}))
	want(t, "the successor's full", r.settle(touched), "online r/u2 joined 1")
	// The old publisher's late delta is ignored now: the successor speaks.
	if touched, ask := r.pub("eu", old, "i", kindDelta, 99, del("r", "u2")); touched != nil || ask {
		t.Fatalf("the predecessor's late delta applied: %v %v", touched, ask)
	}
	if r.c.stats.Contenders.Load() != 3 {
		t.Fatalf("contenders %d, want 3", r.c.stats.Contenders.Load())
	}
}

// A full from a generation far ahead, forged or from a publisher gone
// astray, never locks the real publisher out: while the real one
// publishes it is ignored, and if it got in while the real one was
// silent, the real one takes the region back once it stops.
func TestCoreFarAheadGenerationLocksNobodyOut(t *testing.T) {
	const far = 1 << 62
	r := newRig(t, "eu")
	r.full("eu", regionView{"r": {"u1": {"s1"}}}, false)
	touched, _ := r.pub("eu", far, "forger", kindFull, 1, set("r", map[string][]string{"ghost": {"g"}}))
	want(t, "forged full while eu publishes", r.settle(touched))
	want(t, "eu goes on", r.advance(time.Second, "eu"))

	// The real publisher falls silent; the forger gets in...
	r.advance(200 * time.Millisecond)
	touched, _ = r.pub("eu", far, "forger", kindFull, 2, set("r", map[string][]string{"ghost": {"g"}}))
	want(t, "forger in", r.settle(touched), "online r/ghost joined 1")
	// ...and says nothing more. The real publisher, many generations
	// behind, is ignored for two cadences, then asked, then back.
	var asked bool
	for seq := r.seq["eu"] + 1; !asked; seq++ {
		r.advance(100 * time.Millisecond)
		if r.now.Sub(t0) > time.Minute {
			t.Fatal("the real publisher was never asked for a full")
		}
		_, asked = r.pub("eu", r.gen["eu"], "i", kindDelta, seq)
		r.seq["eu"] = seq
	}
	want(t, "the real full", r.full("eu", regionView{"r": {"u1": {"s1"}}}, false))
	want(t, "the ghost leaves after the grace", r.advance(400*time.Millisecond, "eu"), "offline r/ghost left 0")
	if got := r.c.regions["eu"]; got.gen != r.gen["eu"] || got.inst != "i" {
		t.Fatalf("eu's publisher is %d/%s", got.gen, got.inst)
	}
}

// With Regions set, a publication of any other region is dropped: no
// state, no transition, no resync request.
func TestCoreDropsUnlistedRegions(t *testing.T) {
	r := newRig(t, "eu")
	touched, ask := r.pub("xx", 1, "i", kindFull, 1, set("r", map[string][]string{"u1": {"s1"}}))
	if touched != nil || ask || r.c.regions["xx"] != nil || r.c.stats.UnknownRegions.Load() != 1 {
		t.Fatalf("unlisted region taken: %v %v %v", touched, ask, r.c.regions["xx"])
	}
	if _, ask := r.pub("xx", 1, "i", kindDelta, 5); ask {
		t.Fatal("an unlisted region's gap asked for a full")
	}
	// Without a list, any region is taken.
	open := newRig(t)
	want(t, "no list", open.full("xx", regionView{"r": {"u1": {"s1"}}}, false), "online r/u1 joined 1")
}

// A full is held while its parts arrive, within MaxFullBytes and for at
// most DownAfter; past either it is dropped and its memory freed.
func TestCoreBoundsFulls(t *testing.T) {
	r := newRig(t, "eu")
	r.full("eu", regionView{"r": {"u1": {"s1"}}}, false)
	r.c.maxFullBytes = 1000
	part := func(part, parts int, seq uint64, size int, user string) (touchSet, bool) {
		p := &publication{V: 1, Kind: kindFull, Region: "eu", Gen: r.gen["eu"], Inst: "i", Seq: seq, Part: part, Parts: parts,
			Rooms: []roomOps{set("r", map[string][]string{user: {"s"}})}, size: size}
		return r.c.publication(p, r.now)
	}
	eu := r.c.regions["eu"]
	// Too large: dropped at the part that crosses the bound; the rest of
	// it is ignored, and nobody is asked for another.
	part(1, 3, 100, 600, "a")
	if tt, ask := part(2, 3, 100, 600, "b"); tt != nil || ask || eu.asm != nil {
		t.Fatalf("an oversize full kept: %v %v %v", tt, ask, eu.asm)
	}
	if tt, ask := part(3, 3, 100, 10, "c"); tt != nil || ask {
		t.Fatalf("the rest of an oversize full: %v %v", tt, ask)
	}
	if r.c.stats.OversizeFulls.Load() != 1 || !eu.synced {
		t.Fatalf("oversize %d, synced %v", r.c.stats.OversizeFulls.Load(), eu.synced)
	}
	// Incomplete: dropped DownAfter (500ms) after its first part.
	part(1, 2, 101, 10, "d")
	r.advance(475 * time.Millisecond)
	if eu.asm == nil {
		t.Fatal("an assembly dropped before DownAfter")
	}
	r.advance(50 * time.Millisecond)
	if eu.asm != nil {
		t.Fatal("an incomplete full still held after DownAfter")
	}
	if r.c.stats.DroppedFulls.Load() != 2 {
		t.Fatalf("dropped fulls %d, want 2", r.c.stats.DroppedFulls.Load())
	}
	want(t, "nothing announced", r.all, "online r/u1 joined 1")
}

// The aggregator's own stall is no evidence against the regions: a tick
// that comes long after the last one (the process was paused, or its
// engine blocked) drops nobody, and the regions' publications that
// waited in the queue are applied after it.
func TestCoreAStalledClockJudgesNobody(t *testing.T) {
	r := newRig(t, "eu", "ap")
	r.full("eu", regionView{"r": {"only-eu": {"s1"}}}, false)
	r.full("ap", regionView{"r": {"only-ap": {"s2"}}}, false)
	r.advance(time.Second, "eu", "ap")
	r.now = r.now.Add(5 * time.Second) // more than DropAfter without a tick
	want(t, "the first tick after the stall", r.settle(r.c.tick(r.now)))
	for _, name := range []string{"eu", "ap"} {
		if s := r.c.state(r.c.regions[name], r.now); s != RegionLive {
			t.Fatalf("%s is %s after the stall", name, s)
		}
	}
	want(t, "the queued publications, and on", r.advance(time.Second, "eu", "ap"))
	// A region that stays silent after the stall is judged as usual.
	want(t, "ap silent", r.advance(1900*time.Millisecond, "eu"))
	want(t, "ap dropped", r.advance(200*time.Millisecond, "eu"), "offline r/only-ap region_lost 0")
	if r.c.stats.Stalls.Load() != 1 {
		t.Fatalf("stalls %d", r.c.stats.Stalls.Load())
	}
}

func TestCoreFullInParts(t *testing.T) {
	r := newRig(t, "eu")
	r.gen["eu"] = 1
	pub := func(part, parts int, seq uint64, users map[string][]string) (touchSet, bool) {
		return r.c.publication(&publication{V: 1, Kind: kindFull, Region: "eu", Gen: 1, Inst: "i", Seq: seq, Part: part, Parts: parts, Rooms: []roomOps{set("r", users)}}, r.now)
	}
	if tt, _ := pub(1, 2, 1, map[string][]string{"u1": {"s1"}}); tt != nil {
		t.Fatal("applied a partial full")
	}
	tt, _ := pub(2, 2, 1, map[string][]string{"u2": {"s2"}})
	want(t, "complete", r.settle(tt), "online r/u1 joined 1", "online r/u2 joined 1")
	// A full whose part 1 was lost is dropped; the region is asked again.
	if _, ask := pub(2, 2, 2, map[string][]string{"u3": {"s3"}}); !ask {
		t.Fatal("lost part did not ask for a resync")
	}
	if r.c.regions["eu"].synced {
		t.Fatal("still in sync after a lost part")
	}
}

func TestCoreUnattributedMembersWaitForEveryRegion(t *testing.T) {
	// The stream says u1 and u2 are online; this aggregator just started
	// and knows nothing of them. eu is live and lists u2; ap is listed
	// in the configuration but silent.
	r := newRig(t, "eu", "ap")
	r.c.ann.apply(presence.Transition{Room: "r", User: "u1", Kind: presence.Online, Epoch: 1, Seq: 1}, 1, t0)
	r.c.ann.apply(presence.Transition{Room: "r", User: "u2", Kind: presence.Online, Epoch: 1, Seq: 2}, 2, t0)
	r.next = 2
	want(t, "the stream's view, as after a reload", r.settle(r.c.everyone()))
	want(t, "eu", r.full("eu", regionView{"r": {"u2": {"s2"}}}, false))
	want(t, "ap may hold u1 until dropped", r.advance(1900*time.Millisecond, "eu"))
	want(t, "ap dropped", r.advance(200*time.Millisecond, "eu"), "offline r/u1 region_lost 0")
}

func TestCoreUnattributedLeftWhenEveryRegionIsLive(t *testing.T) {
	r := newRig(t)
	r.c.ann.apply(presence.Transition{Room: "r", User: "u1", Kind: presence.Online, Epoch: 1, Seq: 1}, 1, t0)
	r.next = 1
	want(t, "the stream's view, as after a reload", r.settle(r.c.everyone()))
	r.full("eu", regionView{}, false)
	// Settled after DownAfter (500ms) with every region live; then the
	// grace (300ms) from when the absence was first seen.
	want(t, "before DownAfter", r.advance(475*time.Millisecond, "eu"))
	want(t, "after", r.advance(100*time.Millisecond, "eu"), "offline r/u1 left 0")
}

func TestAnnouncedNumbering(t *testing.T) {
	a := newAnnounced()
	e, s := a.next("r", t0)
	if e != t0.UnixMilli() || s != 1 {
		t.Fatalf("new room: %d %d", e, s)
	}
	a.apply(presence.Transition{Room: "r", User: "u", Kind: presence.Online, Epoch: e, Seq: s}, 10, t0)
	if e2, s2 := a.next("r", t0); e2 != e || s2 != 2 {
		t.Fatalf("next: %d %d", e2, s2)
	}
	if on := a.apply(presence.Transition{Room: "r", User: "u", Kind: presence.Offline, Epoch: e, Seq: 2}, 11, t0); on != 10 {
		t.Fatalf("superseded online %d", on)
	}
	if a.apply(presence.Transition{Room: "r", User: "x", Kind: presence.Online, Epoch: e, Seq: 3}, 11, t0) != 0 || a.member("r", "x") {
		t.Fatal("applied a message at or below through")
	}
	// A room whose newest message may have expired is renumbered.
	later := t0.Add(time.Hour)
	a.settle(later, time.Hour)
	if e3, s3 := a.next("r", later); e3 != later.UnixMilli() || s3 != 1 {
		t.Fatalf("stale room: %d %d", e3, s3)
	}
	a.prune(later.Add(emptyRoomTTL), func(string) bool { return false })
	if len(a.rooms) != 0 {
		t.Fatal("empty room not pruned")
	}
}

// withStates sets a user whole: sessions and the states of some.
func withStates(room, user string, sessions []string, states map[string]string) roomOps {
	op := roomOps{Room: room, Set: map[string][]string{user: sessions}}
	if len(states) > 0 {
		op.St = map[string]map[string]json.RawMessage{user: {}}
		for s, st := range states {
			op.St[user][s] = json.RawMessage(st)
		}
	}
	return op
}

// Session states cross regions as updates: one per change, none for a
// refresh, none for a session that moves between regions with its state,
// a clear when a live session loses its state, and an update (left) when
// a session with a state ends while its user stays.
func TestCoreCarriesSessionStates(t *testing.T) {
	r := newRig(t, "eu", "ap")
	r.full("eu", regionView{}, false)
	r.full("ap", regionView{}, false)
	s1 := []string{"s1"}
	want(t, "join with a state", r.delta("eu", withStates("r", "u1", s1, map[string]string{"s1": `"away"`})),
		"online r/u1 joined 1", `update r/u1 state 1 s1="away"`)
	want(t, "same state again", r.delta("eu", withStates("r", "u1", s1, map[string]string{"s1": `"away"`})))
	want(t, "typing", r.delta("eu", withStates("r", "u1", s1, map[string]string{"s1": `"typing"`})),
		`update r/u1 state 1 s1="typing"`)
	want(t, "move: gone from eu", r.delta("eu", del("r", "u1")))
	want(t, "move: in ap with its state", r.delta("ap", withStates("r", "u1", s1, map[string]string{"s1": `"typing"`})))
	want(t, "cleared", r.delta("ap", set("r", map[string][]string{"u1": s1})), "update r/u1 state 1 s1=")
	want(t, "a second tab in eu", r.delta("eu", withStates("r", "u1", []string{"s2"}, map[string]string{"s2": `{"x":1}`})),
		`update r/u1 state 2 s2={"x":1}`)
	// While a session shows in both regions, the live region's state wins
	// and the first by name among equals: ap's "a" over eu's "b".
	want(t, "s2 in both", r.delta("ap", withStates("r", "u1", []string{"s1", "s2"}, map[string]string{"s2": `"a"`})),
		`update r/u1 state 2 s2="a"`)
	want(t, "s2 only in eu again", r.delta("ap", set("r", map[string][]string{"u1": s1})),
		`update r/u1 state 2 s2={"x":1}`)
	want(t, "s2 ends while s1 stays", r.delta("eu", del("r", "u1")), "update r/u1 left 1 s2=")

	// Gone for the grace: offline, and the states go with the member.
	r.delta("ap", del("r", "u1"))
	want(t, "offline", r.advance(400*time.Millisecond, "eu", "ap"), "offline r/u1 left 0")
	if st := r.c.ann.states("r", "u1"); st != nil {
		t.Fatalf("states after offline: %v", st)
	}
	want(t, "back with a state", r.delta("eu", withStates("r", "u1", s1, map[string]string{"s1": `"away"`})),
		"online r/u1 joined 1", `update r/u1 state 1 s1="away"`)
}

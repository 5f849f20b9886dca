package global

import (
	"slices"
	"time"

	"github.com/presence-dev/presence/presence"
)

// regionState is one region's contribution as an aggregator holds it.
type regionState struct {
	name     string
	expected bool // configured: down from the aggregator's start until heard
	// gen and inst name the region's current publisher: the one whose
	// full was applied last. Zero until one was.
	gen     uint64
	inst    string
	seq     uint64
	synced  bool      // rooms are a full plus every delta since, in order
	heard   time.Time // last publication applied; zero: never
	spoke   time.Time // last publication of the current publisher, applied or not
	dropped bool
	rooms   regionView
	states  stateView
	asm     *assembly // full snapshot being received
	refused fullID    // a full dropped as too large: its other parts are ignored
	asked   time.Time // last resync request
}

// fullID names one full snapshot: its publisher and sequence.
type fullID struct {
	gen  uint64
	inst string
	seq  uint64
}

// assembly collects the parts of one full snapshot.
type assembly struct {
	gen        uint64
	inst       string
	seq        uint64
	next, last int
	view       regionView
	states     stateView
	started    time.Time // part 1 arrived
	bytes      int       // encoded size of the parts so far
}

// live reports whether the region's contribution may bring users online:
// it is in sync and was heard within downAfter.
func (r *regionState) live(now time.Time, downAfter time.Duration) bool {
	return r.synced && !r.dropped && !r.heard.IsZero() && now.Sub(r.heard) < downAfter
}

// RegionState names what an aggregator makes of a region.
type RegionState string

// Region states.
const (
	RegionLive    RegionState = "live"    // in sync and heard recently: counts fully
	RegionDown    RegionState = "down"    // not heard for DownAfter, or out of sync: held
	RegionDropped RegionState = "dropped" // not heard for DropAfter: its users are gone
)

// decision is the aggregator's memory about one user in one room.
type decision struct {
	seen  bool      // this aggregator saw the user present in some region
	since time.Time // absent from every region since; zero: present
	lost  bool      // the absence came from dropping a region
}

// intent is a global transition the view calls for. session and state
// are an update's.
type intent struct {
	room, user string
	kind       presence.Kind
	reason     presence.Reason
	sessions   int
	session    string
	state      string // "" when cleared
}

// touchSet names the users to evaluate, per room.
type touchSet map[string]map[string]struct{}

func (t touchSet) add(room, user string) {
	m := t[room]
	if m == nil {
		m = map[string]struct{}{}
		t[room] = m
	}
	m[user] = struct{}{}
}

func (t touchSet) addView(v regionView) {
	for room, users := range v {
		for u := range users {
			t.add(room, u)
		}
	}
}

func (t touchSet) addOps(ops []roomOps) {
	for _, op := range ops {
		for u := range op.Set {
			t.add(op.Room, u)
		}
		for _, u := range op.Del {
			t.add(op.Room, u)
		}
	}
}

// core is an aggregator's state and decisions: the regions'
// contributions, the announced view and each user's absence timer. Time
// comes in as an argument, so the rules are tested without a clock. Not
// safe for concurrent use.
type core struct {
	cadence, grace, downAfter, dropAfter time.Duration
	// takeover is how long a region's current publisher must have been
	// silent before another one may replace it.
	takeover     time.Duration
	maxFullBytes int
	listed       bool // Regions was given: publications of other regions are dropped
	start        time.Time
	lastTick     time.Time
	regions      map[string]*regionState
	ann          *announced
	dec          map[string]map[string]*decision // room -> user
	absent       touchSet                        // users whose absence timer runs
	stats        *AggregatorStats
}

func newCore(cfg AggregatorConfig, start time.Time, stats *AggregatorStats) *core {
	c := &core{
		cadence: cfg.Cadence, grace: cfg.Grace, downAfter: cfg.DownAfter, dropAfter: cfg.DropAfter,
		takeover: min(takeoverCadences*cfg.Cadence, cfg.DownAfter), maxFullBytes: cfg.MaxFullBytes,
		listed: len(cfg.Regions) > 0, start: start, regions: map[string]*regionState{}, ann: newAnnounced(),
		dec: map[string]map[string]*decision{}, absent: touchSet{}, stats: stats,
	}
	if c.maxFullBytes <= 0 {
		c.maxFullBytes = DefaultMaxFullBytes
	}
	for _, r := range cfg.Regions {
		c.regions[r] = &regionState{name: r, expected: true, rooms: regionView{}, states: stateView{}}
	}
	return c
}

// takeoverCadences: a publisher publishes every cadence, so one silent
// for two has stopped (or lost its lease: it then stops within 3/4 of its
// lease TTL, before another can take the lease).
const takeoverCadences = 2

// region returns the state of the named region, or nil when Regions was
// given and does not list it.
func (c *core) region(name string) *regionState {
	r := c.regions[name]
	if r == nil && !c.listed {
		r = &regionState{name: name, rooms: regionView{}, states: stateView{}}
		c.regions[name] = r
	}
	return r
}

// publication applies one region publication. It returns the users to
// evaluate and whether the region should be asked for a full snapshot.
//
// Who publishes for a region is decided by continuity, not by the
// generation number: the current publisher keeps the region while it
// publishes, and another (any other generation or instance) may replace
// it only once it has been silent for the takeover period. A real
// successor only starts after its predecessor's lease ran out, so it
// never waits long; a publication with a forged or far-ahead generation
// cannot lock the real publisher out, and cannot displace it while it
// publishes.
func (c *core) publication(p *publication, now time.Time) (touchSet, bool) {
	r := c.region(p.Region)
	if r == nil {
		c.stats.UnknownRegions.Add(1)
		return nil, false
	}
	current := r.gen != 0 && p.Gen == r.gen && p.Inst == r.inst
	switch {
	case current:
		r.spoke = now
	case r.gen != 0 && !r.dropped && now.Sub(r.spoke) < c.takeover:
		c.stats.Contenders.Add(1)
		return nil, false
	}
	switch p.Kind {
	case kindDelta:
		return c.delta(r, p, current, now)
	case kindFull:
		return c.full(r, p, current, now)
	}
	return nil, false
}

// delta applies a delta of r: in sequence from the current publisher it
// is applied; a duplicate is ignored; anything else leaves r unsynced,
// holding what it has, until a full arrives.
func (c *core) delta(r *regionState, p *publication, current bool, now time.Time) (touchSet, bool) {
	switch {
	case current && r.synced && p.Seq == r.seq+1:
		touched := touchSet{}
		touched.addOps(p.Rooms)
		r.rooms.Apply(p.Rooms)
		r.states.Apply(p.Rooms)
		r.seq, r.heard = p.Seq, now
		c.stats.Publications.Add(1)
		if p.Digest != "" && digest(r.rooms, r.states) != p.Digest {
			// Our copy differs from what the publisher published: hold
			// it (as after a gap) until a full replaces it.
			c.stats.DigestMismatches.Add(1)
			r.synced = false
			return touched, c.ask(r, now)
		}
		return touched, false
	case current && p.Seq <= r.seq:
		return nil, false // a duplicate
	case r.asm != nil && p.Gen == r.asm.gen && p.Inst == r.asm.inst && p.Seq == r.asm.seq+1:
		// Follows a full whose parts did not all arrive.
		r.asm = nil
		c.stats.DroppedFulls.Add(1)
	}
	if r.synced {
		c.stats.Gaps.Add(1)
	}
	r.synced = false // hold what we have; wait for a full
	return nil, c.ask(r, now)
}

// full adds a part of a full snapshot of r to its assembly; the last part
// replaces r's view and makes p's publisher r's current one. A lost part
// drops the assembly and asks for another full.
func (c *core) full(r *regionState, p *publication, current bool, now time.Time) (touchSet, bool) {
	if current && r.synced && p.Seq <= r.seq {
		return nil, false // a duplicate
	}
	if (fullID{p.Gen, p.Inst, p.Seq}) == r.refused {
		return nil, false // the rest of a full too large to hold
	}
	if p.Part == 1 {
		if r.asm != nil {
			c.stats.DroppedFulls.Add(1) // replaced before it completed
		}
		r.asm = &assembly{gen: p.Gen, inst: p.Inst, seq: p.Seq, next: 1, last: p.Parts, view: regionView{}, states: stateView{}, started: now}
	}
	a := r.asm
	if a == nil || a.gen != p.Gen || a.inst != p.Inst || a.seq != p.Seq || a.next != p.Part || a.last != p.Parts {
		if a != nil {
			c.stats.DroppedFulls.Add(1)
		}
		r.asm = nil // a lost part; the next full starts over
		if r.synced {
			c.stats.Gaps.Add(1)
		}
		r.synced = false
		return nil, c.ask(r, now)
	}
	// An assembly holds at most maxFullBytes of publications: past
	// that it is dropped, not asked for again (a region that big
	// needs a larger MaxFullBytes, which asking cannot fix).
	if a.bytes += p.size; a.bytes > c.maxFullBytes {
		r.asm, r.refused = nil, fullID{a.gen, a.inst, a.seq}
		c.stats.DroppedFulls.Add(1)
		c.stats.OversizeFulls.Add(1)
		return nil, false
	}
	a.view.Apply(p.Rooms)
	a.states.Apply(p.Rooms)
	a.next++
	if p.Part < p.Parts {
		return nil, false
	}
	touched := touchSet{}
	touched.addView(r.rooms)
	touched.addView(a.view)
	r.rooms, r.states, r.asm = a.view, a.states, nil
	r.gen, r.inst, r.seq = p.Gen, p.Inst, p.Seq
	r.synced, r.dropped, r.heard, r.spoke = true, false, now, now
	c.stats.Publications.Add(1)
	return touched, false
}

// ask reports whether to request a full from r now: at most once a
// cadence per region.
func (c *core) ask(r *regionState, now time.Time) bool {
	if !r.asked.IsZero() && now.Sub(r.asked) < c.cadence {
		return false
	}
	r.asked = now
	c.stats.ResyncRequests.Add(1)
	return true
}

// tick drops regions not heard for dropAfter, and fulls that did not
// complete within downAfter, and returns the users whose status may have
// changed with time. It is called at least once a cadence.
func (c *core) tick(now time.Time) touchSet {
	c.credit(now)
	touched := touchSet{}
	for room, users := range c.absent {
		for u := range users {
			touched.add(room, u)
		}
	}
	for _, r := range c.regions {
		if r.asm != nil && now.Sub(r.asm.started) >= c.downAfter {
			// Its parts stopped coming: free it. A lost part already
			// put the region out of sync and asked for another full.
			r.asm = nil
			c.stats.DroppedFulls.Add(1)
		}
		ref := r.heard
		if ref.IsZero() {
			ref = c.start
		}
		if r.dropped || now.Sub(ref) < c.dropAfter {
			continue
		}
		r.dropped, r.synced, r.asm = true, false, nil
		gone := r.rooms
		r.rooms, r.states = regionView{}, stateView{}
		touched.addView(gone)
		// Users whose last presence was in r are lost with it.
		for room, users := range gone {
			for u := range users {
				if c.ann.member(room, u) && !c.presentAnywhere(room, u) {
					c.decision(room, u).lost = true
				}
			}
		}
	}
	return touched
}

// credit makes a stall of the aggregator itself no evidence against
// anyone: when ticks were more than a cadence apart (the process was
// paused, or starved), the regions could not be heard meanwhile, and
// their publications may still wait in the queue. Every timer that
// measures silence or absence is moved on by the gap, so time that
// nobody watched counts for no one.
func (c *core) credit(now time.Time) {
	last := c.lastTick
	c.lastTick = now
	gap := now.Sub(last)
	if last.IsZero() || gap <= c.cadence {
		return
	}
	c.stats.Stalls.Add(1)
	shift := func(t *time.Time) {
		if !t.IsZero() {
			*t = minTime(t.Add(gap), now)
		}
	}
	shift(&c.start)
	for _, r := range c.regions {
		shift(&r.heard)
		shift(&r.spoke)
		if r.asm != nil {
			shift(&r.asm.started)
		}
	}
	for room, users := range c.absent {
		for u := range users {
			if d := c.dec[room][u]; d != nil {
				shift(&d.since)
			}
		}
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func (c *core) presentAnywhere(room, user string) bool {
	for _, r := range c.regions {
		if _, ok := r.rooms[room][user]; ok && !r.dropped {
			return true
		}
	}
	return false
}

func (c *core) decision(room, user string) *decision {
	m := c.dec[room]
	if m == nil {
		m = map[string]*decision{}
		c.dec[room] = m
	}
	d := m[user]
	if d == nil {
		d = &decision{}
		m[user] = d
	}
	return d
}

func (c *core) forget(room, user string) {
	if m := c.dec[room]; m != nil {
		delete(m, user)
		if len(m) == 0 {
			delete(c.dec, room)
		}
	}
	c.clearAbsent(room, user)
}

func (c *core) clearAbsent(room, user string) {
	if m := c.absent[room]; m != nil {
		delete(m, user)
		if len(m) == 0 {
			delete(c.absent, room)
		}
	}
}

// settled reports whether users announced before this aggregator heard
// anything of them may now be judged: the regions had DownAfter to be
// heard, and none is merely down (it might hold them).
func (c *core) settled(now time.Time) (ok bool, anyDropped bool) {
	if now.Sub(c.start) < c.downAfter {
		return false, false
	}
	for _, r := range c.regions {
		switch {
		case r.dropped:
			anyDropped = true
		case !r.live(now, c.downAfter):
			return false, false
		}
	}
	return true, anyDropped
}

// evaluate decides, for each touched user, whether the global view calls
// for a transition. A user is present while any region not dropped lists
// them; only a live region brings a user online (a held one only keeps
// them); a user absent everywhere goes offline after the grace, or at
// once with reason region_lost when dropping a region took them away.
func (c *core) evaluate(touched touchSet, now time.Time) []intent {
	var out []intent
	for _, room := range sortedKeys(touched) {
		for _, user := range sortedKeys(touched[room]) {
			it, ok := c.evaluateUser(room, user, now)
			if ok {
				out = append(out, it)
			}
			// States matter for a member who stays one, or becomes one.
			if ok && it.kind == presence.Online || !ok && c.ann.member(room, user) {
				out = append(out, c.stateIntents(room, user, now)...)
			}
		}
	}
	return out
}

func (c *core) evaluateUser(room, user string, now time.Time) (intent, bool) {
	liveHas, heldHas, sessions := c.holders(room, user, now)
	member := c.ann.member(room, user)
	if liveHas || heldHas {
		d := c.decision(room, user)
		d.seen, d.since, d.lost = true, time.Time{}, false
		c.clearAbsent(room, user)
		if !member && liveHas {
			return intent{room: room, user: user, kind: presence.Online, reason: presence.Joined, sessions: len(sessions)}, true
		}
		if !member {
			c.forget(room, user) // held only: nothing to announce or time
		}
		return intent{}, false
	}
	if !member {
		c.forget(room, user)
		return intent{}, false
	}
	d := c.decision(room, user)
	if d.since.IsZero() {
		d.since = now
		c.absent.add(room, user)
	}
	switch {
	case d.lost:
		return intent{room: room, user: user, kind: presence.Offline, reason: presence.RegionLost}, true
	case !d.seen:
		// Announced before this aggregator heard of them: wait until
		// every region had its chance to claim them.
		ok, anyDropped := c.settled(now)
		if !ok || now.Sub(d.since) < c.grace {
			return intent{}, false
		}
		reason := presence.Left
		if anyDropped {
			reason = presence.RegionLost
		}
		return intent{room: room, user: user, kind: presence.Offline, reason: reason}, true
	case now.Sub(d.since) >= c.grace:
		return intent{room: room, user: user, kind: presence.Offline, reason: presence.Left}, true
	}
	return intent{}, false
}

// holders reports whether a live region and whether a held one (silent
// past downAfter, its last state kept) list the user in the room, and the
// union of their session ids.
func (c *core) holders(room, user string, now time.Time) (liveHas, heldHas bool, sessions map[string]struct{}) {
	for _, r := range c.regions {
		if r.dropped {
			continue
		}
		ss, ok := r.rooms[room][user]
		if !ok {
			continue
		}
		if r.live(now, c.downAfter) {
			liveHas = true
		} else {
			heldHas = true
		}
		if sessions == nil {
			sessions = map[string]struct{}{}
		}
		for _, s := range ss {
			sessions[s] = struct{}{}
		}
	}
	return liveHas, heldHas, sessions
}

// stateIntents returns an update for each session of a member whose state
// in the union differs from the announced one. A session's state comes from a live region
// before a held one, then by region name, so a session that briefly
// shows in two regions while moving has one state. A session with an
// announced state that is gone from the union ends with an update (left)
// that takes the state along, as in a region.
func (c *core) stateIntents(room, user string, now time.Time) []intent {
	union := c.states(room, user, now)
	was := c.ann.states(room, user)
	var out []intent
	update := func(session, state string) {
		out = append(out, intent{room: room, user: user, kind: presence.Update, reason: presence.State, session: session, state: state})
	}
	for _, s := range sortedKeys(union) {
		if st := union[s]; st != was[s] {
			update(s, st)
		}
	}
	// The user's sessions, read once and only when needed.
	var ss []string
	read := false
	sessions := func() []string {
		if !read {
			ss, read = c.sessions(room, user), true
		}
		return ss
	}
	// A session that is live but lost its state: announce the clear; one
	// that is gone while the user stays: announce its end. A user gone
	// everywhere keeps their states through the grace.
	for _, s := range sortedKeys(was) {
		if _, ok := union[s]; ok {
			continue
		}
		switch {
		case slices.Contains(sessions(), s):
			update(s, "")
		case len(sessions()) > 0:
			out = append(out, intent{room: room, user: user, kind: presence.Update, reason: presence.Left, session: s})
		}
	}
	if len(out) > 0 {
		n := len(sessions())
		for i := range out {
			out[i].sessions = n
		}
	}
	return out
}

// states returns the user's session states over the regions not dropped,
// live regions first, then by name.
func (c *core) states(room, user string, now time.Time) map[string]string {
	var out map[string]string
	for _, live := range []bool{true, false} {
		for _, name := range sortedKeys(c.regions) {
			r := c.regions[name]
			if r.dropped || r.live(now, c.downAfter) != live {
				continue
			}
			for s, st := range r.states[room][user] {
				if _, ok := out[s]; !ok {
					if out == nil {
						out = map[string]string{}
					}
					out[s] = st
				}
			}
		}
	}
	return out
}

// everyone returns every announced member and every present user, to
// evaluate after the announced view was replaced.
func (c *core) everyone() touchSet {
	t := touchSet{}
	for room, r := range c.ann.rooms {
		for u := range r.members {
			t.add(room, u)
		}
	}
	for _, r := range c.regions {
		t.addView(r.rooms)
	}
	return t
}

// sessions returns the union of a user's session ids over the regions not
// dropped, sorted.
func (c *core) sessions(room, user string) []string {
	var all []string
	for _, r := range c.regions {
		if !r.dropped {
			all = append(all, r.rooms[room][user]...)
		}
	}
	return normSessions(all)
}

// regionsOf returns the regions (not dropped) that list the user, sorted.
func (c *core) regionsOf(room, user string) []string {
	var out []string
	for _, name := range sortedKeys(c.regions) {
		r := c.regions[name]
		if _, ok := r.rooms[room][user]; ok && !r.dropped {
			out = append(out, name)
		}
	}
	return out
}

// state returns what the aggregator makes of region r now.
func (c *core) state(r *regionState, now time.Time) RegionState {
	switch {
	case r.dropped:
		return RegionDropped
	case r.live(now, c.downAfter):
		return RegionLive
	}
	return RegionDown
}

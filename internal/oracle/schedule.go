package oracle

import (
	"cmp"
	"container/heap"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"
)

// Scenario describes a run: how many nodes, users and rooms, how busy the
// clients are, and when nodes are killed. With its seed it determines the
// whole Plan.
type Scenario struct {
	Seed     int64
	Timing   Timing
	Nodes    int
	Users    int
	Rooms    int
	MaxTabs  int // each user has 1..MaxTabs tabs (session ids)
	MaxRooms int // each tab is in 1..MaxRooms rooms
	// Duration: operations start in [0, Duration); returns planned before
	// it may come after it.
	Duration time.Duration
	OpEvery  time.Duration // mean time between one tab's operations
	// The first kill is at FirstKill, then one every KillEvery (0: only
	// one) while before Duration; the node is restarted RestartMin to
	// RestartMax later, as a new process in the same slot.
	FirstKill, KillEvery   time.Duration
	RestartMin, RestartMax time.Duration
	// RampUp spreads the tabs' first connects over this long (default
	// 1.5s, at most a quarter of Duration).
	RampUp time.Duration
	// JoinAllowance is how long a return may take from its dial to its
	// last join's acknowledgement: a return meant to be inside a departure
	// window is planned this much before the window opens.
	JoinAllowance time.Duration
	// MaxOps stops planning new operations once this many are planned (0:
	// no limit; Duration bounds the run).
	MaxOps int
}

// OpKind is a kind of operation.
type OpKind string

// Operations.
const (
	OpConnect  OpKind = "connect"  // dial a node, join the rooms, send the states
	OpJoin     OpKind = "join"     // join one more room (and send its state)
	OpLeave    OpKind = "leave"    // leave one room
	OpState    OpKind = "state"    // set the state in a room
	OpClose    OpKind = "close"    // clean WebSocket close
	OpReset    OpKind = "reset"    // TCP reset, no close frame
	OpHandover OpKind = "handover" // make-before-break onto another node
	OpKill     OpKind = "kill"     // SIGKILL a node
	OpRestart  OpKind = "restart"  // start a new process in a killed node's slot
)

// Band says where a return was planned against the departure window of
// the end before it.
type Band string

// Bands.
const (
	Inside Band = "inside" // acknowledged before the window opens: silent
	Beyond Band = "beyond" // sent after the window closed: offline, online
)

// Op is one planned operation.
type Op struct {
	At   time.Duration // planned start
	Kind OpKind
	Node int    // connect, handover, kill, restart: the node slot
	Room string // join, leave, state
	// State: for state, the JSON to set ("" sends null); for join, the
	// state to send again after the join ("" none).
	State string
	// Rooms and States: for connect and handover, the rooms to join and
	// the state to send again in each ("" none).
	Rooms, States []string
	// Gap, for a connect after a close, reset or kill: the delay from the
	// moment the tab's previous connection really ended (the close sent,
	// the kill) to the dial. The harness keeps it exactly, whatever delay
	// the run has accumulated, so the return stays in its Band.
	Gap  time.Duration
	Band Band
}

func (o Op) String() string {
	s := fmt.Sprintf("%s %s", fmtT(o.At), o.Kind)
	switch o.Kind {
	case OpConnect, OpHandover:
		s += fmt.Sprintf(" node=%d rooms=%v", o.Node, o.Rooms)
		if o.Gap > 0 {
			s += fmt.Sprintf(" gap=%v (%s)", o.Gap, o.Band)
		}
	case OpJoin, OpLeave:
		s += " " + o.Room
	case OpState:
		s += fmt.Sprintf(" %s=%s", o.Room, o.State)
	case OpKill, OpRestart:
		s += fmt.Sprintf(" node=%d", o.Node)
	}
	return s
}

// Tab is one session id of a user and its operations, in order.
type Tab struct {
	User, Session string
	Ops           []Op
}

// Plan is a seeded schedule.
type Plan struct {
	Scenario Scenario
	Rooms    []string
	Tabs     []Tab
	Nodes    []Op // kills and restarts, in time order
	Ops      int  // operations planned in all
}

// States a tab may set; "" clears.
var states = []string{`{"s":"away"}`, `{"s":"busy"}`, `{"s":"typing"}`, ""}

// Generate plans a scenario. It simulates the run in planned time, keeping
// for every (room, user) who holds it and the departure window in
// progress, and it plans no return and no clean close that a correct
// service could answer in two ways: every return is acknowledged before
// the window it meets opens, or sent after it closed, and no clean close
// comes shortly before a kill of another of the user's sessions in the
// room.
// The same scenario always gives the same plan.
func Generate(sc Scenario) *Plan {
	g := &gen{sc: sc, t: sc.Timing, rng: rand.New(rand.NewPCG(uint64(sc.Seed), 0x9e3779b97f4a7c15)), keys: map[Key]*gkey{}}
	g.plan = &Plan{Scenario: sc}
	for i := range sc.Rooms {
		g.plan.Rooms = append(g.plan.Rooms, fmt.Sprintf("r%d", i))
	}
	for u := range sc.Users {
		n := 1 + g.rng.IntN(sc.MaxTabs)
		for s := range n {
			g.plan.Tabs = append(g.plan.Tabs, Tab{User: fmt.Sprintf("u%03d", u), Session: fmt.Sprintf("u%03d-t%d", u, s)})
			tb := &gtab{user: u, node: -1, states: map[string]string{}, ended: None}
			for _, ri := range g.rng.Perm(sc.Rooms)[:1+g.rng.IntN(min(sc.MaxRooms, sc.Rooms))] {
				r := g.plan.Rooms[ri]
				tb.rooms = append(tb.rooms, r)
				if g.rng.IntN(3) == 0 {
					tb.states[r] = states[g.rng.IntN(len(states)-1)]
				}
			}
			g.tabs = append(g.tabs, tb)
		}
	}
	g.userTabs = make([][]int, sc.Users)
	for i, tb := range g.tabs {
		g.userTabs[tb.user] = append(g.userTabs[tb.user], i)
	}
	start := min(1500*time.Millisecond, sc.Duration/4)
	if sc.RampUp > 0 {
		start = sc.RampUp
	}
	for i := range g.tabs {
		g.push(gevent{at: g.uniform(0, start), kind: evConnect, tab: i})
	}
	if sc.FirstKill > 0 && sc.Nodes > 1 {
		g.planKill(sc.FirstKill)
	}
	for g.q.Len() > 0 {
		e := heap.Pop(&g.q).(gevent)
		g.now = e.at
		switch e.kind {
		case evKill:
			g.kill(e.node)
			if sc.KillEvery > 0 {
				g.planKill(e.at + sc.KillEvery)
			}
			g.prune()
		case evConnect:
			if e.gen == g.tabs[e.tab].gen {
				g.connect(e.tab)
			}
		case evOp:
			if e.gen == g.tabs[e.tab].gen {
				g.op(e.tab, e.forced)
			}
		}
	}
	return g.plan
}

type gtab struct {
	user   int
	node   int // -1 while disconnected
	rooms  []string
	states map[string]string
	ended  time.Duration // when its last connection ended
	band   Band          // of the planned return
	// returnAt is the planned return while disconnected, None if none.
	returnAt time.Duration
	gen      int // bumped to cancel the tab's pending event
}

// gkey is the simulated truth of one (room, user).
type gkey struct {
	holders map[int]bool          // tabs holding it
	tails   map[int]time.Duration // tabs that abandoned it (kill), not held again
	win     *Window               // departure in progress while nobody holds it
	// released is its latest clean close (None: none yet): a kill of
	// another holder soon after it could go either way (Departure).
	released time.Duration
}

type evKind uint8

const (
	evKill evKind = iota
	evConnect
	evOp
)

type gevent struct {
	at     time.Duration
	kind   evKind
	tab    int
	node   int
	gen    int
	forced OpKind
	seq    int
}

type evq []gevent

func (q evq) Len() int { return len(q) }
func (q evq) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q evq) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *evq) Push(x any)   { *q = append(*q, x.(gevent)) }
func (q *evq) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}

type gen struct {
	sc       Scenario
	t        Timing
	rng      *rand.Rand
	plan     *Plan
	tabs     []*gtab
	userTabs [][]int
	keys     map[Key]*gkey
	q        evq
	seq      int
	now      time.Duration
	// down[slot]: intervals in which a slot cannot take a new connection:
	// from a guard before its kill to a while after its restart.
	down     [][2]time.Duration
	downSlot []int
	kills    []plannedKill
}

// plannedKill is a kill of a slot at a planned time.
type plannedKill struct {
	slot int
	at   time.Duration
}

func (g *gen) push(e gevent) {
	g.seq++
	e.seq = g.seq
	heap.Push(&g.q, e)
}

func (g *gen) uniform(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(g.rng.Int64N(int64(hi-lo)))
}

func (g *gen) key(room string, tab int) *gkey {
	k := Key{room, g.plan.Tabs[tab].User}
	gk := g.keys[k]
	if gk == nil {
		gk = &gkey{holders: map[int]bool{}, tails: map[int]time.Duration{}, released: None}
		g.keys[k] = gk
	}
	return gk
}

// planKill plans the kill at k and its restart, unless the run is over. The
// next kill is planned when this one happens, so a long run keeps only the
// current ones.
func (g *gen) planKill(k time.Duration) {
	sc := g.sc
	if k >= sc.Duration || (sc.MaxOps > 0 && g.plan.Ops >= sc.MaxOps) {
		return
	}
	guard := sc.JoinAllowance + time.Second
	slot := g.rng.IntN(sc.Nodes)
	r := k + g.uniform(sc.RestartMin, sc.RestartMax)
	g.plan.Nodes = append(g.plan.Nodes, Op{At: k, Kind: OpKill, Node: slot}, Op{At: r, Kind: OpRestart, Node: slot})
	g.plan.Ops += 2
	// From a guard before the kill to a while after the restart (when the
	// new process is surely up) the slot takes no new connection.
	g.down = append(g.down, [2]time.Duration{k - guard, r + 2*time.Second})
	g.downSlot = append(g.downSlot, slot)
	g.kills = append(g.kills, plannedKill{slot, k})
	g.push(gevent{at: k, kind: evKill, node: slot})
}

// prune forgets down intervals that are over.
func (g *gen) prune() {
	j := 0
	for i, d := range g.down {
		if d[1] >= g.now {
			g.down[j], g.downSlot[j] = d, g.downSlot[i]
			j++
		}
	}
	g.down, g.downSlot = g.down[:j], g.downSlot[:j]
}

// eligible lists the slots that can take a connection at t and keep it for
// a while.
func (g *gen) eligible(t time.Duration, not int) []int {
	var out []int
	for s := range g.sc.Nodes {
		ok := s != not
		for i, d := range g.down {
			if g.downSlot[i] == s && t >= d[0] && t <= d[1] {
				ok = false
			}
		}
		if ok {
			out = append(out, s)
		}
	}
	return out
}

// killSoon reports whether slot is killed within the guard after t.
func (g *gen) killSoon(slot int, t time.Duration) bool {
	for i, d := range g.down {
		if g.downSlot[i] == slot && t >= d[0] && t <= d[1] {
			return true
		}
	}
	return false
}

// returnOK reports whether a hold of k sent at t (and acknowledged within
// the join allowance) is clear of k's departure window.
func (g *gen) returnOK(k *gkey, t time.Duration) bool {
	if k.win == nil || len(k.holders) > 0 {
		return true
	}
	return t > k.win.Hi || t+g.sc.JoinAllowance < k.win.Lo
}

// tailList is the key's tails: the schedule abandons sessions only by
// killing their node.
func tailList(k *gkey) []Tail {
	var out []Tail
	for _, t := range k.tails {
		out = append(out, Tail{At: t, Killed: true})
	}
	slices.SortFunc(out, func(a, b Tail) int { return cmp.Compare(a.At, b.At) })
	return out
}

// killedSoon reports whether slot is planned to be killed within d after
// t.
func (g *gen) killedSoon(slot int, t, d time.Duration) bool {
	for _, pk := range g.kills {
		if pk.slot == slot && pk.at >= t && pk.at <= t+d {
			return true
		}
	}
	return false
}

// endOK reports whether tab may release rooms at t: every departure it
// causes is certain, no planned return of another tab of the user falls
// into its window's ambiguous band, and no other tab holding the room is
// on a node killed within a heartbeat (whose departure would then be
// left or expired, see Departure).
func (g *gen) endOK(tab int, rooms []string, t time.Duration) bool {
	tb := g.tabs[tab]
	for _, r := range rooms {
		k := g.key(r, tab)
		if len(k.holders) != 1 || !k.holders[tab] {
			for o := range k.holders {
				if o != tab && g.killedSoon(g.tabs[o].node, t, g.t.Heartbeat+2*g.t.Margin) {
					return false
				}
			}
			continue // others hold it: no departure now
		}
		w := g.t.Departure(t, Release, None, tailList(k), k.released)
		if !w.Certain {
			return false
		}
		for _, o := range g.userTabs[tb.user] {
			ot := g.tabs[o]
			if o == tab || ot.returnAt == None || !slices.Contains(ot.rooms, r) {
				continue
			}
			if !(ot.returnAt > w.Hi || ot.returnAt+g.sc.JoinAllowance < w.Lo) {
				return false
			}
		}
	}
	return true
}

func (g *gen) emit(tab int, op Op) {
	g.plan.Tabs[tab].Ops = append(g.plan.Tabs[tab].Ops, op)
	g.plan.Ops++
}

func (g *gen) nextOp(tab int, after time.Duration) {
	tb := g.tabs[tab]
	tb.gen++
	g.push(gevent{at: after + g.uniform(g.sc.OpEvery/2, g.sc.OpEvery*3/2), kind: evOp, tab: tab, gen: tb.gen})
}

func (g *gen) roomStates(tb *gtab) []string {
	out := make([]string, len(tb.rooms))
	for i, r := range tb.rooms {
		out[i] = tb.states[r]
	}
	return out
}

// connect dials a node (first connect or return): postponed past any
// window it would land in.
func (g *gen) connect(tab int) {
	tb := g.tabs[tab]
	t := g.now
	latest := None
	for _, r := range tb.rooms {
		k := g.key(r, tab)
		if !g.returnOK(k, t) {
			latest = max(latest, k.win.Hi)
		}
	}
	nodes := g.eligible(t, -1)
	if latest != None || len(nodes) == 0 {
		at := max(latest, t) + g.uniform(250*time.Millisecond, time.Second)
		tb.returnAt, tb.band = at, Beyond
		g.push(gevent{at: at, kind: evConnect, tab: tab, gen: tb.gen})
		return
	}
	node := nodes[g.rng.IntN(len(nodes))]
	op := Op{At: t, Kind: OpConnect, Node: node, Rooms: slices.Clone(tb.rooms), States: g.roomStates(tb)}
	if tb.ended != None {
		op.Gap, op.Band = t-tb.ended, tb.band
	}
	g.emit(tab, op)
	tb.node, tb.returnAt = node, None
	for _, r := range tb.rooms {
		g.hold(r, tab)
	}
	g.nextOp(tab, t+g.sc.JoinAllowance)
}

func (g *gen) hold(room string, tab int) {
	k := g.key(room, tab)
	k.holders[tab] = true
	delete(k.tails, tab)
	k.win = nil // cancelled (inside) or long announced (beyond)
}

// release ends tab's holds of rooms at t by kind.
func (g *gen) release(tab int, rooms []string, t time.Duration, kind EndKind) {
	for _, r := range rooms {
		k := g.key(r, tab)
		delete(k.holders, tab)
		if kind == Abandon {
			k.tails[tab] = t
		}
		if len(k.holders) == 0 {
			w := g.t.Departure(t, kind, None, tailList(k), k.released)
			k.win = &w
		}
		if kind == Release {
			k.released = t
		}
	}
}

// planReturn schedules a disconnected tab's return, inside its window
// (when there is room for it) or beyond it; at least minGap after its end.
func (g *gen) planReturn(tab int, insideMax, beyondMin, minGap time.Duration) {
	tb := g.tabs[tab]
	var gap time.Duration
	insideMin := 50 * time.Millisecond
	if insideMax > insideMin && minGap == 0 && g.rng.IntN(100) < 55 {
		gap, tb.band = g.uniform(insideMin, insideMax), Inside
		if g.rng.IntN(4) == 0 {
			// At once: the new node's join races the old node's release.
			gap = g.uniform(0, 5*time.Millisecond)
		}
	} else {
		gap, tb.band = max(beyondMin, minGap)+g.uniform(250*time.Millisecond, time.Second), Beyond
	}
	tb.returnAt = tb.ended + gap
	tb.gen++
	g.push(gevent{at: tb.returnAt, kind: evConnect, tab: tab, gen: tb.gen})
}

func (g *gen) kill(slot int) {
	t := g.now
	// Users with a killed tab and a live tab elsewhere in the same room: the
	// live one may close cleanly soon after, while the killed tab stays
	// away. The dead session no longer holds the user once stale
	// (Unrefreshed after the kill): the departure is left, at the grace's
	// end or when it goes stale, whichever is later. Half of these closes
	// come while the dead session may still count as fresh, late enough
	// that it is stale at the grace's end: the departure then comes at the
	// grace's end exactly.
	targeted := map[int]time.Duration{}
	u, ms := g.t.Unrefreshed(), time.Millisecond
	for ti, tb := range g.tabs {
		if tb.node != slot {
			continue
		}
		for _, o := range g.userTabs[tb.user] {
			ot := g.tabs[o]
			if o == ti || ot.node < 0 || ot.node == slot || !shares(tb.rooms, ot.rooms) || g.rng.IntN(3) != 0 {
				continue
			}
			if _, ok := targeted[o]; ok {
				continue
			}
			lo := max(0, u-g.t.Grace) + 100*ms
			if g.rng.IntN(2) == 0 && u-100*ms > lo {
				targeted[o] = t + g.uniform(lo, u-100*ms)
			} else {
				targeted[o] = t + g.uniform(100*ms, u+700*ms)
			}
		}
	}
	for ti, tb := range g.tabs {
		if tb.node != slot {
			continue
		}
		tb.node, tb.ended = -1, t
		g.release(ti, tb.rooms, t, Abandon)
		w := g.t.ExpiryWindow(t)
		minGap := time.Duration(0)
		for _, o := range g.userTabs[tb.user] {
			if c, ok := targeted[o]; ok {
				// Stay away until the targeted close's departure is over.
				w := g.t.Departure(c, Release, None, []Tail{{At: t, Killed: true}}, None)
				minGap = max(minGap, w.Hi-t)
			}
		}
		g.planReturn(ti, w.Lo-t-g.sc.JoinAllowance-100*time.Millisecond, w.Hi-t, minGap)
	}
	for o, at := range targeted {
		ot := g.tabs[o]
		ot.gen++
		g.push(gevent{at: at, kind: evOp, tab: o, gen: ot.gen, forced: OpClose})
	}
}

func shares(a, b []string) bool {
	for _, x := range a {
		if slices.Contains(b, x) {
			return true
		}
	}
	return false
}

// op plans one operation of a connected tab.
func (g *gen) op(tab int, forced OpKind) {
	tb := g.tabs[tab]
	t := g.now
	if tb.node < 0 {
		return
	}
	if t >= g.sc.Duration || (g.sc.MaxOps > 0 && g.plan.Ops >= g.sc.MaxOps) {
		return // done: stays connected to the end
	}
	if g.killSoon(tb.node, t) {
		g.nextOp(tab, t) // its node is about to die: the kill decides
		return
	}
	kind := forced
	if kind == "" {
		kind = g.pick(tab)
	}
	switch kind {
	case OpJoin:
		g.opJoin(tab, t)
	case OpLeave:
		g.opLeave(tab, t)
	case OpState:
		if len(tb.rooms) == 0 {
			break
		}
		r := tb.rooms[g.rng.IntN(len(tb.rooms))]
		s := states[g.rng.IntN(len(states))]
		tb.states[r] = s
		g.emit(tab, Op{At: t, Kind: OpState, Room: r, State: s})
	case OpClose, OpReset:
		if g.opEnd(tab, kind, t) {
			return // its return is planned
		}
	case OpHandover:
		if g.opHandover(tab, t) {
			return // its next op is planned
		}
	}
	g.nextOp(tab, t)
}

// opJoin joins tab to a room it may return to, if any and under its cap.
func (g *gen) opJoin(tab int, t time.Duration) {
	tb := g.tabs[tab]
	var cand []string
	for _, r := range g.plan.Rooms {
		if !slices.Contains(tb.rooms, r) && g.returnOK(g.key(r, tab), t) {
			cand = append(cand, r)
		}
	}
	if len(cand) == 0 || len(tb.rooms) >= g.sc.MaxRooms {
		return
	}
	r := cand[g.rng.IntN(len(cand))]
	tb.rooms = append(tb.rooms, r)
	g.emit(tab, Op{At: t, Kind: OpJoin, Room: r, State: tb.states[r]})
	g.hold(r, tab)
}

// opLeave leaves one of tab's rooms, when its departure may start now.
func (g *gen) opLeave(tab int, t time.Duration) {
	tb := g.tabs[tab]
	if len(tb.rooms) == 0 {
		return
	}
	i := g.rng.IntN(len(tb.rooms))
	r := tb.rooms[i]
	if !g.endOK(tab, []string{r}, t) {
		return
	}
	tb.rooms = slices.Delete(tb.rooms, i, i+1)
	g.emit(tab, Op{At: t, Kind: OpLeave, Room: r})
	g.release(tab, []string{r}, t, Release)
}

// opEnd closes or resets tab's connection, when its departures may start
// now, and plans its return (or none, near the end of the run). It
// reports whether it did.
func (g *gen) opEnd(tab int, kind OpKind, t time.Duration) bool {
	tb := g.tabs[tab]
	if !g.endOK(tab, tb.rooms, t) {
		return false
	}
	g.emit(tab, Op{At: t, Kind: kind})
	tb.node, tb.ended = -1, t
	g.release(tab, tb.rooms, t, Release)
	if t > g.sc.Duration-3*time.Second && g.rng.IntN(100) < 15 {
		tb.gen++ // gone for good: the end of the run has tabs closed too
		return true
	}
	w := g.t.ReleaseWindow(t)
	away := time.Duration(0)
	if g.sc.Duration > time.Minute && g.rng.IntN(100) < 4 {
		away = g.uniform(10*time.Second, 30*time.Second) // a long absence
	}
	g.planReturn(tab, w.Lo-t-g.sc.JoinAllowance, w.Hi-t, away)
	return true
}

// opHandover moves tab to another eligible node, if any, and plans its
// next op once the joins there are allowed for. It reports whether it did.
func (g *gen) opHandover(tab int, t time.Duration) bool {
	tb := g.tabs[tab]
	nodes := g.eligible(t, tb.node)
	if len(nodes) == 0 {
		return false
	}
	n := nodes[g.rng.IntN(len(nodes))]
	g.emit(tab, Op{At: t, Kind: OpHandover, Node: n, Rooms: slices.Clone(tb.rooms), States: g.roomStates(tb)})
	tb.node = n
	g.nextOp(tab, t+g.sc.JoinAllowance)
	return true
}

// pick chooses an operation by weight.
func (g *gen) pick(tab int) OpKind {
	kinds := []OpKind{OpJoin, OpLeave, OpState, OpClose, OpReset, OpHandover}
	weights := []int{12, 8, 30, 14, 12, 10}
	total := 0
	for _, w := range weights {
		total += w
	}
	x := g.rng.IntN(total)
	for i, w := range weights {
		if x < w {
			return kinds[i]
		}
		x -= w
	}
	return OpState
}

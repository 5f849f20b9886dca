package oracle

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"time"
)

// Class is a kind of violation. Every class is counted and reported
// separately; the informational ones do not fail a run.
type Class string

// Violation classes (numbered as in docs/ORACLE.md).
const (
	C0Crash       Class = "0 node exited unexpectedly"
	C1Alternation Class = "1 online/offline do not alternate"
	C1Repeated    Class = "1r repeated online"
	C1Empty       Class = "1z member with no session"
	C2LiveOffline Class = "2 offline while certainly live"
	C3Flicker     Class = "3 offline/online on a return inside the grace"
	C4Missing     Class = "4a departure not announced"
	C4Duplicate   Class = "4b offline announced twice or with no departure"
	C4Early       Class = "4c departure announced too early"
	C4Late        Class = "4d departure announced too late"
	C4Reason      Class = "4e departure with the wrong reason"
	C4Online      Class = "4f arrival not announced once"
	C5DupID       Class = "5 duplicate event id in the stream"
	C5Redelivered Class = "5r redelivered to core subscribers"
	C6Seq         Class = "6 seq gap or repeat in the stream"
	C7StreamCore  Class = "7 stream differs from the core subscriber"
	C8Final       Class = "8 final members differ from the truth"
	C9View        Class = "9 client view differs from a fresh snapshot"
	C9Spurious    Class = "9s spurious resync"
	CUClose       Class = "u unexpected close or failed request"
)

// Classes lists every class in report order.
var Classes = []Class{C0Crash, C1Alternation, C1Repeated, C1Empty, C2LiveOffline, C3Flicker, C4Missing, C4Duplicate,
	C4Early, C4Late, C4Reason, C4Online, C5DupID, C5Redelivered, C6Seq, C7StreamCore, C8Final, C9View,
	C9Spurious, CUClose}

// Informational reports whether a class is reported without failing the
// run: core redelivery is allowed by the bus (a retried publish arrives
// twice), a spurious resync cannot always be told from a needed one, and
// an unexpected close is judged by its consequences in the other classes.
func (c Class) Informational() bool {
	return c == C5Redelivered || c == C9Spurious || c == CUClose
}

// Violation is one broken promise.
type Violation struct {
	Class  Class
	Key    Key // zero when not about one (room, user)
	At     time.Duration
	Detail string
}

func (v Violation) String() string {
	k := ""
	if v.Key != (Key{}) {
		k = " " + v.Key.String()
	}
	return fmt.Sprintf("[%s]%s at %s: %s", v.Class, k, fmtT(v.At), v.Detail)
}

// Check judges a run. It is a pure function of what was recorded.
func Check(r *Run) *Report {
	rep := newReport(r)
	c := checker{r: r, rep: rep, t: r.Timing}
	c.crashes()
	c.streamAndCore()
	c.alternation()
	for _, e := range r.Empty {
		rep.add(Violation{Class: C1Empty, Key: Key{e.Room, e.User}, At: e.At, Detail: fmt.Sprintf("conn %d: a snapshot lists a member with no session", e.Conn)})
	}
	c.presence()
	c.final()
	c.resyncs()
	for _, n := range r.Notes {
		rep.add(Violation{Class: CUClose, At: n.At, Detail: fmt.Sprintf("conn %d: %s", n.Conn, n.What)})
	}
	rep.finish()
	return rep
}

type checker struct {
	r   *Run
	rep *Report
	t   Timing
	// byKey: the stream's events of each key in (epoch, seq) order,
	// deduplicated by id.
	byKey map[Key][]Event
	// byRoom: the stream's events of each room, deduplicated, in (epoch,
	// seq) order.
	byRoom map[string][]Event
}

func (c *checker) crashes() {
	for _, n := range c.r.Nodes {
		if n.Died != None && !n.Killed {
			c.rep.add(Violation{Class: C0Crash, At: n.Died, Detail: fmt.Sprintf("node %d (slot %d) exited on its own: %s", n.ID, n.Slot, n.Exit)})
		}
	}
}

func order(a, b Event) int {
	return cmp.Or(cmp.Compare(a.Epoch, b.Epoch), cmp.Compare(a.Seq, b.Seq), cmp.Compare(a.ID, b.ID))
}

// streamAndCore checks classes 5, 6 and 7 and indexes the stream.
func (c *checker) streamAndCore() {
	seen := map[string]int{}
	var uniq []Event
	for _, e := range c.r.Stream {
		if seen[e.ID]++; seen[e.ID] == 2 {
			c.rep.add(Violation{Class: C5DupID, Key: Key{e.Room, e.User}, At: e.At, Detail: "stream holds id " + e.ID + " more than once"})
		}
		if seen[e.ID] == 1 {
			uniq = append(uniq, e)
		}
	}
	core := map[string]int{}
	first := map[string]Event{}
	for _, e := range c.r.Core {
		if core[e.ID]++; core[e.ID] == 1 {
			first[e.ID] = e
		} else if core[e.ID] == 2 {
			c.rep.add(Violation{Class: C5Redelivered, Key: Key{e.Room, e.User}, At: e.Arrived, Detail: "id " + e.ID + " delivered again"})
		}
	}
	if c.r.CoreDropped == 0 {
		for _, e := range uniq {
			if core[e.ID] == 0 {
				c.rep.add(Violation{Class: C7StreamCore, Key: Key{e.Room, e.User}, At: e.At, Detail: "in the stream, never delivered to the core subscriber: " + e.ID})
			}
		}
		for id, e := range first {
			if seen[id] == 0 {
				c.rep.add(Violation{Class: C7StreamCore, Key: Key{e.Room, e.User}, At: e.Arrived, Detail: "delivered to the core subscriber, not in the stream: " + id})
			}
		}
	} else {
		c.rep.Notes = append(c.rep.Notes, fmt.Sprintf("check 7 void: the core subscriber dropped %d messages (harness too slow)", c.r.CoreDropped))
	}
	c.byKey, c.byRoom = map[Key][]Event{}, map[string][]Event{}
	for _, e := range uniq {
		if e.Arrived == None {
			if f, ok := first[e.ID]; ok {
				e.Arrived = f.Arrived
			}
		}
		c.byKey[Key{e.Room, e.User}] = append(c.byKey[Key{e.Room, e.User}], e)
		c.byRoom[e.Room] = append(c.byRoom[e.Room], e)
		c.rep.Transitions[e.Kind+"/"+e.Reason]++
	}
	for _, es := range c.byKey {
		slices.SortFunc(es, order)
	}
	c.seqRuns()
}

// seqRuns checks class 6: per room and epoch, seq runs 1, 2, 3... with
// no gap and no repeat.
func (c *checker) seqRuns() {
	for room, es := range c.byRoom {
		slices.SortFunc(es, order)
		var epoch int64 = -1
		var want uint64
		for _, e := range es {
			if e.Epoch != epoch {
				epoch, want = e.Epoch, 1
			}
			switch {
			case e.Seq == want-1 && want > 1:
				c.rep.add(Violation{Class: C6Seq, Key: Key{e.Room, e.User}, At: e.At, Detail: fmt.Sprintf("room %s epoch %d: seq %d repeated (%s)", room, epoch, e.Seq, e.ID)})
				continue
			case e.Seq != want:
				c.rep.add(Violation{Class: C6Seq, Key: Key{e.Room, e.User}, At: e.At, Detail: fmt.Sprintf("room %s epoch %d: seq %d follows %d", room, epoch, e.Seq, want-1)})
			}
			want = e.Seq + 1
		}
	}
}

// alternation checks class 1: in (epoch, seq) order each key's onlines
// and offlines alternate, starting with an online, and updates come only
// while the user is a member, and leave them a session (class 1z).
func (c *checker) alternation() {
	for key, es := range c.byKey {
		online := false
		for _, e := range es {
			switch e.Kind {
			case "online":
				if online {
					c.rep.add(Violation{Class: C1Repeated, Key: key, At: e.At, Detail: "online for a user already online: " + e.ID})
				}
				online = true
			case "offline":
				if !online {
					c.rep.add(Violation{Class: C1Alternation, Key: key, At: e.At, Detail: "offline for a user not online: " + e.ID})
				}
				online = false
			case "update":
				if !online {
					c.rep.add(Violation{Class: C1Alternation, Key: key, At: e.At, Detail: "update for a user not online: " + e.ID})
				}
				if e.Sessions == 0 {
					c.rep.add(Violation{Class: C1Empty, Key: key, At: e.At, Detail: fmt.Sprintf("update %s leaves a member with no session: %s", e.Reason, e.ID)})
				}
			}
		}
	}
}

// presence checks classes 2, 3 and 4 against the truth derived from the
// holds.
func (c *checker) presence() {
	spans := Spans(c.r)
	keys := map[Key]bool{}
	for k := range spans {
		keys[k] = true
	}
	for k := range c.byKey {
		keys[k] = true
	}
	for key := range keys {
		c.judgeKey(key, spans[key])
	}
}

func (c *checker) judgeKey(key Key, ss []Span) {
	ps := Periods(ss)
	k := &keyJudge{c: c, key: key, ss: ss, ps: ps, gs: c.t.Gaps(ss, ps)}
	var offs, ons []Event
	for _, e := range c.byKey[key] {
		switch e.Kind {
		case "offline":
			offs = append(offs, e)
		case "online":
			ons = append(ons, e)
		}
	}
	gapOffs := k.placeOffs(offs)
	startOns := k.placeOns(ons)
	// The first period's start must be announced once.
	if len(ps) > 0 {
		if n := len(startOns[0]); n != 1 && !(n == 0 && c.uncertainBefore(ss, ps[0])) {
			c.rep.add(Violation{Class: C4Online, Key: key, At: ps[0].Start, Detail: fmt.Sprintf("first join (sent %s, acked %s) announced %d times", fmtT(ps[0].Send), fmtT(ps[0].Start), n)})
		}
	}
	for gi, g := range k.gs {
		c.judgeGap(key, ss, ps, g, gapOffs[gi], startOnsOf(startOns, g.Next))
	}
}

// keyJudge is what judgeKey knows of one key: its spans, the periods they
// make and the gaps between them.
type keyJudge struct {
	c   *checker
	key Key
	ss  []Span
	ps  []Period
	gs  []Gap
}

// gapOf returns the gap an offline at at belongs to: the last one that
// starts (less a margin) at or before it and whose return is not
// acknowledged (plus a margin) before it; -1 if none.
func (k *keyJudge) gapOf(at time.Duration) int {
	m := k.c.t.Margin
	best := -1
	for gi, g := range k.gs {
		p := k.ps[g.After]
		if at < p.End-m {
			continue
		}
		if g.Next >= 0 && at > k.ps[g.Next].Start+m {
			continue
		}
		best = gi
	}
	return best
}

// inUncertain reports whether at lies in an unacknowledged join's span.
func (k *keyJudge) inUncertain(at time.Duration) bool {
	t, m := k.c.t, k.c.t.Margin
	for _, s := range k.ss {
		if !s.Certain && at >= s.Send-m && (s.End == None || at <= s.End+t.Settled()) {
			return true
		}
	}
	return false
}

// placeOffs sorts the key's offlines into the gaps they belong to,
// reporting those that belong to none (or lie inside a held period).
func (k *keyJudge) placeOffs(offs []Event) [][]Event {
	c, key, ps, m := k.c, k.key, k.ps, k.c.t.Margin
	gapOffs := make([][]Event, len(k.gs))
	for _, e := range offs {
		if pi := heldAt(ps, e.At, m); pi >= 0 {
			c.rep.add(Violation{Class: C2LiveOffline, Key: key, At: e.At, Detail: fmt.Sprintf("%s %s while held since %s (%s)", e.Kind, e.Reason, fmtT(ps[pi].Start), e.ID)})
			continue
		}
		if gi := k.gapOf(e.At); gi >= 0 {
			gapOffs[gi] = append(gapOffs[gi], e)
			continue
		}
		if k.inUncertain(e.At) {
			c.rep.ambiguous("offline near an unacknowledged join", key, e.ID)
			continue
		}
		c.rep.add(Violation{Class: C4Duplicate, Key: key, At: e.At, Detail: fmt.Sprintf("offline %s with no departure in progress (%s)", e.Reason, e.ID)})
	}
	return gapOffs
}

// placeOns sorts the key's onlines into the periods they announce: a
// period from its first join sent (less a margin) to its first
// acknowledgement (plus a margin). Those that announce none are reported.
func (k *keyJudge) placeOns(ons []Event) [][]Event {
	c, key, ps, m := k.c, k.key, k.ps, k.c.t.Margin
	startOns := make([][]Event, len(ps))
	for _, e := range ons {
		// The first period whose start it can announce, preferring one not
		// announced yet: joins sent together may be acknowledged in any
		// order, and the first to touch the store announces.
		pi := -1
		for i, p := range ps {
			if e.At >= p.Send-m && e.At <= p.Start+m {
				if pi < 0 || len(startOns[pi]) > 0 && len(startOns[i]) == 0 {
					pi = i
				}
			}
		}
		if pi >= 0 {
			startOns[pi] = append(startOns[pi], e)
			continue
		}
		if heldAt(ps, e.At, m) >= 0 {
			continue // the user was online already: class 1r has it
		}
		if k.inUncertain(e.At) {
			c.rep.ambiguous("online of an unacknowledged join", key, e.ID)
			continue
		}
		c.rep.add(Violation{Class: C4Online, Key: key, At: e.At, Detail: fmt.Sprintf("online with no join (%s)", e.ID)})
	}
	return startOns
}

func startOnsOf(s [][]Event, i int) []Event {
	if i < 0 {
		return nil
	}
	return s[i]
}

// uncertainBefore reports an unacknowledged join just before p, which may
// have announced the online that p's start would have.
func (c *checker) uncertainBefore(ss []Span, p Period) bool {
	for _, s := range ss {
		if !s.Certain && s.Send <= p.Start && (s.End == None || s.End+c.t.Settled() >= p.Send) {
			return true
		}
	}
	return false
}

// heldAt returns the period in which at lies, a margin away from both
// ends, or -1.
func heldAt(ps []Period, at, m time.Duration) int {
	for i, p := range ps {
		if at > p.Start+m && (p.End == None || at < p.End-m) {
			return i
		}
	}
	return -1
}

func (c *checker) judgeGap(key Key, ss []Span, ps []Period, g Gap, offs, ons []Event) {
	w := g.Window
	p := ps[g.After]
	what := fmt.Sprintf("%s at %s", p.Kind, fmtT(p.End))
	if g.Next >= 0 {
		n := ps[g.Next]
		what += fmt.Sprintf(", return sent %s acked %s", fmtT(n.Send), fmtT(n.Start))
	}
	if g.Uncertain {
		c.rep.ambiguous("departure around an unacknowledged join", key, what)
		if len(offs) > 1 {
			c.rep.add(Violation{Class: C4Duplicate, Key: key, At: offs[1].At, Detail: fmt.Sprintf("%d offlines after %s", len(offs), what)})
		}
		return
	}
	ret := g.Return
	if !w.Certain && ret != Silent {
		c.rep.ambiguous(w.Why, key, what)
	}
	if ret == EitherReturn {
		c.rep.ambiguous("return inside the departure window", key, what+", window "+w.String())
	}
	if g.Next < 0 && w.Hi > c.r.End {
		c.rep.ambiguous("departure unresolved at the end of the run", key, what)
		if len(offs) > 1 {
			c.rep.add(Violation{Class: C4Duplicate, Key: key, At: offs[1].At, Detail: fmt.Sprintf("%d offlines after %s", len(offs), what)})
		}
		return
	}
	if ret == Silent {
		for _, e := range offs {
			c.rep.add(Violation{Class: C3Flicker, Key: key, At: e.At, Detail: fmt.Sprintf("offline %s (%s) for a return certainly inside the window %s: %s", e.Reason, e.ID, w, what)})
		}
		if len(offs) == 0 && len(ons) > 0 {
			c.rep.add(Violation{Class: C3Flicker, Key: key, At: ons[0].At, Detail: fmt.Sprintf("online (%s) for a return certainly inside the window %s: %s", ons[0].ID, w, what)})
		}
		return
	}
	must := ret == Flicker || ret == 0
	switch {
	case len(offs) == 0 && must:
		c.rep.add(Violation{Class: C4Missing, Key: key, At: w.Hi, Detail: fmt.Sprintf("no offline in %s after %s", w, what)})
	case len(offs) > 1:
		c.rep.add(Violation{Class: C4Duplicate, Key: key, At: offs[1].At, Detail: fmt.Sprintf("%d offlines (%s, %s) after %s", len(offs), offs[0].ID, offs[1].ID, what)})
	}
	if len(offs) > 0 {
		c.judgeOffline(key, p, w, what, offs[0])
	}
	if g.Next >= 0 {
		c.judgeReturn(key, ps[g.Next], ret, what, offs, ons)
	}
}

// judgeOffline judges the first offline e of a departure: its reason,
// its time against the window w, and its latency when w is certain.
func (c *checker) judgeOffline(key Key, p Period, w Window, what string, e Event) {
	arr := e.Arrived
	if arr == None {
		arr = e.At
	}
	announced := arr
	if e.Stored != None && e.Stored < announced {
		announced = e.Stored
	}
	if !w.Reasons.Has(e.Reason) {
		c.rep.add(Violation{Class: C4Reason, Key: key, At: e.At, Detail: fmt.Sprintf("offline %s, want %s, after %s (%s)", e.Reason, w.Reasons, what, e.ID)})
	}
	if e.At < w.Lo {
		c.rep.add(Violation{Class: C4Early, Key: key, At: e.At, Detail: fmt.Sprintf("offline %s at %s, window %s, after %s (%s)", e.Reason, fmtT(e.At), w, what, e.ID)})
	}
	if announced > w.Hi && c.diedNear(e.At) && announced <= e.At+c.t.Lease+c.t.Reap+c.t.Margin {
		// Settled in time by a node that died before publishing it: a
		// reaper publishes it after the lease, as designed.
		c.rep.ambiguous("offline published after the lease, its producer killed", key, e.ID)
	} else if announced > w.Hi {
		c.rep.add(Violation{Class: C4Late, Key: key, At: e.At, Detail: fmt.Sprintf("offline %s stored %s arrived %s, window %s, after %s (%s)", e.Reason, fmtT(e.Stored), fmtT(e.Arrived), w, what, e.ID)})
	}
	if w.Certain && w.Reasons.Has(e.Reason) {
		switch p.Kind {
		case Release:
			c.rep.LatencyLeft = append(c.rep.LatencyLeft, arr-p.End)
		case Abandon:
			if c.killedAt(p.End) {
				c.rep.LatencyKilled = append(c.rep.LatencyKilled, arr-p.End)
			}
		}
	}
}

// judgeReturn judges the onlines of the return n after a departure: a
// return after an announced departure is announced once; one after a
// cancelled departure not at all.
func (c *checker) judgeReturn(key Key, n Period, ret ReturnKind, what string, offs, ons []Event) {
	want := min(len(offs), 1)
	if ret == Flicker {
		want = 1
	}
	if len(ons) != want {
		at := n.Start
		if len(ons) > 0 {
			at = ons[0].At
		}
		c.rep.add(Violation{Class: C4Online, Key: key, At: at, Detail: fmt.Sprintf("return announced %d times after %d offlines (want %d): %s", len(ons), len(offs), want, what)})
	}
}

// diedNear reports whether a node died within a margin of at.
func (c *checker) diedNear(at time.Duration) bool {
	for _, n := range c.r.Nodes {
		if n.Died != None && n.Died >= at-c.t.Margin && n.Died <= at+c.t.Margin {
			return true
		}
	}
	return false
}

// killedAt reports whether a node was killed (or crashed) at d: a span
// abandoned then was abandoned by a dead node, not by a 4001.
func (c *checker) killedAt(d time.Duration) bool {
	for _, n := range c.r.Nodes {
		if n.Died == d {
			return true
		}
	}
	return false
}

// final checks class 8 (the query service and a fresh snapshot against the
// truth) and class 9 (every open client's view against the fresh
// snapshot).
func (c *checker) final() {
	f := c.r.Final
	for _, e := range f.Errors {
		c.rep.add(Violation{Class: C8Final, At: f.At, Detail: "final read failed: " + e})
	}
	if f.Query == nil && f.Fresh == nil {
		return
	}
	truth := FinalMembers(c.r)
	if f.Query != nil {
		for _, d := range DiffMembers(truth, f.Query, "") {
			c.rep.add(Violation{Class: C8Final, At: f.At, Detail: "query service: " + d})
		}
	}
	if f.Fresh == nil {
		return
	}
	for _, d := range DiffMembers(truth, f.Fresh, "") {
		c.rep.add(Violation{Class: C8Final, At: f.At, Detail: "fresh snapshot: " + d})
	}
	for _, v := range f.Views {
		want := f.Fresh[v.Room]
		for _, d := range DiffMembers(map[string]Members{v.Room: want}, map[string]Members{v.Room: v.Members}, f.Observer) {
			c.rep.add(Violation{Class: C9View, At: f.At, Detail: fmt.Sprintf("conn %d: %s", v.Conn, d)})
		}
	}
}

// DiffMembers lists how got differs from want, room by room: users missing
// or extra, and for users in both, sessions missing or extra and states
// that differ. Users named skip are ignored (the observer, in a view).
func DiffMembers(want, got map[string]Members, skip string) []string {
	rooms := map[string]bool{}
	for r := range want {
		rooms[r] = true
	}
	for r := range got {
		rooms[r] = true
	}
	var out []string
	for _, room := range sortedKeys(rooms) {
		w, g := want[room], got[room]
		users := map[string]bool{}
		for u := range w {
			users[u] = true
		}
		for u := range g {
			users[u] = true
		}
		for _, u := range sortedKeys(users) {
			if u == skip {
				continue
			}
			ws, inW := w[u]
			gs, inG := g[u]
			switch {
			case !inG:
				out = append(out, fmt.Sprintf("room %s: %s missing (sessions %v)", room, u, sessionList(ws)))
				continue
			case !inW:
				out = append(out, fmt.Sprintf("room %s: %s should not be a member (sessions %v)", room, u, sessionList(gs)))
				continue
			}
			sids := map[string]bool{}
			for s := range ws {
				sids[s] = true
			}
			for s := range gs {
				sids[s] = true
			}
			for _, sid := range sortedKeys(sids) {
				wst, inW := ws[sid]
				gst, inG := gs[sid]
				switch {
				case !inG:
					out = append(out, fmt.Sprintf("room %s: %s/%s session missing", room, u, sid))
				case !inW:
					out = append(out, fmt.Sprintf("room %s: %s/%s session should not be live", room, u, sid))
				case wst != gst:
					out = append(out, fmt.Sprintf("room %s: %s/%s state %q, want %q", room, u, sid, gst, wst))
				}
			}
		}
	}
	return out
}

func sessionList(m map[string]string) []string { return sortedKeys(m) }

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// resyncs counts resync snapshots and flags the spurious ones: the client
// had every seq up to its base, and every seq the resync covered beyond it
// had reached the bus more than a gap timeout before it, so the node had
// no missing seq to wait for.
func (c *checker) resyncs() {
	for _, rs := range c.r.Resyncs {
		c.rep.Resyncs++
		if !rs.Contiguous || rs.SnapEpoch != rs.Epoch {
			continue
		}
		late := ""
		for _, e := range c.byRoom[rs.Room] {
			if e.Epoch != rs.Epoch || e.Seq <= rs.Base || e.Seq > rs.SnapSeq {
				continue
			}
			if e.Arrived == None || e.Arrived > rs.At-c.t.GapTimeout {
				late = e.ID
				break
			}
		}
		if late == "" {
			c.rep.add(Violation{Class: C9Spurious, At: rs.At, Detail: fmt.Sprintf("conn %d room %s: resync at seq %d to %d, nothing was missing", rs.Conn, rs.Room, rs.Base, rs.SnapSeq)})
		}
	}
}

// Context returns, for a violation about one key, the spans and the events
// of that key within window of the violation, as lines to print.
func Context(r *Run, v Violation, window time.Duration) []string {
	if v.Key == (Key{}) {
		return nil
	}
	var lines []string
	for _, s := range Spans(r)[v.Key] {
		if s.End != None && s.End < v.At-window || s.Send > v.At+window {
			continue
		}
		c := r.Conns[s.Conn]
		ack := fmtT(s.Start)
		if !s.Certain {
			ack = "never"
		}
		lines = append(lines, fmt.Sprintf("  hold conn %d session %s node %d: join sent %s acked %s, ended %s (%s; conn %s %d at %s)",
			s.Conn, s.Session, s.Node, fmtT(s.Send), ack, fmtT(s.End), s.Kind, c.How, c.Code, fmtT(c.End)))
	}
	for _, n := range r.Nodes {
		if n.Died != None && n.Died > v.At-window && n.Died < v.At+window {
			lines = append(lines, fmt.Sprintf("  node %d (slot %d) died at %s (killed %v)", n.ID, n.Slot, fmtT(n.Died), n.Killed))
		}
	}
	arrived := map[string]time.Duration{}
	for _, e := range r.Core {
		if _, ok := arrived[e.ID]; !ok {
			arrived[e.ID] = e.Arrived
		}
	}
	var evs []Event
	for _, e := range r.Stream {
		if e.Room == v.Key.Room && e.User == v.Key.User && e.At > v.At-window && e.At < v.At+window {
			if a, ok := arrived[e.ID]; ok {
				e.Arrived = a
			}
			evs = append(evs, e)
		}
	}
	slices.SortFunc(evs, order)
	for _, e := range evs {
		extra := ""
		if e.Kind == "update" {
			extra = fmt.Sprintf(" session=%s state=%s", e.Session, cmp.Or(e.State, "null"))
		}
		lines = append(lines, fmt.Sprintf("  event seq %d %s %s at %s stored %s arrived %s sessions=%d %s%s", e.Seq, e.Kind, e.Reason,
			fmtT(e.At), fmtT(e.Stored), fmtT(e.Arrived), e.Sessions, e.ID, extra))
	}
	return lines
}

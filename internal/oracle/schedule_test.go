package oracle

import (
	"reflect"
	"testing"
	"time"
)

func scenario(seed int64, tm Timing) Scenario {
	return Scenario{Seed: seed, Timing: tm, Nodes: 3, Users: 45, Rooms: 4, MaxTabs: 3, MaxRooms: 3,
		Duration: 7 * time.Second, OpEvery: 1500 * time.Millisecond, FirstKill: 2500 * time.Millisecond,
		RestartMin: 2 * time.Second, RestartMax: 3 * time.Second, JoinAllowance: 450 * time.Millisecond}
}

func longScenario(seed int64, tm Timing) Scenario {
	return Scenario{Seed: seed, Timing: tm, Nodes: 3, Users: 60, Rooms: 10, MaxTabs: 3, MaxRooms: 3,
		Duration: time.Hour, OpEvery: time.Second, MaxOps: 20000, FirstKill: 20 * time.Second, KillEvery: 40 * time.Second,
		RestartMin: 3 * time.Second, RestartMax: 6 * time.Second, JoinAllowance: 450 * time.Millisecond}
}

func TestGenerateIsDeterministic(t *testing.T) {
	a, b := Generate(scenario(7, TimingA)), Generate(scenario(7, TimingA))
	if !reflect.DeepEqual(a, b) {
		t.Fatal("two plans of one seed differ")
	}
	if c := Generate(scenario(8, TimingA)); reflect.DeepEqual(a.Tabs, c.Tabs) {
		t.Fatal("two seeds gave the same plan")
	}
	kinds := map[OpKind]int{}
	for _, tb := range a.Tabs {
		for _, op := range tb.Ops {
			kinds[op.Kind]++
		}
	}
	for _, op := range a.Nodes {
		kinds[op.Kind]++
	}
	for _, k := range []OpKind{OpConnect, OpJoin, OpLeave, OpState, OpClose, OpReset, OpHandover, OpKill, OpRestart} {
		if kinds[k] == 0 {
			t.Errorf("no %s in the plan: %v", k, kinds)
		}
	}
	t.Logf("%d tabs, %d ops: %v", len(a.Tabs), a.Ops, kinds)
}

// idealRun carries a plan out on paper: every operation at its planned
// time, every join acknowledged 20ms after it is sent, every handover's old
// connection closed with 4001 at once.
func idealRun(p *Plan) *Run {
	ms := time.Millisecond
	r := &Run{Timing: p.Scenario.Timing, End: time.Duration(1 << 62)}
	type life struct {
		from time.Duration
		id   int
	}
	slots := make([][]life, p.Scenario.Nodes)
	for s := range slots {
		r.Nodes = append(r.Nodes, Node{ID: s, Slot: s, Died: None})
		slots[s] = []life{{0, s}}
	}
	for _, op := range p.Nodes {
		cur := slots[op.Node][len(slots[op.Node])-1].id
		switch op.Kind {
		case OpKill:
			r.Nodes[cur].Died, r.Nodes[cur].Killed = op.At, true
		case OpRestart:
			id := len(r.Nodes)
			r.Nodes = append(r.Nodes, Node{ID: id, Slot: op.Node, Started: op.At, Died: None})
			slots[op.Node] = append(slots[op.Node], life{op.At, id})
		}
	}
	nodeAt := func(slot int, t time.Duration) int {
		id := -1
		for _, l := range slots[slot] {
			if l.from <= t {
				id = l.id
			}
		}
		return id
	}
	open := func(tb *Tab, slot int, at time.Duration, rooms []string) int {
		id := len(r.Conns)
		c := Conn{ID: id, User: tb.User, Session: tb.Session, Node: nodeAt(slot, at), Dialed: at, Opened: at, End: None}
		for _, room := range rooms {
			c.Holds = append(c.Holds, Hold{Room: room, JoinSent: at + ms, JoinAcked: at + 20*ms, LeaveSent: None})
		}
		r.Conns = append(r.Conns, c)
		return id
	}
	for ti := range p.Tabs {
		tb := &p.Tabs[ti]
		cur := -1
		for _, op := range tb.Ops {
			switch op.Kind {
			case OpConnect:
				cur = open(tb, op.Node, op.At, op.Rooms)
			case OpHandover:
				old := cur
				cur = open(tb, op.Node, op.At, op.Rooms)
				if r.Conns[old].End == None {
					r.Conns[old].End, r.Conns[old].How, r.Conns[old].Code = op.At+2*ms, ServerClosed, CodeSessionMoved
				}
			case OpJoin:
				r.Conns[cur].Holds = append(r.Conns[cur].Holds, Hold{Room: op.Room, JoinSent: op.At, JoinAcked: op.At + 20*ms, LeaveSent: None})
			case OpLeave:
				hs := r.Conns[cur].Holds
				for i := range hs {
					if hs[i].Room == op.Room && hs[i].LeaveSent == None {
						hs[i].LeaveSent = op.At
					}
				}
			case OpClose, OpReset:
				how := Closed
				if op.Kind == OpReset {
					how = Reset
				}
				r.Conns[cur].End, r.Conns[cur].How = op.At, how
			}
		}
	}
	for i := range r.Conns {
		c := &r.Conns[i]
		if d := r.Nodes[c.Node].Died; d != None && (c.End == None || c.End > d) {
			c.End, c.How = d+ms, Dropped
		}
	}
	return r
}

// Every departure of a plan carried out as planned is certain, and every
// return is certainly inside or certainly beyond its window: the schedule
// and the checker agree on the bands.
func TestPlansAvoidAmbiguousBands(t *testing.T) {
	for _, sc := range []Scenario{
		scenario(1, TimingA), scenario(2, TimingB), scenario(3, TimingA), scenario(4, TimingB),
		longScenario(5, TimingA), longScenario(6, TimingB),
	} {
		p := Generate(sc)
		r := idealRun(p)
		gaps, bad := 0, 0
		for key, ss := range Spans(r) {
			for _, s := range ss {
				if !s.Certain {
					t.Fatalf("seed %d %s: uncertain span %+v", sc.Seed, key, s)
				}
			}
			ps := Periods(ss)
			for _, g := range sc.Timing.Gaps(ss, ps) {
				gaps++
				if g.Return == EitherReturn || !g.Window.Certain && g.Return != Silent {
					bad++
					if bad <= 5 {
						p := ps[g.After]
						t.Errorf("seed %d %s: %s at %v, window %v, return %v", sc.Seed, key, p.Kind, p.End, g.Window, g.Return)
					}
				}
			}
		}
		t.Logf("seed %d: %d ops, %d conns, %d departures, %d ambiguous", sc.Seed, p.Ops, len(r.Conns), gaps, bad)
		if gaps == 0 {
			t.Errorf("seed %d: no departures", sc.Seed)
		}
	}
}

// Plans hold the interleaving of a clean close beside a killed session:
// the user's last live tab closes less than Unrefreshed after the kill of
// another of their tabs, late enough that the dead session is stale at the
// grace's end. Its departure is certain: left, at the grace's end.
func TestPlansHoldTheStaleInterleaving(t *testing.T) {
	for _, sc := range []Scenario{scenario(1, TimingA), scenario(2, TimingB), longScenario(5, TimingA), longScenario(6, TimingB)} {
		tm := sc.Timing
		r := idealRun(Generate(sc))
		n := 0
		for _, ss := range Spans(r) {
			ps := Periods(ss)
			for _, g := range tm.Gaps(ss, ps) {
				p := ps[g.After]
				if p.Kind != Release {
					continue
				}
				for _, l := range Tails(ss, p.End) {
					if l.Killed && p.End-l.At < tm.Unrefreshed() && p.End+tm.Grace > l.At+tm.Unrefreshed() {
						n++
						if w := g.Window; !w.Certain || w.Reasons != Left || w.Hi != p.End+tm.Grace+tm.Reap+tm.Margin {
							t.Errorf("seed %d: close %v after a kill at %v: window %v, want left at the grace's end", sc.Seed, p.End, l.At, w)
						}
					}
				}
			}
		}
		t.Logf("seed %d: %d closes beside a session going stale", sc.Seed, n)
		if n == 0 {
			t.Errorf("seed %d: no close beside a session going stale", sc.Seed)
		}
	}
}

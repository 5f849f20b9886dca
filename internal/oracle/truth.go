package oracle

import (
	"cmp"
	"slices"
	"sort"
	"time"
)

// Key is one (room, user): presence is judged per key.
type Key struct{ Room, User string }

func (k Key) String() string { return k.Room + "/" + k.User }

// Span is one hold as the oracle judges it: from the join's
// acknowledgement (the session is then certainly held) to the moment the
// node stopped holding it, and how.
type Span struct {
	Conn    int
	Session string
	Node    int
	Send    time.Duration // join sent
	Start   time.Duration // join acknowledged; Send when Certain is false
	// Certain is false when the join was never acknowledged: the session
	// may or may not have reached the store.
	Certain bool
	End     time.Duration // None: still held at the end of the run
	Kind    EndKind
	K       time.Duration // the node's death, for Either
	// Killed: the hold ended with its node's death (K), so the node wrote
	// nothing of it later.
	Killed bool
}

// holdEnd decides when and how the node stopped holding h. A release (a
// leave, or a close the client or the node made) counts unless the node
// had died first; one sent within a margin before the death may have been
// lost with it (Either). A session the node kept (4001, 1001, 1012), or
// held when it died, is abandoned.
func holdEnd(r *Run, c *Conn, h *Hold) (end time.Duration, kind EndKind, k time.Duration) {
	died := r.Nodes[c.Node].Died
	m := r.Timing.Margin
	rel := None
	switch {
	case h.LeaveSent != None:
		rel = h.LeaveSent
	case c.How == Closed || c.How == Reset:
		rel = c.End
	case c.How == ServerClosed && !keeps(c.Code):
		rel = c.End
	case c.How == Dropped && (died == None || died > c.End):
		rel = c.End // the node lives: it saw the connection fail and released
	}
	if rel != None {
		switch {
		case died != None && died <= rel:
			return died, Abandon, died
		case died != None && died <= rel+m:
			return rel, Either, died
		}
		return rel, Release, None
	}
	if c.How == ServerClosed {
		e := c.End
		if died != None && died < e {
			e = died
		}
		return e, Abandon, e
	}
	if died != None {
		return died, Abandon, died
	}
	return None, 0, None
}

func keeps(code int) bool {
	return code == CodeSessionMoved || code == CodeGoingAway || code == CodeRestart
}

// Spans returns every hold of the run as spans, per key, ordered by start.
func Spans(r *Run) map[Key][]Span {
	out := map[Key][]Span{}
	for ci := range r.Conns {
		c := &r.Conns[ci]
		for hi := range c.Holds {
			h := &c.Holds[hi]
			end, kind, k := holdEnd(r, c, h)
			died := r.Nodes[c.Node].Died
			s := Span{Conn: c.ID, Session: c.Session, Node: c.Node, Send: h.JoinSent, Start: h.JoinAcked,
				Certain: h.JoinAcked != None, End: end, Kind: kind, K: k, Killed: kind != Release && died != None && k == died}
			// A node that closed the connection itself (slow consumer, rate
			// limit...) or dropped it released the session when it decided
			// to, which may be well before the client read it: the end is
			// not known, so neither is the hold.
			unsure := (c.How == ServerClosed || c.How == Dropped) && kind == Release && h.LeaveSent == None
			if !s.Certain || unsure || (s.End != None && s.Start >= s.End) {
				// Acknowledged after it ended (the node died under it):
				// as uncertain as never.
				s.Start, s.Certain = s.Send, false
			}
			key := Key{h.Room, c.User}
			out[key] = append(out[key], s)
		}
	}
	for _, ss := range out {
		sort.SliceStable(ss, func(i, j int) bool { return ss[i].Start < ss[j].Start })
	}
	return out
}

// Period is a stretch of time during which some session of the user in the
// room was certainly held: a union of overlapping certain spans.
type Period struct {
	Start time.Duration // first acknowledgement
	Send  time.Duration // earliest join sent among its spans
	End   time.Duration // None: held at the end of the run
	Kind  EndKind       // how its last span ended
	// Killed: its last span ended with its node's death.
	Killed bool
	K      time.Duration
	Spans  []int // indexes into the key's spans
}

// Periods merges the certain spans of one key.
func Periods(ss []Span) []Period {
	var ps []Period
	for i, s := range ss {
		if !s.Certain {
			continue
		}
		if n := len(ps); n > 0 && (ps[n-1].End == None || s.Start <= ps[n-1].End) {
			p := &ps[n-1]
			p.Spans = append(p.Spans, i)
			p.Send = min(p.Send, s.Send)
			if p.End != None && (s.End == None || s.End > p.End) {
				p.End, p.Kind, p.K, p.Killed = s.End, s.Kind, s.K, s.Killed
			}
			continue
		}
		ps = append(ps, Period{Start: s.Start, Send: s.Send, End: s.End, Kind: s.Kind, K: s.K, Killed: s.Killed, Spans: []int{i}})
	}
	return ps
}

// Gap is the time between a period's end and the next period's start (or
// the end of the run): a departure is in progress, then announced, or
// cancelled by a return.
type Gap struct {
	After  int // the period it follows
	Next   int // the period that returns, -1 if none
	Window Window
	Return ReturnKind // 0 without a return
	// Uncertain is set when an unacknowledged join falls in the gap: it may
	// have held the user or not, so the gap is judged leniently.
	Uncertain bool
}

// Tails returns the abandoned sessions of a key that nothing had taken up
// again by time e: per session, its last certain span ending by e, if
// that one was abandoned.
func Tails(ss []Span, e time.Duration) []Tail {
	last := map[string]Span{}
	for _, s := range ss {
		if !s.Certain || s.End == None || s.End > e {
			continue
		}
		if l, ok := last[s.Session]; !ok || s.End > l.End {
			last[s.Session] = s
		}
	}
	var out []Tail
	for _, s := range last {
		switch s.Kind {
		case Abandon:
			out = append(out, Tail{At: s.End, Killed: s.Killed})
		case Either:
			out = append(out, Tail{At: s.K, Killed: true})
		}
	}
	slices.SortFunc(out, func(a, b Tail) int { return cmp.Compare(a.At, b.At) })
	return out
}

// LastRelease is the latest clean close of a certain span of a key by
// time e (a release, or one sent as its node died) that no later join of
// the key cancelled (a join of any session cancels a pending departure),
// None if none. A close of a connection whose session another connection
// held already (a handover) released nothing, and does not count.
func LastRelease(ss []Span, e time.Duration) time.Duration {
	out := None
	for i, s := range ss {
		if s.Certain && (s.Kind == Release || s.Kind == Either) && s.End != None && s.End <= e && !heldOn(ss, i) {
			out = max(out, s.End)
		}
	}
	for _, s := range ss {
		if out != None && s.Certain && s.Start > out && s.Start <= e {
			return None
		}
	}
	return out
}

// heldOn reports whether another certain span of span i's session held it
// when span i ended.
func heldOn(ss []Span, i int) bool {
	s := ss[i]
	for j, o := range ss {
		if j != i && o.Certain && o.Session == s.Session && o.Start <= s.End && (o.End == None || o.End > s.End) {
			return true
		}
	}
	return false
}

// Gaps derives, for one key, the departure window after every period that
// ends, and what the return (if any) must look like.
func (t Timing) Gaps(ss []Span, ps []Period) []Gap {
	var gs []Gap
	for i, p := range ps {
		if p.End == None {
			continue
		}
		// A clean close pending when the last session was abandoned counts
		// only if that session's node died: a 4001 means another node's
		// join took it, which cancels the pending departure.
		released := None
		if p.Kind != Abandon || p.Killed {
			released = LastRelease(ss, p.End)
		}
		g := Gap{After: i, Next: -1, Window: t.Departure(p.End, p.Kind, p.K, Tails(ss, p.End), released)}
		to := None
		if i+1 < len(ps) {
			g.Next = i + 1
			n := ps[i+1]
			g.Return = g.Window.Return(n.Send, n.Start)
			to = n.Start
		}
		for _, s := range ss {
			if !s.Certain && s.Send <= max(g.Window.Hi, to) && (s.End == None || s.End >= p.End-t.Margin) {
				g.Uncertain = true
			}
		}
		gs = append(gs, g)
	}
	return gs
}

// FinalMembers is the truth at the end of the run: per room, the users with
// a session still held, each held session and its last acknowledged state.
func FinalMembers(r *Run) map[string]Members {
	out := map[string]Members{}
	for key, ss := range Spans(r) {
		for _, s := range ss {
			if !s.Certain || s.End != None {
				continue
			}
			ms := out[key.Room]
			if ms == nil {
				ms = Members{}
				out[key.Room] = ms
			}
			if ms[key.User] == nil {
				ms[key.User] = map[string]string{}
			}
			ms[key.User][s.Session] = lastState(r, key, s.Session)
		}
	}
	return out
}

// lastState is the last acknowledged state of a session in a room, over
// all its connections ("" for none).
func lastState(r *Run, key Key, session string) string {
	at, st := None, ""
	for _, c := range r.Conns {
		if c.User != key.User || c.Session != session {
			continue
		}
		for _, s := range c.States {
			if s.Room == key.Room && s.Acked != None && s.Acked > at {
				at, st = s.Acked, s.State
			}
		}
	}
	return st
}

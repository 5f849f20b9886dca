package region

import (
	"strconv"
	"time"

	"github.com/presence-dev/presence/presence"
)

// heldAt is the incarnation a session was last written in, and when.
type heldAt struct {
	inc string
	at  time.Time
}

// noteHeld records the incarnation the sessions of a successful claim or
// refresh were written in (all but the lost ones, which this store no
// longer holds).
func (s *Store) noteHeld(refs, lost []presence.SessionRef) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range refs {
		s.held[r] = heldAt{inc: s.incs[s.indexKey(r.Room)], at: now}
	}
	for _, r := range lost {
		delete(s.held, r)
	}
}

// expectedIncs is, per reap index key of refs, the incarnation a touch
// expects to find: the oldest refs were last written in, so that if Redis
// lost their data since, the touch restores them (see touch.lua).
func (s *Store) expectedIncs(refs []presence.SessionRef) map[string]string {
	out := map[string]string{}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range refs {
		k := s.indexKey(r.Room)
		inc := s.incs[k]
		if h, ok := s.held[r]; ok && h.inc != "" {
			inc = h.inc
		}
		if cur, ok := out[k]; !ok || (inc != "" && (cur == "" || olderInc(inc, cur))) {
			out[k] = inc
		}
	}
	return out
}

// olderInc compares incarnations, which are creation times in ms.
func olderInc(a, b string) bool {
	x, _ := strconv.ParseInt(a, 10, 64)
	y, _ := strconv.ParseInt(b, 10, 64)
	return x < y
}

// heldInc is the incarnation ref was last written in by this store, or
// the slot's latest if it has not written it.
func (s *Store) heldInc(ref presence.SessionRef) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h, ok := s.held[ref]; ok {
		return h.inc
	}
	return s.incs[s.indexKey(ref.Room)]
}

// sawIncarnation records a slot's incarnation from a script's reply. A
// change means Redis lost that slot's data since this store last wrote
// there; the script has already restored what it could.
func (s *Store) sawIncarnation(idx, inc string) {
	if inc == "" {
		return
	}
	s.mu.Lock()
	prev := s.incs[idx]
	s.incs[idx] = inc
	s.mu.Unlock()
	if prev != "" && prev != inc {
		s.stats.DataLosses.Add(1)
		s.renewSoon() // the registry may have gone with the data (holders.go)
		s.log.Warn("presence: the region's Redis lost its data; this node restores the sessions it holds", "region", s.opt.Region, "index", idx)
	}
}

package region

import (
	"context"

	"github.com/presence-dev/presence/presence"
)

// Extend keeps the sessions of clients waiting to be admitted (a node
// refused their joins during a reconnect storm) as they are: each
// session's existing entries, whoever holds them, a released one in its
// grace included, and its user's membership are pushed back to at least
// a session TTL from now, so that neither the old holder's silence nor
// the end of a grace announces a departure while the client retries. It
// claims nothing, creates nothing and announces nothing: a session with no
// live entry (as reads see it: one overdue by less than the read slack,
// its end not announced yet, still is) is left alone, the client's join
// will announce it, and nothing is shortened. It returns how many sessions it extended. Calls
// are grouped by slot, like the heartbeat's; an invalid batch writes
// nothing.
func (s *Store) Extend(ctx context.Context, refs []presence.SessionRef) (int, error) {
	if err := s.checkBatch(refs); err != nil {
		return 0, &OpError{"extend", err}
	}
	var calls []call
	for _, tc := range s.touchCalls(sortRefs(refs), false, "", 0, 0) {
		// The touch layout after its slot keys and its head
		// arguments: two keys per room, then per room k and its pairs.
		head := []any{ms(s.t.SessionTTL), s.readCut(), ms(s.readSlack())}
		calls = append(calls, call{script: scriptExtend, keys: tc.keys[touchSlotKeys:], args: append(head, tc.args[len(touchHead{}):]...)})
	}
	cmds, err := s.exec(ctx, calls)
	if err != nil {
		return 0, &OpError{"extend", err}
	}
	n := 0
	for _, c := range cmds {
		v, _ := c.Int()
		n += v
	}
	s.stats.Extended.Add(int64(n))
	return n, nil
}

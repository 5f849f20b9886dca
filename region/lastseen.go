package region

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/presence"
)

type seenWrite struct {
	user  string
	at    int64 // ms; 0 means Redis's now
	force bool
}

// noteActivity writes last seen for users active in a touch, at most once
// per last-seen interval per user from this process (the script enforces
// the interval across processes).
func (s *Store) noteActivity(ctx context.Context, refs []presence.SessionRef) {
	now := s.now()
	var ws []seenWrite
	s.mu.Lock()
	for _, r := range refs {
		if last, ok := s.seen[r.User]; ok && now.Sub(last) < s.t.LastSeenInterval {
			continue
		}
		s.seen[r.User] = now
		ws = append(ws, seenWrite{user: r.User})
	}
	s.mu.Unlock()
	s.flushSeen(ctx, ws)
}

// departuresSeen turns joins and departures into forced last-seen writes.
func (s *Store) departuresSeen(ts []presence.Transition) []seenWrite {
	if len(ts) == 0 {
		return nil
	}
	now := s.now()
	ws := make([]seenWrite, 0, len(ts))
	s.mu.Lock()
	for _, t := range ts {
		s.seen[t.User] = now
		ws = append(ws, seenWrite{user: t.User, at: t.At.UnixMilli(), force: true})
	}
	s.mu.Unlock()
	return ws
}

func (s *Store) flushSeen(ctx context.Context, ws []seenWrite) {
	if len(ws) == 0 {
		return
	}
	cmds, err := runAll(ctx, s.rdb, s.seenCalls(ws))
	if err != nil {
		s.log.Warn("presence: last-seen write failed", "err", err)
	}
	s.countSeen(cmds)
}

// countSeen adds the writes that seen.lua calls report to the stats.
func (s *Store) countSeen(cmds []*redis.Cmd) {
	for _, c := range cmds {
		if n, err := c.Int64(); err == nil {
			s.stats.LastSeenWrites.Add(n)
		}
	}
}

// seenCalls groups last-seen writes into one seen.lua call per bucket.
func (s *Store) seenCalls(ws []seenWrite) []call {
	if len(ws) == 0 {
		return nil
	}
	byKey := map[string][]any{}
	for _, w := range ws {
		k := s.seenKey(w.user)
		f := 0
		if w.force {
			f = 1
		}
		byKey[k] = append(byKey[k], w.user, w.at, f)
	}
	calls := make([]call, 0, len(byKey))
	for k, args := range byKey {
		calls = append(calls, call{script: scriptSeen, keys: []string{k}, args: append([]any{ms(s.t.LastSeenInterval)}, args...)})
	}
	return calls
}

// pruneSeen forgets users this process has not written for two intervals,
// bounding the map by the users it serves.
func (s *Store) pruneSeen() {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for u, t := range s.seen {
		if now.Sub(t) > 2*s.t.LastSeenInterval {
			delete(s.seen, u)
		}
	}
	// Sessions this store stopped refreshing without a release (a drain,
	// or another store took them over) are forgotten the same way.
	for r, h := range s.held {
		if now.Sub(h.at) > 2*s.t.SessionTTL {
			delete(s.held, r)
		}
	}
}

// LastSeen returns when the user was last seen active in this region, to
// the second.
func (s *Store) LastSeen(ctx context.Context, user string) (time.Time, bool, error) {
	if err := presence.ValidateUser(user); err != nil {
		return time.Time{}, false, &OpError{"last seen", err}
	}
	v, err := s.rdb.HGet(ctx, s.seenKey(user), user).Int64()
	if errors.Is(err, redis.Nil) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, &OpError{"last seen", err}
	}
	return time.Unix(v, 0), true, nil
}

// Package testkit holds what the packages' tests share: polling with a
// deadline instead of sleeping and hoping, the short timing integration
// tests run with, a log of transitions safe for concurrent use, and a
// WebSocket test client (WS).
package testkit

import (
	"fmt"
	"sync"
	"time"

	"github.com/presence-dev/presence/presence"
)

// Timing is short, so expiry and grace happen within a test against a
// real redis-server.
var Timing = presence.Timing{
	SessionTTL:       2 * time.Second,
	Heartbeat:        500 * time.Millisecond,
	OfflineGrace:     time.Second,
	ReapInterval:     100 * time.Millisecond,
	LastSeenInterval: time.Second,
}

// Log records transitions in arrival order; safe for concurrent use.
type Log struct {
	mu sync.Mutex
	ts []presence.Transition
}

// Add appends ts and returns how many the log now holds.
func (l *Log) Add(ts ...presence.Transition) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ts = append(l.ts, ts...)
	return len(l.ts)
}

// All returns a copy of every transition recorded.
func (l *Log) All() []presence.Transition {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]presence.Transition(nil), l.ts...)
}

// WantOf is a poll's condition: l holds exactly n transitions of kind
// (every kind: "") of user in room; the reason lists what it holds of
// them.
func (l *Log) WantOf(kind presence.Kind, room, user string, n int) error {
	if got := l.Of(kind, room, user); len(got) != n {
		return fmt.Errorf("%d %s transitions of %s in %s, want %d; of theirs: %v", len(got), kindName(kind), user, room, n, l.Of("", room, user))
	}
	return nil
}

// AtLeastOf is WantOf for at least n.
func (l *Log) AtLeastOf(kind presence.Kind, room, user string, n int) error {
	if got := l.Of(kind, room, user); len(got) < n {
		return fmt.Errorf("%d %s transitions of %s in %s, want at least %d; of theirs: %v", len(got), kindName(kind), user, room, n, l.Of("", room, user))
	}
	return nil
}

func kindName(k presence.Kind) string {
	if k == "" {
		return "any"
	}
	return string(k)
}

// Of returns the transitions of one user in one room, of the given kind
// or, with kind "", of every kind.
func (l *Log) Of(kind presence.Kind, room, user string) []presence.Transition {
	var out []presence.Transition
	for _, t := range l.All() {
		if (kind == "" || t.Kind == kind) && t.Room == room && t.User == user {
			out = append(out, t)
		}
	}
	return out
}

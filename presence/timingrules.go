package presence

import (
	"fmt"
	"time"
)

// A TimingRule is one rule between the timing's settings. TimingRules is
// the one list of them: Validate checks it in order, presenced's --help
// prints it, and a test holds the README's table to it.
type TimingRule struct {
	Field string // the setting an error names, as ConfigError.Field
	Rule  string // the rule in flag names, e.g. "heartbeat <= session-ttl / 3"
	Why   string // what breaks without it
	holds func(Timing) bool
	fails func(Timing) string // ConfigError.Rule when it does not hold
}

// TimingRules are the rules a positive timing must keep.
var TimingRules = []TimingRule{
	{"session TTL", "session-ttl >= 2s", "expiry is stored in whole seconds",
		func(t Timing) bool { return t.SessionTTL >= 2*time.Second },
		func(t Timing) string { return fmt.Sprintf("must be at least 2s, got %v", t.SessionTTL) }},
	{"heartbeat", "heartbeat <= session-ttl / 3", "two missed heartbeats do not expire a live session",
		func(t Timing) bool { return t.Heartbeat*3 <= t.SessionTTL },
		func(t Timing) string {
			return fmt.Sprintf("(%v) must be at most a third of the session TTL (%v), so two missed ticks do not expire a live session", t.Heartbeat, t.SessionTTL)
		}},
	{"offline grace", "offline-grace < session-ttl", "a crashed node's users do not outlive a clean close",
		func(t Timing) bool { return t.OfflineGrace < t.SessionTTL },
		func(t Timing) string {
			return fmt.Sprintf("(%v) must be shorter than the session TTL (%v): a crashed node's users would otherwise outlive a clean close", t.OfflineGrace, t.SessionTTL)
		}},
	{"reap interval", "reap-interval <= offline-grace", "departures are not late by more than the grace",
		func(t Timing) bool { return t.ReapInterval <= t.OfflineGrace },
		func(t Timing) string {
			return fmt.Sprintf("(%v) must not exceed the offline grace (%v), or departures are announced late by more than the grace itself", t.ReapInterval, t.OfflineGrace)
		}},
	{"reap interval", "reap-interval <= (session-ttl - heartbeat) / 4", "a silence of (session-ttl - heartbeat) / 2 without sweeps is taken for a Redis outage",
		func(t Timing) bool { return t.ReapInterval*2 <= t.OutageGap() },
		func(t Timing) string {
			return fmt.Sprintf("(%v) must be at most a quarter of session TTL - heartbeat (%v): a silence of half that is taken for an outage", t.ReapInterval, t.SessionTTL-t.Heartbeat)
		}},
	{"last-seen interval", "last-seen-interval >= heartbeat", "last seen is not written on every heartbeat",
		func(t Timing) bool { return t.LastSeenInterval >= t.Heartbeat },
		func(t Timing) string {
			return fmt.Sprintf("(%v) must be at least the heartbeat (%v): last seen is not written on every heartbeat", t.LastSeenInterval, t.Heartbeat)
		}},
}

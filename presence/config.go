package presence

import (
	"fmt"
	"time"
)

// Defaults. The heartbeat is a third of the TTL so two ticks may be missed
// before a live session expires; the grace absorbs a network handover and a
// fast reconnect.
const (
	DefaultSessionTTL       = 45 * time.Second
	DefaultHeartbeat        = 15 * time.Second
	DefaultOfflineGrace     = 12 * time.Second
	DefaultReapInterval     = 1 * time.Second
	DefaultLastSeenInterval = 60 * time.Second
)

// Timing decides when sessions expire and when departures are announced.
// The zero value of a field means its default; see WithDefaults.
type Timing struct {
	SessionTTL       time.Duration // a session not refreshed for this long is gone
	Heartbeat        time.Duration // how often a live node refreshes its sessions
	OfflineGrace     time.Duration // wait after a clean close before announcing offline
	ReapInterval     time.Duration // how often a reaper looks for due entries
	LastSeenInterval time.Duration // at most one last-seen write per user this often while active
}

// DefaultTiming returns the defaults.
func DefaultTiming() Timing { return Timing{}.WithDefaults() }

// WithDefaults returns t with every zero field set to its default.
func (t Timing) WithDefaults() Timing {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&t.SessionTTL, DefaultSessionTTL)
	def(&t.Heartbeat, DefaultHeartbeat)
	def(&t.OfflineGrace, DefaultOfflineGrace)
	def(&t.ReapInterval, DefaultReapInterval)
	def(&t.LastSeenInterval, DefaultLastSeenInterval)
	return t
}

// Unrefreshed is how long a node may write nothing before its sessions no
// longer hold their users against a clean close: a heartbeat and a half,
// so a live node's sessions always count, while those of a node that died
// (or stalls that long) stop counting soon after. A user whose other
// session closes cleanly leaves when the grace ends and the nodes holding
// their other sessions have been silent that long, even if such a session
// is still unexpired; a refresh before then keeps them. Its expiry still
// ends such a session at the TTL otherwise.
func (t Timing) Unrefreshed() time.Duration { return t.Heartbeat * 3 / 2 }

// OutageGap is how long a region's Redis may go without a reaper sweep
// before the region treats the silence as an outage (Redis stalled,
// unreachable or failing over: no node could refresh its sessions): half
// of TTL - Heartbeat. Only an outage longer than TTL - Heartbeat can let a
// live session expire, and every live node sweeps every ReapInterval.
func (t Timing) OutageGap() time.Duration { return (t.SessionTTL - t.Heartbeat) / 2 }

// OutageHold is how long, after an outage, the region holds expiry
// announcements of sessions that were alive when it began: a heartbeat
// and a reap interval, in which every live node refreshes its sessions.
// It is the most an outage delays a real expiry's announcement.
func (t Timing) OutageHold() time.Duration { return t.Heartbeat + t.ReapInterval }

// ConfigError names the setting that is wrong and the rule it breaks.
type ConfigError struct {
	Field string
	Rule  string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("presence: config: %s: %s", e.Field, e.Rule)
}

// Validate rejects settings that produce ghosts or flicker. It checks t as
// given: call WithDefaults first to fill zero fields.
func (t Timing) Validate() error {
	for _, f := range []struct {
		name string
		d    time.Duration
	}{
		{"session TTL", t.SessionTTL},
		{"heartbeat", t.Heartbeat},
		{"offline grace", t.OfflineGrace},
		{"reap interval", t.ReapInterval},
		{"last-seen interval", t.LastSeenInterval},
	} {
		if f.d <= 0 {
			return &ConfigError{f.name, fmt.Sprintf("must be positive, got %v", f.d)}
		}
	}
	for _, r := range TimingRules {
		if !r.holds(t) {
			return &ConfigError{r.Field, r.fails(t)}
		}
	}
	return nil
}

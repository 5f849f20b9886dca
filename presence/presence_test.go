package presence

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestIDValidation(t *testing.T) {
	good := []string{"room42", "u_8827", "a-b", "x=y", "user@example", "a+b~c", strings.Repeat("r", MaxRoomLen)}
	for _, v := range good {
		if err := ValidateRoom(v); err != nil {
			t.Errorf("ValidateRoom(%q) = %v", v, err)
		}
	}
	bad := map[string]string{
		"":                                "must not be empty",
		"a.b":                             `'.'`,
		"a*":                              `'*'`,
		"a>":                              `'>'`,
		"a b":                             `' '`,
		"a\tb":                            `'\t'`,
		"{a}":                             `'{'`,
		"a}":                              `'}'`,
		"a:b":                             `':'`,
		"a/b":                             `'/'`,
		"é":                               "is not allowed",
		strings.Repeat("r", MaxRoomLen+1): "longer than 128 bytes",
	}
	for v, rule := range bad {
		err := ValidateRoom(v)
		var idErr *IDError
		if !errors.As(err, &idErr) || idErr.Field != "room" || !strings.Contains(err.Error(), rule) {
			t.Errorf("ValidateRoom(%q) = %v, want an IDError on room mentioning %s", v, err, rule)
		}
	}
	if err := ValidateUser(strings.Repeat("u", MaxUserLen+1)); err == nil || !strings.Contains(err.Error(), "invalid user id") {
		t.Errorf("long user: %v", err)
	}
	if err := ValidateSession("s.1"); err == nil || !strings.Contains(err.Error(), "invalid session id") {
		t.Errorf("bad session: %v", err)
	}
	if err := ValidateRegion("eu west"); err == nil || !strings.Contains(err.Error(), "invalid region id") {
		t.Errorf("bad region: %v", err)
	}
	r := SessionRef{Room: "r", User: "u", Session: "s*"}
	if err := r.Validate(); err == nil || !strings.Contains(err.Error(), "session") {
		t.Errorf("SessionRef.Validate: %v", err)
	}
}

func TestTimingDefaultsAreValid(t *testing.T) {
	d := DefaultTiming()
	if d.SessionTTL != 45*time.Second || d.Heartbeat != 15*time.Second || d.OfflineGrace != 12*time.Second || d.LastSeenInterval != time.Minute {
		t.Fatalf("defaults: %+v", d)
	}
	if err := d.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	partial := Timing{SessionTTL: 3 * time.Second, Heartbeat: time.Second, OfflineGrace: 2 * time.Second, ReapInterval: 100 * time.Millisecond, LastSeenInterval: time.Second}
	if err := partial.Validate(); err != nil {
		t.Fatalf("short test timing: %v", err)
	}
}

func TestTimingValidateNamesTheRule(t *testing.T) {
	base := DefaultTiming()
	cases := []struct {
		edit  func(*Timing)
		field string
		rule  string
	}{
		{func(t *Timing) { t.Heartbeat = 16 * time.Second }, "heartbeat", "third of the session TTL"},
		{func(t *Timing) { t.OfflineGrace = 45 * time.Second }, "offline grace", "shorter than the session TTL"},
		{func(t *Timing) { t.ReapInterval = 13 * time.Second }, "reap interval", "must not exceed the offline grace"},
		{func(t *Timing) { t.LastSeenInterval = 10 * time.Second }, "last-seen interval", "at least the heartbeat"},
		{func(t *Timing) { t.SessionTTL = -time.Second }, "session TTL", "must be positive"},
		{func(t *Timing) { t.ReapInterval = 0 }, "reap interval", "must be positive"},
		{func(t *Timing) {
			t.SessionTTL, t.Heartbeat, t.OfflineGrace, t.ReapInterval = time.Second, 300*time.Millisecond, 500*time.Millisecond, 100*time.Millisecond
		}, "session TTL", "at least 2s"},
	}
	for _, c := range cases {
		tm := base
		c.edit(&tm)
		err := tm.Validate()
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != c.field || !strings.Contains(err.Error(), c.rule) || !strings.HasPrefix(err.Error(), "presence: config: ") {
			t.Errorf("%+v: got %v, want %s: %s", tm, err, c.field, c.rule)
		}
	}
}

// Every rule of TimingRules is one Validate enforces: a timing that
// breaks only that rule is refused with the rule's field and message.
func TestTimingRulesAreWhatValidateChecks(t *testing.T) {
	breaks := map[string]func(*Timing){
		"session-ttl >= 2s": func(t *Timing) {
			*t = Timing{SessionTTL: 1900 * time.Millisecond, Heartbeat: 500 * time.Millisecond, OfflineGrace: time.Second, ReapInterval: 100 * time.Millisecond, LastSeenInterval: time.Second}
		},
		"heartbeat <= session-ttl / 3":                   func(t *Timing) { t.Heartbeat, t.LastSeenInterval = 16*time.Second, time.Minute },
		"offline-grace < session-ttl":                    func(t *Timing) { t.OfflineGrace = t.SessionTTL },
		"reap-interval <= offline-grace":                 func(t *Timing) { t.OfflineGrace, t.ReapInterval = 2*time.Second, 3*time.Second },
		"reap-interval <= (session-ttl - heartbeat) / 4": func(t *Timing) { t.OfflineGrace, t.ReapInterval = 40*time.Second, 8*time.Second },
		"last-seen-interval >= heartbeat":                func(t *Timing) { t.LastSeenInterval = t.Heartbeat - time.Second },
	}
	if len(breaks) != len(TimingRules) {
		t.Fatalf("%d counterexamples for %d rules", len(breaks), len(TimingRules))
	}
	for _, r := range TimingRules {
		edit, ok := breaks[r.Rule]
		if !ok {
			t.Fatalf("no counterexample for %q", r.Rule)
		}
		tm := DefaultTiming()
		edit(&tm)
		for _, other := range TimingRules {
			if other.Rule != r.Rule && !other.holds(tm) {
				t.Fatalf("%q's counterexample %+v breaks %q too", r.Rule, tm, other.Rule)
			}
		}
		var ce *ConfigError
		if err := tm.Validate(); r.holds(tm) || !errors.As(err, &ce) || ce.Field != r.Field || ce.Rule != r.fails(tm) {
			t.Errorf("%q: %+v gave %v", r.Rule, tm, err)
		}
	}
}

func TestKinds(t *testing.T) {
	for _, k := range []Kind{Online, Offline, Update} {
		if !k.Valid() {
			t.Errorf("%s not valid", k)
		}
	}
	if Kind("away").Valid() {
		t.Error("unknown kind valid")
	}
	tr := Transition{Kind: Offline, Room: "r", User: "u", Reason: Left, Region: "eu", Seq: 3}
	if s := tr.String(); !strings.Contains(s, "offline r/u left") {
		t.Errorf("String: %s", s)
	}
}

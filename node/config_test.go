package node

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/presence-dev/presence/internal/testnats"
	"github.com/presence-dev/presence/presence"
)

func TestConfigValidation(t *testing.T) {
	nc := testnats.Connect(t, testnats.Start(t))
	fs := &fakeStore{}
	cases := []struct {
		edit  func(*Config)
		field string
		rule  string
	}{
		{func(c *Config) { c.Region = "" }, "region", "must not be empty"},
		{func(c *Config) { c.Region = "global" }, "region", "reserved"},
		{func(c *Config) { c.Store = nil }, "store", "is required"},
		{func(c *Config) { c.NATS = nil }, "nats", "is required"},
		{func(c *Config) { c.Limits.MaxRooms = -1 }, "limits: max rooms", "must be positive"},
		{func(c *Config) { c.Limits.PongTimeout = -time.Second }, "limits: pong timeout", "must be positive"},
		{func(c *Config) { c.Limits.FrameRate = -1 }, "limits: frame rate", "must be positive"},
		{func(c *Config) { c.Limits.MaxFrameBytes = 512 }, "limits: max frame bytes", "full state frame"},
		{func(c *Config) { c.HeartbeatSlots = 5000 }, "heartbeat slots", "between 1 and 1000"},
		{func(c *Config) { c.Limits.JoinRate, c.Limits.JoinRateMin = 10, 20 }, "limits: join rate min", "at most the join rate 10"},
		{func(c *Config) { c.Limits.JoinLatency = -1 }, "limits: join latency", "must be positive"},
		{func(c *Config) { c.Limits.MaxRetryAfter = 1500 * time.Millisecond }, "limits: max retry after", "session TTL 2s"},
		{func(c *Config) { c.StoreTimeout = -1 }, "store timeout", "must be positive"},
		{func(c *Config) { c.FanoutTick = time.Millisecond }, "fanout tick", "at least 5ms"},
		{func(c *Config) { c.Auth = AuthConfig{} }, "auth", "HMAC secret, a public key, a JWKS URL, or InsecureDev"},
		{func(c *Config) { c.Auth.HMACSecret = []byte("short") }, "auth: hmac secret", "at least 32 bytes"},
		{func(c *Config) { c.Auth.PublicKeyPEM = []byte("not pem") }, "auth: public key", "no PEM block"},
		{func(c *Config) { c.Auth.Leeway = -time.Second }, "auth: leeway", "must not be negative"},
	}
	for _, k := range cases {
		t.Run(k.field, func(t *testing.T) {
			cfg := testConfig(fs, nc)
			k.edit(&cfg)
			_, err := New(cfg)
			var ce *presence.ConfigError
			if !errors.As(err, &ce) || ce.Field != k.field || !strings.Contains(err.Error(), k.rule) || !strings.HasPrefix(err.Error(), "node: presence: config: ") {
				t.Errorf("%s: got %v, want a node: presence: config: error on %q mentioning %q", k.field, err, k.field, k.rule)
			}
		})
	}

	// Defaults fill in.
	cfg := testConfig(fs, nc)
	cfg.Limits, cfg.HeartbeatSlots, cfg.StoreTimeout, cfg.Logger = Limits{}, 0, 0, nil
	n, err := New(cfg)
	if err != nil {
		t.Fatalf("defaults: %v", err)
	}
	l := n.cfg.Limits
	if l.JoinRate != DefaultJoinRate || l.JoinRateMin != DefaultJoinRateMin || l.MaxRetryAfter != 750*time.Millisecond { // (TTL 2s - heartbeat 500ms)/2
		t.Fatalf("join defaults: %+v", l)
	}
	if l.MaxConnections != 15000 || l.MaxFrameBytes != 4096 || l.PingInterval != DefaultPingInterval || n.cfg.HeartbeatSlots != DefaultHeartbeatSlots || n.cfg.StoreTimeout != DefaultStoreTimeout {
		t.Fatalf("defaults: %+v", n.cfg)
	}
	_ = n.Close()

	// Metrics registered twice on one registry.
	reg := prometheus.NewRegistry()
	cfg = testConfig(fs, nc)
	cfg.Metrics = reg
	if n, err := New(cfg); err != nil {
		t.Fatal(err)
	} else {
		defer n.Close()
	}
	if _, err := New(cfg); err == nil || !strings.HasPrefix(err.Error(), "node: presence: config: metrics: ") {
		t.Fatalf("second node on one registry: %v", err)
	}
}

// WithDefaults and Validate are New's two steps, exported: Validate
// checks a config as given, so an unfilled one fails on its first zero
// field, and WithDefaults fills every default New would.
func TestConfigWithDefaultsThenValidate(t *testing.T) {
	var ce *presence.ConfigError
	if err := (Limits{}).Validate(); !errors.As(err, &ce) || ce.Field != "limits: max connections" {
		t.Fatalf("zero limits as given: %v, want max connections refused", err)
	}
	if err := (Limits{}).WithDefaults().Validate(); err != nil {
		t.Fatalf("default limits: %v", err)
	}
	if err := (Limits{MaxWatchUsers: 1001}).WithDefaults().Validate(); !errors.As(err, &ce) || ce.Field != "limits: max watch users" {
		t.Fatalf("1001 watch users: %v", err)
	}
	if err := (Config{}).WithDefaults().Validate(); !errors.As(err, &ce) || ce.Field != "region" {
		t.Fatalf("zero config: %v, want the region refused first", err)
	}

	nc := testnats.Connect(t, testnats.Start(t))
	cfg := testConfig(&fakeStore{}, nc)
	cfg.Limits = Limits{}
	if err := cfg.Validate(); !errors.As(err, &ce) || ce.Field != "limits: max connections" {
		t.Fatalf("unfilled config: %v, want its zero limits refused", err)
	}
	filled := cfg.WithDefaults()
	if err := filled.Validate(); err != nil {
		t.Fatalf("filled config: %v", err)
	}
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if filled.Limits != n.cfg.Limits || filled.heartbeat != n.cfg.heartbeat || filled.HeartbeatSlots != n.cfg.HeartbeatSlots ||
		filled.StoreTimeout != n.cfg.StoreTimeout || filled.FanoutTick != n.cfg.FanoutTick || filled.BatchFrom != n.cfg.BatchFrom || filled.FanoutBudget != n.cfg.FanoutBudget {
		t.Fatalf("WithDefaults filled %+v, New runs with %+v", filled, n.cfg)
	}
}

// The node's timing is the store's: it paces its heartbeat by the
// store's, and refuses a store that reports none.
func TestConfigTimingFollowsTheStore(t *testing.T) {
	e := newEnv(t)
	nc := testnats.Connect(t, e.ns)
	n, err := New(testConfig(e.store, nc))
	if err != nil {
		t.Fatal(err)
	}
	if n.cfg.heartbeat != testTiming.Heartbeat {
		t.Fatalf("heartbeat %v, want the store's %v", n.cfg.heartbeat, testTiming.Heartbeat)
	}
	_ = n.Close()
	var ce *presence.ConfigError
	if _, err := New(testConfig(untimedStore{e.store}, nc)); !errors.As(err, &ce) || ce.Field != "store timing" {
		t.Fatalf("store without timing: %v", err)
	}
}

type untimedStore struct{ Store }

func (untimedStore) Timing() presence.Timing { return presence.Timing{} }

package webhook

import (
	"bytes"
	"cmp"
	"crypto/x509"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"path"
	"slices"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/presence"
)

// Endpoint defaults.
const (
	DefaultBatchSize  = 100
	DefaultMaxWait    = 500 * time.Millisecond
	DefaultTimeout    = 10 * time.Second
	DefaultMinBackoff = time.Second
	DefaultMaxBackoff = 5 * time.Minute
	DefaultMaxPending = 10000
	DefaultGapTimeout = bus.DefaultGapTimeout
	MaxBatchSize      = 1000
	maxEndpointName   = 32
)

// Config is the dispatcher's configuration file: YAML, or JSON (a JSON
// document is YAML). Every dispatcher of a deployment reads the same file.
type Config struct {
	// Sources are the streams an endpoint reads when it names none:
	// region names, and "global" for the cross-region view.
	Sources   []string   `yaml:"sources"`
	Endpoints []Endpoint `yaml:"endpoints"`
}

// Endpoint is one receiver and what it is sent.
type Endpoint struct {
	Name    string   `yaml:"name"`    // [A-Za-z0-9_-]{1,32}: names its consumers, lanes and metrics
	URL     string   `yaml:"url"`     // http:// or https://
	Secrets []string `yaml:"secrets"` // whsec_<base64>; each signs every delivery (rotation)
	Sources []string `yaml:"sources"` // streams read; default Config.Sources
	Rooms   []string `yaml:"rooms"`   // path.Match patterns; empty: every room
	Kinds   []string `yaml:"kinds"`   // online, offline, update; empty: every kind
	Reasons []string `yaml:"reasons"` // empty: every reason

	BatchSize    int      `yaml:"batch_size"`    // items per delivery, 1..1000 (default 100)
	MaxWait      Duration `yaml:"max_wait"`      // a batch waits at most this for more (default 500ms)
	Timeout      Duration `yaml:"timeout"`       // one attempt, connect to last byte (default 10s)
	RetryHorizon Duration `yaml:"retry_horizon"` // age of the oldest event past which a failed batch is dead-lettered (default: the stream's max age)
	MinBackoff   Duration `yaml:"min_backoff"`   // first retry delay (default 1s)
	MaxBackoff   Duration `yaml:"max_backoff"`   // longest retry delay (default 5m)
	MaxPending   int      `yaml:"max_pending"`   // events a lane holds unacknowledged at most (default 10000)
	GapTimeout   Duration `yaml:"gap_timeout"`   // how long a missing seq is waited for (default 10s)

	CAFile        string   `yaml:"ca_file"`        // PEM roots for https, instead of the system's
	AllowNetworks []string `yaml:"allow_networks"` // CIDRs of private or loopback addresses this endpoint may reach

	secrets []Secret
	allowed []netip.Prefix
	roots   *x509.CertPool // from CAFile; nil: the system's
}

// Duration is a time.Duration written as "500ms", "15s", "24h".
type Duration time.Duration

// UnmarshalYAML reads a duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*d = Duration(v)
	return nil
}

// ParseConfig decodes and checks a configuration file. Unknown fields,
// bad values and duplicate names are errors naming the field; nothing of
// a bad file is used.
func ParseConfig(data []byte) (*Config, error) {
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("webhook: config: %w", err)
	}
	if err := c.check(); err != nil {
		return nil, err
	}
	return &c, nil
}

func (c *Config) check() error {
	var errs []error
	for _, s := range c.Sources {
		if err := checkSource(s); err != nil {
			errs = append(errs, fieldError("sources", err.Error()))
		}
	}
	seen := map[string]bool{}
	for i := range c.Endpoints {
		e := &c.Endpoints[i]
		if seen[e.Name] {
			errs = append(errs, fieldError(fmt.Sprintf("endpoints[%d].name", i), fmt.Sprintf("%q is used twice", e.Name)))
		}
		seen[e.Name] = true
		if len(e.Sources) == 0 {
			e.Sources = c.Sources
		}
		if err := e.prepare(); err != nil {
			errs = append(errs, fmt.Errorf("endpoints[%d] (%s): %w", i, e.Name, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("webhook: config: %w", err)
	}
	return nil
}

func fieldError(field, rule string) error { return &presence.ConfigError{Field: field, Rule: rule} }

func checkSource(s string) error {
	if s == bus.GlobalRegion {
		return nil
	}
	return bus.ValidateRegion(s)
}

// prepare fills defaults and checks e, parsing its secrets and networks.
func (e *Endpoint) prepare() error {
	e.defaults()
	errs := []error{checkName(e.Name), checkURL(e.URL)}
	if len(e.Secrets) == 0 {
		errs = append(errs, fieldError("secrets", "at least one whsec_ secret is required"))
	}
	e.secrets = nil
	for _, s := range e.Secrets {
		sec, err := ParseSecret(s)
		if err != nil {
			errs = append(errs, fieldError("secrets", err.Error()))
			continue
		}
		e.secrets = append(e.secrets, sec)
	}
	if len(e.Sources) == 0 {
		errs = append(errs, fieldError("sources", "none given, here or at the top level"))
	}
	for _, s := range e.Sources {
		if err := checkSource(s); err != nil {
			errs = append(errs, fieldError("sources", err.Error()))
		}
	}
	errs = append(errs, e.checkFilter(), e.checkLimits(), e.parseNetworks(), e.loadRoots())
	return errors.Join(errs...)
}

// loadRoots reads ca_file now, so a missing or empty file is a
// configuration error rather than a failing endpoint.
func (e *Endpoint) loadRoots() error {
	e.roots = nil
	if e.CAFile == "" {
		return nil
	}
	pem, err := os.ReadFile(e.CAFile)
	if err != nil {
		return fieldError("ca_file", err.Error())
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return fieldError("ca_file", e.CAFile+" holds no PEM certificate")
	}
	e.roots = pool
	return nil
}

func (e *Endpoint) defaults() {
	if e.BatchSize == 0 {
		e.BatchSize = DefaultBatchSize
	}
	def := func(d *Duration, v time.Duration) {
		if *d == 0 {
			*d = Duration(v)
		}
	}
	def(&e.MaxWait, DefaultMaxWait)
	def(&e.Timeout, DefaultTimeout)
	def(&e.MinBackoff, DefaultMinBackoff)
	def(&e.MaxBackoff, DefaultMaxBackoff)
	def(&e.GapTimeout, DefaultGapTimeout)
	if e.MaxPending == 0 {
		e.MaxPending = DefaultMaxPending
	}
}

func checkName(name string) error {
	if name == "" || len(name) > maxEndpointName {
		return fieldError("name", fmt.Sprintf("must be 1 to %d bytes, got %d", maxEndpointName, len(name)))
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return fieldError("name", fmt.Sprintf("%q: only A-Z a-z 0-9 - _", name))
		}
	}
	return nil
}

func checkURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fieldError("url", err.Error())
	}
	if u.Scheme != "https" && u.Scheme != "http" {
		return fieldError("url", fmt.Sprintf("%q: want an http:// or https:// URL", raw))
	}
	if u.Hostname() == "" || u.User != nil || u.Fragment != "" {
		return fieldError("url", fmt.Sprintf("%q: want a host, no user info, no fragment", raw))
	}
	return nil
}

func (e *Endpoint) checkFilter() error {
	var errs []error
	for _, p := range e.Rooms {
		if _, err := path.Match(p, ""); err != nil || p == "" {
			errs = append(errs, fieldError("rooms", fmt.Sprintf("%q is not a pattern", p)))
		}
	}
	for _, k := range e.Kinds {
		if !presence.Kind(k).Valid() {
			errs = append(errs, fieldError("kinds", fmt.Sprintf("%q: want online, offline or update", k)))
		}
	}
	known := []presence.Reason{presence.Joined, presence.Left, presence.Expired, presence.State, presence.RegionLost}
	for _, r := range e.Reasons {
		if !slices.Contains(known, presence.Reason(r)) {
			errs = append(errs, fieldError("reasons", fmt.Sprintf("%q: want joined, left, expired, state or region_lost", r)))
		}
	}
	return errors.Join(errs...)
}

func (e *Endpoint) checkLimits() error {
	var errs []error
	if e.BatchSize < 1 || e.BatchSize > MaxBatchSize {
		errs = append(errs, fieldError("batch_size", fmt.Sprintf("must be 1 to %d, got %d", MaxBatchSize, e.BatchSize)))
	}
	if e.MaxPending < e.BatchSize {
		errs = append(errs, fieldError("max_pending", fmt.Sprintf("must be at least batch_size (%d), got %d", e.BatchSize, e.MaxPending)))
	}
	positive := []struct {
		f string
		d Duration
	}{{"timeout", e.Timeout}, {"min_backoff", e.MinBackoff}, {"max_backoff", e.MaxBackoff}, {"gap_timeout", e.GapTimeout}}
	for _, p := range positive {
		if p.d <= 0 {
			errs = append(errs, fieldError(p.f, fmt.Sprintf("must be positive, got %v", time.Duration(p.d))))
		}
	}
	if e.MaxWait < 0 || e.RetryHorizon < 0 {
		errs = append(errs, fieldError("max_wait, retry_horizon", "must not be negative"))
	}
	if e.MaxBackoff < e.MinBackoff {
		errs = append(errs, fieldError("max_backoff", "must be at least min_backoff"))
	}
	return errors.Join(errs...)
}

func (e *Endpoint) parseNetworks() error {
	e.allowed = nil
	var errs []error
	for _, n := range e.AllowNetworks {
		p, err := netip.ParsePrefix(n)
		if err != nil {
			errs = append(errs, fieldError("allow_networks", err.Error()))
			continue
		}
		e.allowed = append(e.allowed, p.Masked())
	}
	return errors.Join(errs...)
}

// Lanes lists the (endpoint, source) pairs of c, sorted: the units of
// work dispatchers share.
func (c *Config) Lanes() []LaneID {
	var ls []LaneID
	for _, e := range c.Endpoints {
		for _, s := range e.Sources {
			ls = append(ls, LaneID{Endpoint: e.Name, Source: s})
		}
	}
	slices.SortFunc(ls, func(a, b LaneID) int {
		return cmp.Or(cmp.Compare(a.Endpoint, b.Endpoint), cmp.Compare(a.Source, b.Source))
	})
	return slices.Compact(ls)
}

// Endpoint returns the endpoint named name, or nil.
func (c *Config) Endpoint(name string) *Endpoint {
	for i := range c.Endpoints {
		if c.Endpoints[i].Name == name {
			return &c.Endpoints[i]
		}
	}
	return nil
}

// LaneID names one lane: an endpoint's delivery of one stream.
type LaneID struct{ Endpoint, Source string }

func (l LaneID) String() string { return l.Endpoint + "/" + l.Source }

package global

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/presence"
)

// RegionSource is one region's truth; *region.Store satisfies it.
type RegionSource interface {
	// Rooms lists every room that may hold members.
	Rooms(ctx context.Context) ([]string, error)
	// Snapshot returns one page of a room's live members, ordered by user.
	Snapshot(ctx context.Context, room string, offset, limit int) (presence.Snapshot, error)
}

// Defaults. The cadence is the slow clock of the global view: publications
// go out once per cadence, so it is well above the heartbeat's cost and
// the other periods are counted in cadences.
const (
	DefaultCadence          = 3 * time.Second
	DefaultFullEvery        = 40  // cadences between digests of the published view (2 min)
	DefaultCheckEvery       = 200 // cadences of one anti-entropy pass over the region (10 min)
	DefaultPageSize         = 1000
	DefaultDropAfter        = 60 * time.Second
	DefaultOfflineRetention = 24 * time.Hour
	DefaultAckTimeout       = 5 * time.Second
	// DefaultMaxFullBytes bounds one full snapshot as an aggregator
	// receives it: about 1.3 million sessions at 25 bytes each.
	DefaultMaxFullBytes = 32 << 20

	// MinLeaseTTL is the shortest per-message TTL JetStream accepts.
	MinLeaseTTL = time.Second
	// MinCadence keeps test settings sane; production uses seconds.
	MinCadence = 50 * time.Millisecond
)

// Default multiples of the cadence.
const (
	DefaultGraceCadences     = 3 // a move between regions shows up within ~2 cadences
	DefaultDownAfterCadences = 5 // one lost publication is not an outage
	DefaultLeaseTTLCadences  = 3
)

// minFullBytes is the smallest MaxFullBytes: an empty region's full is a
// few hundred bytes, a small one's a few kilobytes.
const minFullBytes = 64 << 10

// GlobalLeaseBucket is the default KV bucket of the aggregators' lease.
const GlobalLeaseBucket = "PRESENCE_global_lease"

// StreamName is the stream holding the announced global view.
const StreamName = bus.StreamPrefix + bus.GlobalRegion

// LeaseBucket is the default KV bucket of region's publisher lease. Each
// region has its own, so a region elects its publisher even when cut off
// from the others.
func LeaseBucket(region string) string { return "PRESENCE_sync_" + keyEscape(region) }

func defDur(d *time.Duration, v time.Duration) {
	if *d == 0 {
		*d = v
	}
}

func leaseDefault(cadence time.Duration) time.Duration {
	return max(MinLeaseTTL, DefaultLeaseTTLCadences*cadence)
}

func checkBucket(field, name string) error {
	if name == "" {
		return &presence.ConfigError{Field: field, Rule: "must not be empty"}
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return &presence.ConfigError{Field: field, Rule: fmt.Sprintf("%q: only letters, digits, - and _ are allowed", name)}
		}
	}
	return nil
}

func checkStorage(s jetstream.StorageType) error {
	if s != jetstream.FileStorage && s != jetstream.MemoryStorage {
		return &presence.ConfigError{Field: "storage", Rule: fmt.Sprintf("must be file or memory, got %d", int(s))}
	}
	return nil
}

// PublisherConfig configures a RegionPublisher. Zero fields take their
// defaults; see WithDefaults.
type PublisherConfig struct {
	Region    string              // required; a valid bus region
	Source    RegionSource        // required: the region's truth
	NATS      *nats.Conn          // required: publications go out on it
	JetStream jetstream.JetStream // required: holds the lease bucket

	Cadence time.Duration // one publication per cadence; default 3s
	// FullEvery: every this many cadences a delta carries the digest of
	// the published view; an aggregator whose copy differs asks for a
	// full (there are no periodic fulls). Default 40.
	FullEvery int
	// CheckEvery: a ChangeSource is re-read whole, a slice of rooms per
	// cadence, over this many cadences, and compared with what was
	// published, so a change its log missed is published within one
	// pass. Default 200 (10 min).
	CheckEvery     int
	ResyncInterval time.Duration // requested fulls at most this often; default Cadence
	PageSize       int           // members per Snapshot read; default 1000
	ReadTimeout    time.Duration // bound on one cadence's reads; default Cadence

	LeaseTTL    time.Duration         // default max(1s, 3 × Cadence)
	LeaseBucket string                // default LeaseBucket(Region)
	Placement   *jetstream.Placement  // where the lease bucket lives: the region's own cluster
	Storage     jetstream.StorageType // of the lease bucket; default file

	Instance string       // names this process in publications; default random
	Logger   *slog.Logger // default slog.Default()

	manual bool // tests: no cadence timer; cadences run when called
}

// WithDefaults returns c with every zero field set to its default.
func (c PublisherConfig) WithDefaults() PublisherConfig {
	defDur(&c.Cadence, DefaultCadence)
	if c.FullEvery == 0 {
		c.FullEvery = DefaultFullEvery
	}
	if c.CheckEvery == 0 {
		c.CheckEvery = DefaultCheckEvery
	}
	if c.PageSize == 0 {
		c.PageSize = DefaultPageSize
	}
	defDur(&c.ResyncInterval, c.Cadence)
	defDur(&c.ReadTimeout, c.Cadence)
	defDur(&c.LeaseTTL, leaseDefault(c.Cadence))
	if c.LeaseBucket == "" && c.Region != "" {
		c.LeaseBucket = LeaseBucket(c.Region)
	}
	if c.Instance == "" {
		c.Instance = newInstance()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate checks c as given: call WithDefaults first to fill zero fields.
func (c PublisherConfig) Validate() error {
	if err := bus.ValidateRegion(c.Region); err != nil {
		return &presence.ConfigError{Field: "region", Rule: err.Error()}
	}
	switch {
	case c.Source == nil:
		return &presence.ConfigError{Field: "source", Rule: "is required: the region's truth is read from it"}
	case c.NATS == nil:
		return &presence.ConfigError{Field: "nats", Rule: "is required"}
	case c.JetStream == nil:
		return &presence.ConfigError{Field: "jetstream", Rule: "is required: the publisher lease lives in a KV bucket"}
	case c.Cadence < MinCadence:
		return &presence.ConfigError{Field: "cadence", Rule: fmt.Sprintf("must be at least %v, got %v", MinCadence, c.Cadence)}
	case c.FullEvery < 1:
		return &presence.ConfigError{Field: "full every", Rule: fmt.Sprintf("must be at least 1 cadence, got %d", c.FullEvery)}
	case c.CheckEvery < 1:
		return &presence.ConfigError{Field: "check every", Rule: fmt.Sprintf("must be at least 1 cadence, got %d", c.CheckEvery)}
	case c.ResyncInterval <= 0:
		return &presence.ConfigError{Field: "resync interval", Rule: fmt.Sprintf("must be positive, got %v", c.ResyncInterval)}
	case c.ReadTimeout <= 0 || c.ReadTimeout > c.Cadence:
		return &presence.ConfigError{Field: "read timeout", Rule: fmt.Sprintf("must be positive and at most the cadence (%v), got %v", c.Cadence, c.ReadTimeout)}
	case c.PageSize < 1 || c.PageSize > 10000:
		return &presence.ConfigError{Field: "page size", Rule: fmt.Sprintf("must be between 1 and 10000, got %d", c.PageSize)}
	case c.LeaseTTL < MinLeaseTTL:
		return &presence.ConfigError{Field: "lease TTL", Rule: fmt.Sprintf("must be at least %v (JetStream's smallest message TTL), got %v", MinLeaseTTL, c.LeaseTTL)}
	case c.Instance == "":
		return &presence.ConfigError{Field: "instance", Rule: "must not be empty"}
	}
	if err := checkBucket("lease bucket", c.LeaseBucket); err != nil {
		return err
	}
	return checkStorage(c.Storage)
}

// AggregatorConfig configures an Aggregator. Zero fields take their
// defaults; see WithDefaults.
type AggregatorConfig struct {
	NATS      *nats.Conn          // required: publications arrive on it, queries are served on it
	JetStream jetstream.JetStream // required: the global stream and the lease

	// Cadence is the regions' publication cadence; the defaults below
	// are multiples of it.
	Cadence time.Duration // default 3s
	// Grace is how long a user may be absent from every region before the
	// global offline (left): a move between regions is a non-event.
	Grace time.Duration // default 3 × Cadence
	// DownAfter: a region not heard for this long is down; its
	// contribution is held (keeps its users) but brings nobody online.
	DownAfter time.Duration // default 5 × Cadence
	// DropAfter: a region not heard for this long is dropped; users only
	// there go offline with reason region_lost.
	DropAfter time.Duration // default 60s
	// Regions lists the regions expected to publish (optional, and
	// advised). A listed region never heard since start counts as down
	// from the start. When it is set, publications of any other region
	// are dropped (counted in UnknownRegions).
	Regions []string
	// MaxFullBytes bounds the encoded size of one full snapshot: a full
	// whose parts add up to more is dropped (counted in OversizeFulls),
	// and so is one whose parts stop coming for DownAfter. A region whose
	// real fulls are larger never syncs: raise it.
	MaxFullBytes int // default DefaultMaxFullBytes (32 MiB)

	// OfflineRetention is how long the global stream keeps an offline
	// transition (its per-message TTL).
	OfflineRetention time.Duration // default 24h
	AckTimeout       time.Duration // bound on the acks of 1000 stream writes; default 5s

	LeaseTTL    time.Duration         // default max(1s, 3 × Cadence)
	LeaseBucket string                // default GlobalLeaseBucket
	Placement   *jetstream.Placement  // cluster of the global stream and lease bucket
	Replicas    int                   // of the global stream and lease bucket; default 1
	Storage     jetstream.StorageType // default file

	Instance string       // names this aggregator; default random
	Logger   *slog.Logger // default slog.Default()
}

// WithDefaults returns c with every zero field set to its default.
func (c AggregatorConfig) WithDefaults() AggregatorConfig {
	defDur(&c.Cadence, DefaultCadence)
	defDur(&c.Grace, DefaultGraceCadences*c.Cadence)
	defDur(&c.DownAfter, DefaultDownAfterCadences*c.Cadence)
	defDur(&c.DropAfter, DefaultDropAfter)
	defDur(&c.OfflineRetention, DefaultOfflineRetention)
	defDur(&c.AckTimeout, DefaultAckTimeout)
	defDur(&c.LeaseTTL, leaseDefault(c.Cadence))
	if c.MaxFullBytes == 0 {
		c.MaxFullBytes = DefaultMaxFullBytes
	}
	if c.LeaseBucket == "" {
		c.LeaseBucket = GlobalLeaseBucket
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.Instance == "" {
		c.Instance = newInstance()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate checks c as given: call WithDefaults first to fill zero fields.
func (c AggregatorConfig) Validate() error {
	switch {
	case c.NATS == nil:
		return &presence.ConfigError{Field: "nats", Rule: "is required"}
	case c.JetStream == nil:
		return &presence.ConfigError{Field: "jetstream", Rule: "is required: the global view is kept in a stream"}
	case c.Cadence < MinCadence:
		return &presence.ConfigError{Field: "cadence", Rule: fmt.Sprintf("must be at least %v, got %v", MinCadence, c.Cadence)}
	case c.Grace < 2*c.Cadence:
		return &presence.ConfigError{Field: "grace", Rule: fmt.Sprintf("(%v) must be at least two cadences (%v): a move between regions reaches the aggregator as a leave and a join up to a cadence apart", c.Grace, 2*c.Cadence)}
	case c.DownAfter < 2*c.Cadence:
		return &presence.ConfigError{Field: "down after", Rule: fmt.Sprintf("(%v) must be at least two cadences (%v), so one lost publication is not an outage", c.DownAfter, 2*c.Cadence)}
	case c.DropAfter <= c.DownAfter:
		return &presence.ConfigError{Field: "drop after", Rule: fmt.Sprintf("(%v) must be longer than down after (%v)", c.DropAfter, c.DownAfter)}
	case c.OfflineRetention < time.Second:
		return &presence.ConfigError{Field: "offline retention", Rule: fmt.Sprintf("must be at least 1s (JetStream's smallest message TTL), got %v", c.OfflineRetention)}
	case c.AckTimeout <= 0:
		return &presence.ConfigError{Field: "ack timeout", Rule: fmt.Sprintf("must be positive, got %v", c.AckTimeout)}
	case c.LeaseTTL < MinLeaseTTL:
		return &presence.ConfigError{Field: "lease TTL", Rule: fmt.Sprintf("must be at least %v (JetStream's smallest message TTL), got %v", MinLeaseTTL, c.LeaseTTL)}
	case c.Replicas < 1 || c.Replicas > 5:
		return &presence.ConfigError{Field: "replicas", Rule: fmt.Sprintf("must be between 1 and 5, got %d", c.Replicas)}
	case c.MaxFullBytes < minFullBytes:
		return &presence.ConfigError{Field: "max full bytes", Rule: fmt.Sprintf("must be at least %d (64 KiB), got %d", minFullBytes, c.MaxFullBytes)}
	case c.Instance == "":
		return &presence.ConfigError{Field: "instance", Rule: "must not be empty"}
	}
	seen := map[string]bool{}
	for _, r := range c.Regions {
		if err := bus.ValidateRegion(r); err != nil {
			return &presence.ConfigError{Field: "regions", Rule: err.Error()}
		}
		if seen[r] {
			return &presence.ConfigError{Field: "regions", Rule: fmt.Sprintf("%q is listed twice", r)}
		}
		seen[r] = true
	}
	if err := checkBucket("lease bucket", c.LeaseBucket); err != nil {
		return err
	}
	return checkStorage(c.Storage)
}

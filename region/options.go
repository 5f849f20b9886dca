package region

import (
	"crypto/rand"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/presence-dev/presence/presence"
)

// Options configure a Store. Zero fields take their defaults.
type Options struct {
	Region string          // required: names this region in transitions
	Timing presence.Timing // zero fields take presence defaults
	Sink   Sink            // required: receives every transition
	Prefix string          // key prefix; default "presence"
	// Holder names this store for operators: the registry of holder
	// codes (presence:holders, see holders.go) records it next to the
	// code the store leases. Each store holds its own code, whatever its
	// name: a release or a state write acts only on the entries of its own
	// code, and a refresh never takes a session from another. Default: a
	// random id.
	Holder string

	MaxBatch  int // sessions per Touch; default 10000
	ChunkSize int // sessions per script call; default 256
	// AsyncDelivery hands transitions to the sink from the store's own
	// goroutine, which RunReaper runs: claims, releases, state writes,
	// the heartbeat and the reaper never wait on the bus (an outage of
	// NATS must not stall the heartbeat), and transitions go out in the
	// order their scripts ran. What cannot be queued or delivered stays
	// in the outbox for a reaper's redelivery. Nodes want it; without
	// it each call delivers before it returns.
	AsyncDelivery bool
	// MaxOutbox caps the undelivered events kept per room. 0, the
	// default, is no cap: nothing is dropped however long the bus is out
	// of reach; Redis memory is the bound. At a cap the oldest go and the
	// room starts a new epoch, which tells readers to take a new snapshot.
	MaxOutbox       int
	PublishLease    time.Duration // redeliver events unacknowledged this long; default 5s
	LastSeenBuckets int           // hashes holding last-seen times; default 1024
	Logger          *slog.Logger
}

// WithDefaults returns opt with every zero field that has a default set
// to it, the timing's included.
func (opt Options) WithDefaults() Options {
	opt.Timing = opt.Timing.WithDefaults()
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&opt.MaxBatch, 10000)
	def(&opt.ChunkSize, 256)
	def(&opt.LastSeenBuckets, 1024)
	if opt.PublishLease == 0 {
		opt.PublishLease = 5 * time.Second
	}
	if opt.Prefix == "" {
		opt.Prefix = "presence"
	}
	if opt.Holder == "" {
		opt.Holder = randomHolder()
	}
	return opt
}

// Validate checks opt as given: call WithDefaults first to fill zero
// fields. A caller sees the first problem, in the order checked here.
func (opt Options) Validate() error {
	if err := presence.ValidateRegion(opt.Region); err != nil {
		return &presence.ConfigError{Field: "region", Rule: err.Error()}
	}
	if opt.Sink == nil {
		return &presence.ConfigError{Field: "sink", Rule: "is required: transitions must go somewhere"}
	}
	if err := opt.Timing.Validate(); err != nil {
		return err
	}
	for _, c := range []struct {
		name string
		v    int
	}{{"max batch", opt.MaxBatch}, {"chunk size", opt.ChunkSize}, {"max outbox", opt.MaxOutbox}, {"last-seen buckets", opt.LastSeenBuckets}} {
		if c.v < 0 {
			return &presence.ConfigError{Field: c.name, Rule: fmt.Sprintf("must be positive, got %d", c.v)}
		}
	}
	// Event ids are deduplicated by JetStream for two minutes; a redelivery
	// must come well inside that window.
	if opt.PublishLease < 100*time.Millisecond || opt.PublishLease > time.Minute {
		return &presence.ConfigError{Field: "publish lease", Rule: fmt.Sprintf("must be between 100ms and 1m, got %v", opt.PublishLease)}
	}
	if strings.ContainsAny(opt.Prefix, "{} \t\r\n") {
		return &presence.ConfigError{Field: "prefix", Rule: "must not contain braces or whitespace"}
	}
	return checkHolder(opt.Holder)
}

// holderBytes is the alphabet of holder names.
const holderBytes = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

// randomHolder returns a 6-byte name. Names need not be unique: codes
// are (holders.go).
func randomHolder() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	for i := range b {
		b[i] = holderBytes[int(b[i])%len(holderBytes)]
	}
	return string(b[:])
}

// checkHolder accepts 1 to 16 letters and digits: a holder name sits in
// the registry's '|'-separated values.
func checkHolder(h string) error {
	if len(h) == 0 || len(h) > 16 || strings.Trim(h, holderBytes) != "" {
		return &presence.ConfigError{Field: "holder", Rule: fmt.Sprintf("must be 1 to 16 letters and digits, got %q", h)}
	}
	return nil
}

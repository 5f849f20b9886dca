package bus

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/presence-dev/presence/presence"
)

// StreamPrefix starts the name of every region's stream: PRESENCE_<region>.
const StreamPrefix = "PRESENCE_"

// DuplicateWindow is how long the stream remembers a Nats-Msg-Id. The
// regional store redelivers unacknowledged transitions well inside it
// (its publish lease is at most a minute), so a redelivery is not stored
// twice.
const DuplicateWindow = 2 * time.Minute

// Stream defaults.
const (
	DefaultMaxAge   = 24 * time.Hour
	DefaultReplicas = 1
)

// StreamName is the name of a region's stream.
func StreamName(region string) string { return StreamPrefix + region }

// StreamConfig describes a region's stream. Zero fields take their
// defaults; see WithDefaults.
type StreamConfig struct {
	Region   string                // required; a valid bus region
	MaxAge   time.Duration         // how long transitions are kept; default 24h
	Replicas int                   // 1 to 5; default 1
	Storage  jetstream.StorageType // FileStorage (the zero value) or MemoryStorage
}

// WithDefaults returns c with every zero field set to its default.
func (c StreamConfig) WithDefaults() StreamConfig {
	if c.MaxAge == 0 {
		c.MaxAge = DefaultMaxAge
	}
	if c.Replicas == 0 {
		c.Replicas = DefaultReplicas
	}
	return c
}

// Validate checks c as given: call WithDefaults first to fill zero fields.
func (c StreamConfig) Validate() error {
	if err := ValidateRegion(c.Region); err != nil {
		return &presence.ConfigError{Field: "region", Rule: err.Error()}
	}
	// The server refuses a duplicate window longer than the max age.
	if c.MaxAge < DuplicateWindow {
		return &presence.ConfigError{Field: "max age", Rule: fmt.Sprintf("must be at least the duplicate window (%v), got %v", DuplicateWindow, c.MaxAge)}
	}
	if c.Replicas < 1 || c.Replicas > 5 {
		return &presence.ConfigError{Field: "replicas", Rule: fmt.Sprintf("must be between 1 and 5, got %d", c.Replicas)}
	}
	if c.Storage != jetstream.FileStorage && c.Storage != jetstream.MemoryStorage {
		return &presence.ConfigError{Field: "storage", Rule: fmt.Sprintf("must be file or memory, got %d", int(c.Storage))}
	}
	return nil
}

// JetStream returns the stream configuration EnsureStream applies: it
// takes what nodes publish on presence-in.<region>.>, stores it as
// presence.<region>.> and republishes each stored message there (see
// IngestRoot).
func (c StreamConfig) JetStream() jetstream.StreamConfig {
	stored := RegionFilter(c.Region)
	return jetstream.StreamConfig{
		Name:             StreamName(c.Region),
		Description:      "presence transitions of region " + c.Region,
		Subjects:         []string{IngestFilter(c.Region)},
		SubjectTransform: &jetstream.SubjectTransformConfig{Source: IngestFilter(c.Region), Destination: stored},
		RePublish:        &jetstream.RePublish{Source: stored, Destination: stored},
		Retention:        jetstream.LimitsPolicy,
		Discard:          jetstream.DiscardOld,
		MaxAge:           c.MaxAge,
		Storage:          c.Storage,
		Replicas:         c.Replicas,
		Duplicates:       DuplicateWindow,
		AllowDirect:      true,
	}
}

// EnsureStream creates the region's stream, or updates it to cfg if it
// exists. Calling it again with the same cfg changes nothing.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) (jetstream.Stream, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if js == nil {
		return nil, &presence.ConfigError{Field: "jetstream", Rule: "is required"}
	}
	s, err := js.CreateOrUpdateStream(ctx, cfg.JetStream())
	if err != nil {
		return nil, fmt.Errorf("bus: ensure stream %s: %w", StreamName(cfg.Region), err)
	}
	return s, nil
}

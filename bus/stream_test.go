package bus_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/testnats"
	"github.com/presence-dev/presence/presence"
)

func TestStreamConfigDefaults(t *testing.T) {
	c := bus.StreamConfig{Region: "eu"}.WithDefaults()
	if c.MaxAge != 24*time.Hour || c.Replicas != 1 || c.Storage != jetstream.FileStorage {
		t.Fatalf("defaults: %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	js := c.JetStream()
	// Nodes publish on presence-in.eu.>; the stream stores and then
	// republishes on presence.eu.>.
	if js.Name != "PRESENCE_eu" || len(js.Subjects) != 1 || js.Subjects[0] != "presence-in.eu.>" ||
		js.SubjectTransform == nil || js.SubjectTransform.Destination != "presence.eu.>" ||
		js.RePublish == nil || js.RePublish.Source != "presence.eu.>" || js.RePublish.Destination != "presence.eu.>" ||
		js.Duplicates != 2*time.Minute || js.Retention != jetstream.LimitsPolicy || js.MaxAge != 24*time.Hour {
		t.Fatalf("stream config: %+v", js)
	}
}

func TestStreamConfigValidate(t *testing.T) {
	for _, c := range []struct {
		cfg   bus.StreamConfig
		field string
		rule  string
	}{
		{bus.StreamConfig{}, "region", "must not be empty"},
		{bus.StreamConfig{Region: "global"}, "region", "reserved"},
		{bus.StreamConfig{Region: "e.u"}, "region", "not allowed"},
		{bus.StreamConfig{Region: "eu", MaxAge: time.Minute}, "max age", "at least the duplicate window"},
		{bus.StreamConfig{Region: "eu", MaxAge: -time.Hour}, "max age", "at least the duplicate window"},
		{bus.StreamConfig{Region: "eu", Replicas: 6}, "replicas", "between 1 and 5"},
		{bus.StreamConfig{Region: "eu", Replicas: -1}, "replicas", "between 1 and 5"},
		{bus.StreamConfig{Region: "eu", Storage: 7}, "storage", "file or memory"},
	} {
		t.Run(c.field+" "+c.rule, func(t *testing.T) {
			err := c.cfg.WithDefaults().Validate()
			var ce *presence.ConfigError
			if !errors.As(err, &ce) || ce.Field != c.field || !strings.Contains(err.Error(), c.rule) || !strings.HasPrefix(err.Error(), "presence: config: ") {
				t.Errorf("%+v: got %v, want %s: %s", c.cfg, err, c.field, c.rule)
			}
			// EnsureStream rejects it before any request.
			if _, err := bus.EnsureStream(t.Context(), nil, c.cfg); !errors.As(err, &ce) {
				t.Errorf("EnsureStream(%+v) = %v", c.cfg, err)
			}
		})
	}
}

func TestEnsureStreamIdempotent(t *testing.T) {
	nc := testnats.Connect(t, testnats.Start(t))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := bus.StreamConfig{Region: "eu", MaxAge: time.Hour}
	s1, err := bus.EnsureStream(t.Context(), js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	i1 := streamInfo(t, s1)
	s2, err := bus.EnsureStream(t.Context(), js, cfg)
	if err != nil {
		t.Fatalf("second EnsureStream: %v", err)
	}
	i2 := streamInfo(t, s2)
	if !i1.Created.Equal(i2.Created) || i2.Config.MaxAge != time.Hour || i2.Config.Duplicates != 2*time.Minute ||
		i2.Config.Subjects[0] != "presence-in.eu.>" || i2.Config.Storage != jetstream.FileStorage {
		t.Fatalf("second call changed the stream: %+v -> %+v", i1.Config, i2.Config)
	}
	// A changed setting is applied in place.
	s3, err := bus.EnsureStream(t.Context(), js, bus.StreamConfig{Region: "eu", MaxAge: 2 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if i3 := streamInfo(t, s3); i3.Config.MaxAge != 2*time.Hour || !i3.Created.Equal(i1.Created) {
		t.Fatalf("update: %+v", i3.Config)
	}
	// Storage cannot change in place; the error says which stream.
	if _, err := bus.EnsureStream(t.Context(), js, bus.StreamConfig{Region: "eu", Storage: jetstream.MemoryStorage}); err == nil || !strings.Contains(err.Error(), "bus: ensure stream PRESENCE_eu") {
		t.Fatalf("storage change: %v", err)
	}
	mem, err := bus.EnsureStream(t.Context(), js, bus.StreamConfig{Region: "us", Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	if i := streamInfo(t, mem); i.Config.Storage != jetstream.MemoryStorage || i.Config.Name != "PRESENCE_us" {
		t.Fatalf("memory stream: %+v", i.Config)
	}
}

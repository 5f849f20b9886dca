package region

import (
	"errors"
	"testing"
	"time"

	"github.com/presence-dev/presence/presence"
)

// WithDefaults and Validate are New's two steps, exported: Validate
// checks options as given, and WithDefaults fills every default New
// would, the timing's included.
func TestOptionsWithDefaultsThenValidate(t *testing.T) {
	var ce *presence.ConfigError
	if err := (Options{}).WithDefaults().Validate(); !errors.As(err, &ce) || ce.Field != "region" {
		t.Fatalf("zero options: %v, want the region refused first", err)
	}
	o := Options{Region: "eu", Sink: &collector{}}
	if err := o.Validate(); err == nil {
		t.Fatal("unfilled options passed: their zero timing must be refused")
	}
	f := o.WithDefaults()
	if err := f.Validate(); err != nil {
		t.Fatalf("filled options: %v", err)
	}
	if f.Timing != (presence.Timing{}).WithDefaults() || f.MaxBatch != 10000 || f.ChunkSize != 256 || f.LastSeenBuckets != 1024 ||
		f.PublishLease != 5*time.Second || f.Prefix != "presence" || checkHolder(f.Holder) != nil || f.MaxOutbox != 0 {
		t.Fatalf("defaults: %+v", f)
	}
	for _, tc := range []struct {
		edit  func(*Options)
		field string
	}{
		{func(o *Options) { o.MaxBatch = -1 }, "max batch"},
		{func(o *Options) { o.ChunkSize = -1 }, "chunk size"},
		{func(o *Options) { o.MaxOutbox = -1 }, "max outbox"},
		{func(o *Options) { o.LastSeenBuckets = -1 }, "last-seen buckets"},
		{func(o *Options) { o.PublishLease = 50 * time.Millisecond }, "publish lease"},
		{func(o *Options) { o.Prefix = "a b" }, "prefix"},
		{func(o *Options) { o.Holder = "no|pipes" }, "holder"},
	} {
		o := f
		tc.edit(&o)
		if err := o.WithDefaults().Validate(); !errors.As(err, &ce) || ce.Field != tc.field {
			t.Errorf("%s: %v, want a config error about it", tc.field, err)
		}
	}
}

package region

import (
	"context"
	"errors"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
)

// TestARegionOfAnotherFormatIsRefused: a store writes the region's format
// version on a region with no data and accepts its own; data of the
// format before versions (a reap index and no version key), or another
// version, is refused at Preload with a SchemaError, and nothing is
// written. A single Redis and a cluster alike.
func TestARegionOfAnotherFormatIsRefused(t *testing.T) {
	ctx := context.Background()
	sink := SinkFunc(func(context.Context, []presence.Transition) (uint64, error) { return 0, nil })
	single, _ := testredis.Client(t)
	cluster, _ := testredis.Cluster(t, 3)
	for name, rdb := range map[string]redis.UniversalClient{"single": single, "cluster": cluster} {
		t.Run(name, func(t *testing.T) {
			fresh := newStore(t, rdb, sink, func(o *Options) { o.Prefix = "fresh" })
			if err := fresh.Preload(ctx); err != nil {
				t.Fatalf("a region with no data: %v", err)
			}
			if v, _ := rdb.Get(ctx, "fresh:schema").Result(); v != FormatVersion {
				t.Fatalf("version key %q, want %q", v, FormatVersion)
			}
			// The region is used, then a second store starts: accepted.
			if _, err := fresh.Claim(ctx, []presence.SessionRef{{Room: "r", User: "u", Session: "s"}}); err != nil {
				t.Fatal(err)
			}
			if err := newStore(t, rdb, sink, func(o *Options) { o.Prefix = "fresh" }).Preload(ctx); err != nil {
				t.Fatalf("a second store on the same format: %v", err)
			}

			// Data of this format written without Preload (a store that
			// skipped it): a reap index and a holder registry, no key.
			nopre := newStore(t, rdb, sink, func(o *Options) { o.Prefix = "nopre" })
			if _, err := nopre.Claim(ctx, []presence.SessionRef{{Room: "r", User: "u", Session: "s"}}); err != nil {
				t.Fatal(err)
			}
			if err := newStore(t, rdb, sink, func(o *Options) { o.Prefix = "nopre" }).Preload(ctx); err != nil {
				t.Fatalf("data of this format with no version key: %v", err)
			}

			// Data of the format before versions: a reap index, no key.
			if err := rdb.ZAdd(ctx, "old:reap:{r}", redis.Z{Score: 1, Member: "old:{r}"}).Err(); err != nil {
				t.Fatal(err)
			}
			var se *SchemaError
			err := newStore(t, rdb, sink, func(o *Options) { o.Prefix = "old" }).Preload(ctx)
			if !errors.As(err, &se) || se.Found != "1" {
				t.Fatalf("old data: %v, want a SchemaError of format 1", err)
			}
			if n, _ := rdb.Exists(ctx, "old:schema").Result(); n != 0 {
				t.Fatal("the refusal wrote the version key")
			}

			// A format newer than this release reads.
			next := strconv.Itoa(newestFormat + 1)
			if err := rdb.Set(ctx, "next:schema", next, 0).Err(); err != nil {
				t.Fatal(err)
			}
			err = newStore(t, rdb, sink, func(o *Options) { o.Prefix = "next" }).Preload(ctx)
			if !errors.As(err, &se) || se.Found != next {
				t.Fatalf("format %s: %v, want a SchemaError of format %s", next, err, next)
			}
		})
	}
}

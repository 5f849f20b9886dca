package region

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// The region's data format. Version 2 (holder codes in session entries,
// until in whole seconds in the member zsets) cannot read version 1 right:
// a member's until in ms would read as seconds far ahead, a ghost. So a
// store refuses a region whose data is of another version, and a region
// moves to a new version on an empty keyspace (a new Options.Prefix, or
// Redis emptied after every node of the old version stopped).
const schemaVersion = "2"

// FormatVersion is the data format this store reads and writes.
const FormatVersion = schemaVersion

// SchemaError is a region holding data of another format than this
// store's: its nodes must not write it (see region/doc.go, "Upgrading").
type SchemaError struct {
	Found, Want string // Found "1": data with no version key (older releases)
	Key         string
}

func (e *SchemaError) Error() string {
	return fmt.Sprintf("presence: the region's data (%s) is of format %s, this store writes format %s: start the region on an empty keyspace (a new prefix, or Redis emptied once every node of the old release has stopped)",
		e.Key, e.Found, e.Want)
}

func (s *Store) schemaKey() string { return s.opt.Prefix + ":schema" }

// checkSchema accepts the region if its version key names this store's
// format, or if it has no data yet or only data of this format written by
// stores that did not Preload (a holder registry: only this format has
// one); then it writes the key. Other data with no version key is of the
// format before versions: refused.
func (s *Store) checkSchema(ctx context.Context) error {
	key := s.schemaKey()
	for range 2 {
		v, err := s.rdb.Get(ctx, key).Result()
		switch {
		case err == nil && v == schemaVersion:
			return nil
		case err == nil:
			return &SchemaError{Found: v, Want: schemaVersion, Key: key}
		case !errors.Is(err, redis.Nil):
			return err
		}
		old, err := s.hasRegionData(ctx)
		if err == nil && old {
			var n int64
			n, err = s.rdb.Exists(ctx, s.holdersKey()).Result()
			old = n == 0
		}
		if err != nil {
			return err
		}
		if old {
			return &SchemaError{Found: "1", Want: schemaVersion, Key: s.opt.Prefix + ":*"}
		}
		if ok, err := s.rdb.SetNX(ctx, key, schemaVersion, 0).Result(); err != nil || ok {
			return err
		}
		// Another store wrote it meanwhile: read it again.
	}
	return nil
}

// hasRegionData reports whether any reap index exists: every region with
// data has one per slot in use (presence:reap, on a cluster
// presence:reap:{tag}). A full SCAN, run only while the version key is
// missing: on a region's first start, or on data of the old format.
func (s *Store) hasRegionData(ctx context.Context) (bool, error) {
	pattern := strings.NewReplacer(`*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`, `\`, `\\`).Replace(s.opt.Prefix) + ":reap*"
	scan := func(ctx context.Context, c redis.Cmdable) (bool, error) {
		var cursor uint64
		for {
			keys, next, err := c.Scan(ctx, cursor, pattern, 1000).Result()
			if err != nil {
				return false, err
			}
			if len(keys) > 0 {
				return true, nil
			}
			if next == 0 {
				return false, nil
			}
			cursor = next
		}
	}
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		var found atomic.Bool // the masters are scanned at once
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			f, err := scan(ctx, c)
			if f {
				found.Store(true)
			}
			return err
		})
		return found.Load(), err
	}
	return scan(ctx, s.rdb)
}

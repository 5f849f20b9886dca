package region

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// The region's data format. presence:schema, the region's format marker,
// names the format its data is in: every store writes that format, and a
// store refuses a region in a format it cannot read. A release reads the
// formats from oldestFormat to newestFormat (format_release.go), so a
// release of a new format runs beside the one before it in a region of
// the old format, and the region switches once no store of the old
// release is left (upgrade.go; doc.go, "Upgrading"). Version 2 (holder
// codes in session entries, until in whole seconds) cannot read the data
// of version 1, the format before versions: until in ms would read as
// seconds far ahead, a ghost.
const oldestFormat = 2

// SchemaError is a region holding data of a format this store cannot
// read: its nodes must not write it (see region/doc.go, "Upgrading").
type SchemaError struct {
	Found, Want string // Found "1": data with no version key (older releases); Want: what this store reads
	Key         string
}

func (e *SchemaError) Error() string {
	return fmt.Sprintf("presence: the region's data (%s) is of format %s, this store reads format %s: run a release that reads it (region/doc.go, Upgrading), or start the region on an empty keyspace (a new prefix)",
		e.Key, e.Found, e.Want)
}

// readsWhat names the formats this release reads, for errors.
func readsWhat() string {
	if oldestFormat == newestFormat {
		return strconv.Itoa(newestFormat)
	}
	return fmt.Sprintf("%d to %d", oldestFormat, newestFormat)
}

// readable parses a marker's value and reports whether this release reads
// that format.
func readable(v string) (int, bool) {
	n, err := strconv.Atoi(v)
	return n, err == nil && n >= oldestFormat && n <= newestFormat
}

func (s *Store) schemaKey() string { return s.opt.Prefix + ":schema" }

// checkSchema accepts the region if its marker names a format this store
// reads, which it then writes; or if it has no data yet (it writes the
// newest format it reads), or only data written by stores that did not
// Preload, which is format 2 (a holder registry: the format before it has
// none). Other data with no marker is of the format before versions:
// refused.
func (s *Store) checkSchema(ctx context.Context) error {
	key := s.schemaKey()
	for range 2 {
		v, err := s.rdb.Get(ctx, key).Result()
		if err == nil {
			n, ok := readable(v)
			if !ok {
				return &SchemaError{Found: v, Want: readsWhat(), Key: key}
			}
			s.writesFormat(n, time.Now())
			return nil
		}
		if !errors.Is(err, redis.Nil) {
			return err
		}
		mark, err := s.unmarkedFormat(ctx)
		if err != nil {
			return err
		}
		if _, ok := readable(mark); !ok {
			return &SchemaError{Found: mark, Want: readsWhat(), Key: s.opt.Prefix + ":*"}
		}
		if ok, err := s.rdb.SetNX(ctx, key, mark, 0).Result(); err != nil {
			return err
		} else if ok {
			n, _ := readable(mark)
			s.writesFormat(n, time.Now())
			return nil
		}
		// Another store wrote it meanwhile: read it again.
	}
	return nil
}

// unmarkedFormat is the format of a region with no marker: the newest
// this release reads when it has no data, 2 for data with a holder
// registry, 1 for other data.
func (s *Store) unmarkedFormat(ctx context.Context) (string, error) {
	data, err := s.hasRegionData(ctx)
	if err != nil || !data {
		return strconv.Itoa(newestFormat), err
	}
	n, err := s.rdb.Exists(ctx, s.holdersKey()).Result()
	if err != nil {
		return "", err
	}
	if n == 0 {
		return "1", nil
	}
	return "2", nil
}

// pollFormat reads the region's marker again, at most once a heartbeat
// (hold calls it before a write, under holdMu): a store writes the format
// the region has switched to within a heartbeat, and one that finds a
// format it cannot read writes nothing more (badFormat). A marker that is
// missing or cannot be read leaves the format as it was.
func (s *Store) pollFormat(ctx context.Context, now time.Time) {
	if now.Before(s.formatNext) {
		return
	}
	s.formatNext = now.Add(s.t.Heartbeat)
	v, err := s.rdb.Get(ctx, s.schemaKey()).Result()
	if err != nil {
		return
	}
	n, ok := readable(v)
	if !ok {
		se := &SchemaError{Found: v, Want: readsWhat(), Key: s.schemaKey()}
		s.log.Error("presence: the region switched to a format this release cannot read; this store writes nothing more", "region", s.opt.Region, "err", se)
		s.badFormat.Store(se)
		return
	}
	if old := s.format.Load(); old != int64(n) {
		s.writesFormat(n, now)
		s.log.Info("presence: the region's data format changed; this store writes it", "region", s.opt.Region, "from", old, "to", n)
	}
}

// writeFormat is the format this store writes: the region's, as last read.
func (s *Store) writeFormat() int64 { return s.format.Load() }

// writesFormat makes the store write format n from now on, and its
// refreshes move the states they write to it for moveSpan.
func (s *Store) writesFormat(n int, now time.Time) {
	s.format.Store(int64(n))
	s.moveUntil.Store(now.Add(s.moveSpan()).UnixNano())
}

// moveSpan is how long after a store begins writing a format its
// refreshes move each state they write to it (state_move in lib.lua). Its
// heartbeat refreshes every session it holds within a heartbeat, so by
// then each is moved; the TTL more covers a heartbeat that came late. A
// refresh that fails inside the span starts it again (keepMoving). After
// it a refresh reads no state: the heartbeat's path stays as cheap as in
// a region that never switched. A claim always moves (a session taken
// from a store that died before it moved it), and a state written is
// always written in the region's format.
func (s *Store) moveSpan() time.Duration { return s.t.SessionTTL + s.t.Heartbeat }

// moveFormat is touch.lua's ARGV[12]: the format to move the states of
// the sessions a touch writes to, or 0 for none.
func (s *Store) moveFormat(claim bool, now time.Time) int64 {
	if claim || now.UnixNano() < s.moveUntil.Load() {
		return s.writeFormat()
	}
	return 0
}

// keepMoving starts the span again after a refresh inside it failed: the
// sessions it would have moved are moved by the next one.
func (s *Store) keepMoving(now time.Time) {
	if now.UnixNano() < s.moveUntil.Load() {
		s.moveUntil.Store(now.Add(s.moveSpan()).UnixNano())
	}
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

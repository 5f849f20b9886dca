package region

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
)

// A region switched to a format this release cannot read (by the next
// release's FinishUpgrade) is refused at run time too: within a heartbeat
// a running store writes nothing more, each write failing with a
// SchemaError, its Ping (a node's /healthz) fails with it, and what it
// wrote before stays as it was.
func TestASwitchToAnUnreadableFormatStopsWrites(t *testing.T) {
	ctx := context.Background()
	rdb, _ := testredis.Client(t)
	s := newStore(t, rdb, &collector{})
	if err := s.Preload(ctx); err != nil {
		t.Fatal(err)
	}
	r := ref("r", "u", "a")
	touch(t, s, r)
	entry := "u:a" + s.code()
	next := strconv.Itoa(newestFormat + 1)
	if err := rdb.Set(ctx, "presence:schema", next, 0).Err(); err != nil {
		t.Fatal(err)
	}
	var se *SchemaError
	testkit.CheckFor(t, 5*testTiming.Heartbeat, 10*time.Millisecond, func() error {
		_, err := s.Refresh(ctx, []presence.SessionRef{r})
		if !errors.As(err, &se) {
			return fmt.Errorf("a refresh after the switch: %v, want a SchemaError", err)
		}
		return nil
	})
	if se.Found != next {
		t.Fatalf("refused with %v, want format %s found", se, next)
	}
	// From the first refusal on, nothing is written.
	before, err := rdb.ZScore(ctx, "presence:{r}:s", entry).Result()
	if err != nil {
		t.Fatal(err)
	}
	waitRedisPast(t, rdb, time.Now().Add(time.Second)) // a refresh now would move the expiry by a second
	if _, err := s.Refresh(ctx, []presence.SessionRef{r}); !errors.As(err, &se) {
		t.Fatalf("a refresh after the switch: %v, want a SchemaError", err)
	}
	if err := s.Ping(ctx); !errors.As(err, &se) {
		t.Fatalf("ping after the switch: %v, want the SchemaError (a node's health says it)", err)
	}
	if _, err := s.SetState(ctx, r, []byte(`{"x":1}`)); !errors.As(err, &se) {
		t.Fatalf("set state after the switch: %v, want a SchemaError", err)
	}
	if err := s.Release(ctx, r); !errors.As(err, &se) {
		t.Fatalf("release after the switch: %v, want a SchemaError", err)
	}
	after, _ := rdb.ZScore(ctx, "presence:{r}:s", entry).Result()
	if after != before {
		t.Fatalf("the entry's expiry moved from %v to %v after the refusal", before, after)
	}
	if n, _ := rdb.HLen(ctx, "presence:{r}:st").Result(); n != 0 {
		t.Fatalf("a state was written after the refusal")
	}
}

// The registry names the newest format each holder reads; an entry of a
// release before formats were registered reads as format 2. A store's
// Close ends its lease, so the switch does not wait for it, and a write
// after Close takes the lease again.
func TestTheRegistryNamesFormatsAndCloseEndsALease(t *testing.T) {
	ctx := context.Background()
	rdb, _ := testredis.Client(t)
	s := newStore(t, rdb, &collector{}, func(o *Options) { o.Holder = "n1" })
	if err := s.Preload(ctx); err != nil {
		t.Fatal(err)
	}
	touch(t, s, ref("r", "u", "a"))
	setRegistry(t, rdb, "\xf0", "old", time.Now().Add(time.Minute).UnixMilli(), time.Now().Add(2*time.Minute).UnixMilli())
	st, err := s.FormatStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, h := range st.Holders {
		got[h.Name] = h.Format
	}
	if got["n1"] != newestFormat || got["x"] != 2 || len(got) != 2 {
		t.Fatalf("holders %v, want n1 of format %d and x (no format written) of 2", got, newestFormat)
	}
	if st.Region != newestFormat || st.Newest != newestFormat {
		t.Fatalf("status %+v, want a region of format %d", st, newestFormat)
	}
	s.Close()
	st, err = s.FormatStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range st.Holders {
		if h.Name == "n1" {
			t.Fatalf("n1 listed after its Close: %+v", h)
		}
	}
	touch(t, s, ref("r", "u", "b"))
	if st, _ = s.FormatStatus(ctx); len(st.Holders) != 2 {
		t.Fatalf("after a write past Close: holders %+v, want n1 again", st.Holders)
	}
}

// A region already in this release's format has nothing to switch:
// FinishUpgrade leaves the marker as it is, whatever holders run.
func TestFinishingInTheNewestFormatChangesNothing(t *testing.T) {
	ctx := context.Background()
	rdb, _ := testredis.Client(t)
	s := newStore(t, rdb, &collector{})
	if err := s.Preload(ctx); err != nil {
		t.Fatal(err)
	}
	setRegistry(t, rdb, "\xf0", "old", time.Now().Add(time.Minute).UnixMilli(), time.Now().Add(2*time.Minute).UnixMilli())
	st, err := s.FinishUpgrade(ctx)
	if err != nil || st.Region != newestFormat {
		t.Fatalf("finish: %+v, %v; want format %d and no error", st, err, newestFormat)
	}
	if v, _ := rdb.Get(ctx, "presence:schema").Result(); v != FormatVersion {
		t.Fatalf("marker %q, want %q", v, FormatVersion)
	}
	// A marker that is not a format: refused, not parsed.
	if err := rdb.Set(ctx, "presence:schema", "2x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	var se *SchemaError
	if _, err := s.FinishUpgrade(ctx); !errors.As(err, &se) {
		t.Fatalf("finish on a marker %q: %v, want a SchemaError", "2x", err)
	}
}

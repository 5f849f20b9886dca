package region

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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

// A store that read the region's marker just before the next release
// switched the region (its heartbeat's poll is not due again) and then
// takes a lease gets none: the switch barred the registry to holders of
// its format in the step that found none of them holding a lease, so the
// store writes nothing in the old format after the switch. Without the
// bar it would write under a fresh lease for up to a heartbeat.
func TestAStoreThatReadTheOldMarkerWritesNothingAfterTheSwitch(t *testing.T) {
	ctx := context.Background()
	rdb, _ := testredis.Client(t)
	s := newStore(t, rdb, &collector{})
	if err := s.Preload(ctx); err != nil {
		t.Fatal(err)
	}
	touch(t, s, ref("r", "u", "a"))
	s.Close() // its lease ends, so the switch need not wait for it
	s.holdMu.Lock()
	s.formatNext = time.Now().Add(time.Hour) // it has just read the marker
	s.holdMu.Unlock()

	next := newestFormat + 1
	switchTo(t, rdb, next)
	_, err := s.Claim(ctx, []presence.SessionRef{ref("r", "v", "b")})
	var se *SchemaError
	if !errors.As(err, &se) || se.Found != strconv.Itoa(next) {
		t.Fatalf("a claim after the switch: %v, want a SchemaError naming format %d", err, next)
	}
	if n, _ := rdb.ZCard(ctx, "presence:{r}:s").Result(); n != 1 {
		t.Fatalf("%d session entries after the switch, want only the one written before it", n)
	}
	if err := s.Ping(ctx); !errors.As(err, &se) {
		t.Fatalf("ping after the refusal: %v, want the SchemaError", err)
	}
}

// The fence refuses, and writes nothing, while a holder that cannot read
// the new format holds a lease, naming it; the bar it writes is no holder
// in the registry's listing.
func TestTheFenceWaitsForLeasesOfOlderHolders(t *testing.T) {
	ctx := context.Background()
	rdb, _ := testredis.Client(t)
	s := newStore(t, rdb, &collector{}, func(o *Options) { o.Holder = "n1" })
	if err := s.Preload(ctx); err != nil {
		t.Fatal(err)
	}
	touch(t, s, ref("r", "u", "a"))
	next := newestFormat + 1
	res, err := scriptFence.Run(ctx, rdb, []string{"presence:holders"}, next).Slice()
	if err != nil || len(res) != 4 || num(res[0]) != 0 || str(res[2]) != s.code() {
		t.Fatalf("fence with n1's lease running: %v %v, want it refused naming n1's code", res, err)
	}
	if ok, _ := rdb.HExists(ctx, "presence:holders", "format").Result(); ok {
		t.Fatal("a refused fence wrote the bar")
	}
	s.Close()
	if res, err := scriptFence.Run(ctx, rdb, []string{"presence:holders"}, next).Slice(); err != nil || num(res[0]) != 1 {
		t.Fatalf("fence once n1's lease ended: %v %v", res, err)
	}
	st, err := s.FormatStatus(ctx)
	if err != nil || len(st.Holders) != 0 || st.Region != newestFormat {
		t.Fatalf("status after the fence: %+v, %v; want no holder (the bar is none)", st, err)
	}
}

// switchTo does what the next release's FinishUpgrade does: fence, then
// move the marker.
func switchTo(tb testing.TB, rdb redis.UniversalClient, format int) {
	tb.Helper()
	ctx := context.Background()
	res, err := scriptFence.Run(ctx, rdb, []string{"presence:holders"}, format).Slice()
	if err != nil || num(res[0]) != 1 {
		tb.Fatalf("fence: %v %v", res, err)
	}
	if err := rdb.Set(ctx, "presence:schema", strconv.Itoa(format), 0).Err(); err != nil {
		tb.Fatal(err)
	}
}

// A refresh that fails while refreshes still move states starts the span
// again; one after the span leaves it ended.
func TestAFailedRefreshKeepsStatesMoving(t *testing.T) {
	rdb, _ := testredis.Client(t)
	s := newStore(t, rdb, &collector{})
	now := time.Now()
	s.writesFormat(newestFormat, now)
	later := now.Add(s.moveSpan() / 2)
	s.keepMoving(later)
	if got := s.moveFormat(false, later.Add(s.moveSpan()-time.Millisecond)); got != newestFormat {
		t.Fatalf("a refresh a span after a failure inside it moves to %d, want %d", got, newestFormat)
	}
	end := later.Add(s.moveSpan())
	if got := s.moveFormat(false, end); got != 0 {
		t.Fatalf("a refresh after the span moves to %d, want 0 (none)", got)
	}
	s.keepMoving(end)
	if got := s.moveFormat(false, end.Add(time.Millisecond)); got != 0 {
		t.Fatalf("a failure after the span started it again")
	}
	if got := s.moveFormat(true, end); got != newestFormat {
		t.Fatalf("a claim moves to %d, want %d always", got, newestFormat)
	}
}

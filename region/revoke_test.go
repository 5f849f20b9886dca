package region

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
)

// Revocations are read back until they end, one per user and room, a
// later write replacing an earlier one; the key expires with the last.
func TestRevocationsLiveUntilTheyEnd(t *testing.T) {
	rdb, _ := testredis.Client(t)
	now := time.Now()
	s := newStore(t, rdb, &collector{})
	s.now = func() time.Time { return now }
	ctx := context.Background()
	for _, r := range []presence.Revocation{
		{User: "alice", Until: now.Add(time.Hour)},
		{User: "bob", Room: "room42", Until: now.Add(time.Minute)},
		{User: "bob", Room: "room7", Until: now.Add(2 * time.Minute)},
		{User: "alice", Until: now.Add(10 * time.Minute)}, // shortened
	} {
		if err := s.Revoke(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Revocations(ctx)
	if err != nil || len(got) != 3 {
		t.Fatalf("revocations: %v %v", got, err)
	}
	if got[0].User != "bob" || got[0].Room != "room42" || got[2].User != "alice" || got[2].Room != "" ||
		got[2].Until.UnixMilli() != now.Add(10*time.Minute).UnixMilli() {
		t.Fatalf("revocations: %+v", got)
	}
	ttl, err := rdb.PTTL(ctx, s.revokedKey()).Result()
	if err != nil || ttl < 59*time.Minute || ttl > time.Hour {
		t.Fatalf("key TTL %v %v, want the latest written end (an hour)", ttl, err)
	}

	// Ninety seconds on: bob's room42 revocation has ended, and the next
	// write drops it from the key.
	now = now.Add(90 * time.Second)
	if got, _ := s.Revocations(ctx); len(got) != 2 || got[0].Room != "room7" {
		t.Fatalf("after 90s: %+v", got)
	}
	if err := s.Revoke(ctx, presence.Revocation{User: "carol", Until: now.Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if n, _ := rdb.ZCard(ctx, s.revokedKey()).Result(); n != 3 {
		t.Fatalf("members after a write: %d, want 3 (the ended one dropped)", n)
	}
	// A member written by hand is skipped, not a failed read.
	rdb.ZAdd(ctx, s.revokedKey(), redis.Z{Score: float64(now.Add(time.Hour).UnixMilli()), Member: "no-colon"})
	if got, err := s.Revocations(ctx); err != nil || len(got) != 3 {
		t.Fatalf("with a malformed member: %v %v", got, err)
	}
}

func TestRevokeRefusesBadRevocations(t *testing.T) {
	rdb, _ := testredis.Client(t)
	s := newStore(t, rdb, &collector{})
	ctx := context.Background()
	now := time.Now()
	for _, r := range []presence.Revocation{
		{User: "a.b", Until: now.Add(time.Hour)},
		{User: "alice", Room: "r*", Until: now.Add(time.Hour)},
		{User: "alice", Until: now.Add(-time.Second)},
		{User: "alice", Until: now.Add(presence.MaxRevocation + time.Hour)},
	} {
		var oe *OpError
		if err := s.Revoke(ctx, r); !errors.As(err, &oe) {
			t.Errorf("%+v: %v", r, err)
		}
	}
	if n, _ := rdb.Exists(ctx, s.revokedKey()).Result(); n != 0 {
		t.Fatal("a refused revocation wrote the key")
	}
}

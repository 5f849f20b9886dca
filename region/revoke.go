package region

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/presence"
)

// MaxRevocationsRead bounds the revocations one Revocations call returns.
const MaxRevocationsRead = 100_000

// revokedKey is the region's revocations (doc.go, presence:revoked).
func (s *Store) revokedKey() string { return s.opt.Prefix + ":revoked" }

// revokedMember is a revocation's member of presence:revoked: "user:room",
// "user:" for every room (ids hold no ':').
func revokedMember(user, room string) string { return user + ":" + room }

// Revoke records r, replacing any revocation of the same user and room
// (so a later call may shorten one), and drops the revocations that have
// ended. The key expires once the last revocation written has ended.
func (s *Store) Revoke(ctx context.Context, r presence.Revocation) error {
	if err := r.Validate(s.now()); err != nil {
		return &OpError{"revoke", err}
	}
	key, until := s.revokedKey(), r.Until.UnixMilli()
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.ZRemRangeByScore(ctx, key, "-inf", "("+strconv.FormatInt(s.now().UnixMilli(), 10))
		p.ZAdd(ctx, key, redis.Z{Score: float64(until), Member: revokedMember(r.User, r.Room)})
		p.Do(ctx, "PEXPIREAT", key, until, "NX")
		p.Do(ctx, "PEXPIREAT", key, until, "GT")
		return nil
	})
	if err != nil {
		return &OpError{"revoke", err}
	}
	return nil
}

// Revocations returns the region's revocations that have not ended, at
// most MaxRevocationsRead of them (those ending last are left off). A
// member that is not one (written by hand) is logged and skipped.
func (s *Store) Revocations(ctx context.Context) ([]presence.Revocation, error) {
	now := strconv.FormatInt(s.now().UnixMilli(), 10)
	zs, err := s.rdb.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{
		Key: s.revokedKey(), Start: "(" + now, Stop: "+inf", ByScore: true, Count: MaxRevocationsRead,
	}).Result()
	if err != nil {
		return nil, &OpError{"revocations", err}
	}
	out := make([]presence.Revocation, 0, len(zs))
	for _, z := range zs {
		m, _ := z.Member.(string)
		user, room, ok := strings.Cut(m, ":")
		if !ok || presence.ValidateUser(user) != nil || (room != "" && presence.ValidateRoom(room) != nil) {
			s.log.Warn("presence: malformed revocation skipped", "key", s.revokedKey(), "member", m)
			continue
		}
		out = append(out, presence.Revocation{User: user, Room: room, Until: time.UnixMilli(int64(z.Score))})
	}
	return out, nil
}

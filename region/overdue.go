package region

import (
	"context"
	"math"
	"time"

	"github.com/redis/go-redis/v9"
)

// Overdue returns how long the most overdue room of the reap index has
// been due, by this process's clock (for tools on the machine or network
// of Redis): the reaper's lag. Zero means nothing waits for a sweep. On a
// cluster it reads the first entry of every slot's index, one pipeline
// per master: a tool's probe, not something to run every reap interval.
func (s *Store) Overdue(ctx context.Context) (time.Duration, error) {
	keys := []string{s.opt.Prefix + ":reap"}
	if _, ok := s.rdb.(*redis.ClusterClient); ok {
		groups, err := s.masterIndexes(ctx)
		if err != nil {
			return 0, &OpError{"overdue", err}
		}
		keys = keys[:0]
		for _, g := range groups {
			keys = append(keys, g...)
		}
	}
	cmds := make([]*redis.ZSliceCmd, len(keys))
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = p.ZRangeWithScores(ctx, k, 0, 0)
		}
		return nil
	})
	if err != nil {
		return 0, &OpError{"overdue", err}
	}
	first := math.Inf(1) // the incarnation marker sits at +inf
	for _, c := range cmds {
		if zs := c.Val(); len(zs) > 0 && zs[0].Score < first {
			first = zs[0].Score
		}
	}
	if math.IsInf(first, 1) {
		return 0, nil
	}
	return max(0, time.Duration(float64(s.now().UnixMilli())-first)*time.Millisecond), nil
}

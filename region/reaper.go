package region

import (
	"context"
	"sort"
	"time"

	"github.com/redis/go-redis/v9"
)

// reapBatch bounds the rooms one index read returns; reapLimit the users
// settled per room call; maxRounds the reads per sweep.
const (
	reapBatch = 256
	reapLimit = 1000
	maxRounds = 64
)

type dueList struct {
	index string
	rooms []string
}

// reap runs one sweep: it settles every room whose index entry is due and
// delivers the transitions that come out. Work is proportional to the due
// rooms, not to all rooms: on a cluster, one call per master reads every
// slot's index. Any number of reapers may run at once: each room script is
// atomic and first checks that the room is still due, so every change is
// announced once. A claim above zero shares the cluster sweep (see
// RunReaper); zero reads every master.
func (s *Store) reap(ctx context.Context, claim time.Duration) (int, error) {
	clk, err := s.readClock(ctx)
	if err != nil {
		return 0, &OpError{"reap", err}
	}
	// This store's own view of an outage counts too: the clock cannot
	// see one that began before any sweep wrote it.
	if lc, until := s.localHold(); lc > 0 && lc < clk.cut {
		clk.cut, clk.hold = lc, max(clk.hold, until)
	}
	lists, err := s.scanIndexes(ctx, "now", reapBatch, claim)
	total := 0
	for round := 0; err == nil && round < maxRounds; round++ {
		var reaps []call
		var rooms []string
		var again []string
		for _, l := range lists {
			for _, room := range l.rooms {
				reaps = append(reaps, call{
					script: scriptReap,
					keys:   s.roomKeys(room).writeKeys(l.index),
					args: []any{ms(s.opt.PublishLease), s.opt.MaxOutbox, room, reapLimit,
						clk.cut, clk.hold, clk.now, ms(s.t.OutageGap()), ms(s.t.SessionTTL), ms(s.t.Unrefreshed())},
				})
				rooms = append(rooms, room)
			}
			if len(l.rooms) >= reapBatch {
				again = append(again, l.index)
			}
		}
		if len(reaps) == 0 {
			return total, nil
		}
		cmds, rerr := s.exec(ctx, reaps)
		if rerr != nil {
			return total, &OpError{"reap", rerr}
		}
		s.stats.ReapedRooms.Add(int64(len(reaps)))
		pending := map[string][]string{}
		for i, c := range cmds {
			if entries, _ := c.StringSlice(); len(entries) > 0 {
				pending[rooms[i]] = entries
			}
		}
		total += len(s.deliver(ctx, pending))
		if len(again) == 0 {
			return total, nil
		}
		lists, err = s.dueIn(ctx, again)
	}
	if err != nil {
		return total, &OpError{"reap", err}
	}
	return total, nil
}

// scanIndexes reads the rooms of every reap index scored up to upto ("now"
// or "+inf"), at most limit per index. On a cluster, a claim above zero
// first takes each master's sweep marker for that long (SET NX PX) and
// reads only the masters it took: the reapers of all nodes then share
// one read of a master's slot indexes per claim period, instead of one
// each.
func (s *Store) scanIndexes(ctx context.Context, upto string, limit int, claim time.Duration) ([]dueList, error) {
	if _, ok := s.rdb.(*redis.ClusterClient); !ok {
		return s.readIndexes(ctx, []string{s.opt.Prefix + ":reap"}, upto, limit)
	}
	keys, err := s.masterIndexes(ctx)
	if err != nil {
		return nil, err
	}
	calls := make([]call, 0, len(keys))
	for _, ks := range keys {
		args := append([]any{upto, limit}, anys(ks)...)
		calls = append(calls, call{script: scriptDueAll, keys: ks[:1], args: args})
	}
	if claim > 0 {
		keys, calls = s.claimed(ctx, keys, calls, claim)
	}
	cmds, _ := runAll(ctx, s.rdb, calls)
	var out []dueList
	var retry []string
	for i, c := range cmds {
		res, err := c.Slice()
		if err != nil {
			// Slots moving between masters: read this range slot by slot.
			retry = append(retry, keys[i]...)
			continue
		}
		byIdx := map[int]*dueList{}
		for j := 0; j+1 < len(res); j += 2 {
			n := int(num(res[j])) - 1
			if n < 0 || n >= len(keys[i]) {
				continue
			}
			l := byIdx[n]
			if l == nil {
				out = append(out, dueList{index: keys[i][n]})
				l = &out[len(out)-1]
				byIdx[n] = l
			}
			l.rooms = append(l.rooms, str(res[j+1]))
		}
	}
	if len(retry) > 0 {
		more, err := s.readIndexes(ctx, retry, upto, limit)
		if err != nil {
			return out, err
		}
		out = append(out, more...)
	}
	return out, nil
}

// masterIndexes returns the reap index keys of a cluster's slots, one
// group per master (masters that serve no slots are left out).
func (s *Store) masterIndexes(ctx context.Context) ([][]string, error) {
	cc := s.rdb.(*redis.ClusterClient)
	shards, err := cc.ClusterShards(ctx).Result()
	if err != nil {
		return nil, err
	}
	var keys [][]string
	for _, sh := range shards {
		var ks []string
		for _, r := range sh.Slots {
			for slot := r.Start; slot <= r.End; slot++ {
				ks = append(ks, s.indexKeyOfSlot(int(slot)))
			}
		}
		if len(ks) > 0 {
			keys = append(keys, ks)
		}
	}
	return keys, nil
}

// claimed keeps the masters (each given by its index keys and its
// dueall call) whose sweep marker this call takes. A master whose marker
// cannot be read is kept: better a sweep too many than one too few.
func (s *Store) claimed(ctx context.Context, keys [][]string, calls []call, claim time.Duration) ([][]string, []call) {
	sets := make([]*redis.BoolCmd, len(keys))
	_, _ = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, ks := range keys {
			sets[i] = p.SetNX(ctx, sweptKey(ks[0]), 1, claim)
		}
		return nil
	})
	var k2 [][]string
	var c2 []call
	for i, set := range sets {
		if took, err := set.Result(); took || err != nil {
			k2, c2 = append(k2, keys[i]), append(c2, calls[i])
			s.stats.ClaimedSweeps.Add(1)
		} else {
			s.stats.SharedSweeps.Add(1)
		}
	}
	return k2, c2
}

// dueIn reads the due rooms of the given reap indexes.
func (s *Store) dueIn(ctx context.Context, idx []string) ([]dueList, error) {
	return s.readIndexes(ctx, idx, "now", reapBatch)
}

// readIndexes reads the given reap indexes, one call each, in one pipeline.
func (s *Store) readIndexes(ctx context.Context, idx []string, upto string, limit int) ([]dueList, error) {
	calls := make([]call, len(idx))
	for i, k := range idx {
		calls[i] = call{script: scriptDue, keys: []string{k}, args: []any{upto, limit}}
	}
	cmds, err := runAll(ctx, s.rdb, calls)
	if err != nil {
		return nil, err
	}
	var out []dueList
	for i, c := range cmds {
		if rooms, _ := c.StringSlice(); len(rooms) > 0 {
			out = append(out, dueList{index: idx[i], rooms: rooms})
		}
	}
	return out, nil
}

// RunReaper sweeps every reap interval until ctx is done (and, with
// AsyncDelivery, runs the deliverer). Errors are logged and the next
// sweep tries again. On a cluster the nodes' reapers
// share the sweep: each master's slot indexes are read by whichever
// reaper claims it first, about once per reap interval in all, however
// many nodes run.
//
// The claim lasts 4/5 of the interval, so a reaper alone is never locked
// out by its own last claim, and with several, some claim expires within
// each interval: a due room waits at most about one interval, and a
// claimer that dies after claiming costs one more.
func (s *Store) RunReaper(ctx context.Context) {
	if s.outq != nil {
		s.deliverer.Do(func() { go s.runDeliverer(ctx) })
	}
	tick := time.NewTicker(s.t.ReapInterval)
	defer tick.Stop()
	prune := time.NewTicker(s.t.LastSeenInterval)
	defer prune.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if _, err := s.reap(ctx, sweepClaim(s.t.ReapInterval)); err != nil && ctx.Err() == nil {
				s.log.Warn("presence: reap failed", "err", err)
			}
		case <-prune.C:
			s.pruneSeen()
		}
	}
}

// Sweep runs one reaper sweep now (reading every master on a cluster)
// and returns the number of transitions it delivered. RunReaper sweeps
// periodically; Sweep is for tools and benchmarks that pace it themselves.
func (s *Store) Sweep(ctx context.Context) (int, error) { return s.reap(ctx, 0) }

// sweepClaim is how long a periodic sweep claims a master.
func sweepClaim(interval time.Duration) time.Duration { return interval * 4 / 5 }

// Rooms returns every room that holds members, sessions or undelivered
// events in this region: the members of the reap indexes. It costs one
// call (one per master on a cluster) plus the size of the answer.
func (s *Store) Rooms(ctx context.Context) ([]string, error) {
	lists, err := s.scanIndexes(ctx, "+inf", 1<<30, 0)
	if err != nil {
		return nil, &OpError{"rooms", err}
	}
	var out []string
	for _, l := range lists {
		out = append(out, l.rooms...)
	}
	sort.Strings(out)
	return out, nil
}

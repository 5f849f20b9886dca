package region

import (
	"context"
	"time"
)

// reapBatch bounds one due-list read and the users settled per room call.
const (
	reapBatch = 256
	reapLimit = 1000
	maxRounds = 64
)

// Reap runs one sweep: it settles every room whose index entry is due and
// delivers the transitions that come out. Work is proportional to the due
// rooms, not to all rooms. Any number of reapers may run at once: each room
// script is atomic and first checks that the room is still due, so every
// change is announced once.
func (s *Store) Reap(ctx context.Context) (int, error) {
	idxKeys := []string{s.opt.Prefix + ":reap"}
	if s.cluster {
		idxKeys = make([]string, numSlots)
		for i := range idxKeys {
			idxKeys[i] = s.indexKeyOfSlot(i)
		}
	}
	total := 0
	for range maxRounds {
		dues := make([]call, len(idxKeys))
		for i, k := range idxKeys {
			dues[i] = call{script: scriptDue, keys: []string{k}, args: []any{reapBatch}}
		}
		cmds, err := runAll(ctx, s.rdb, dues)
		if err != nil {
			return total, &OpError{"reap", err}
		}
		var reaps []call
		var rooms []string
		var next []string
		for i, c := range cmds {
			names, _ := c.StringSlice()
			for _, room := range names {
				reaps = append(reaps, call{
					script: scriptReap,
					keys:   append([]string{idxKeys[i]}, s.roomKeys(room)...),
					args:   []any{ms(s.opt.PublishLease), s.opt.MaxOutbox, room, reapLimit},
				})
				rooms = append(rooms, room)
			}
			if len(names) == reapBatch {
				next = append(next, idxKeys[i])
			}
		}
		if len(reaps) == 0 {
			return total, nil
		}
		rcmds, err := runAll(ctx, s.rdb, reaps)
		if err != nil {
			return total, &OpError{"reap", err}
		}
		s.stats.ReapedRooms.Add(int64(len(reaps)))
		pending := map[string][]string{}
		for i, c := range rcmds {
			if entries, _ := c.StringSlice(); len(entries) > 0 {
				pending[rooms[i]] = entries
			}
		}
		total += len(s.deliver(ctx, pending))
		if len(next) == 0 {
			return total, nil
		}
		idxKeys = next
	}
	return total, nil
}

// RunReaper sweeps every reap interval until ctx is done. Errors are
// logged and the next sweep tries again.
func (s *Store) RunReaper(ctx context.Context) {
	tick := time.NewTicker(s.t.ReapInterval)
	defer tick.Stop()
	prune := time.NewTicker(s.t.LastSeenInterval)
	defer prune.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if _, err := s.Reap(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("presence: reap failed", "err", err)
			}
		case <-prune.C:
			s.pruneSeen()
		}
	}
}

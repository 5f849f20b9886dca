package node

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/presence-dev/presence/presence"
)

// scheduler keeps every session held on this node alive: each session is
// in one of N slots, and slot i is touched in one batch every period, a
// period/N after slot i-1, so the load is spread over the period instead
// of arriving in one burst. Connection goroutines only register and
// unregister; the store calls happen on the scheduler's goroutine.
//
// A session is held once per connection that joined it; two connections
// with the same session id (a tab reconnecting before its old connection
// is noticed dead) share it, and only the last one out releases it.
type scheduler struct {
	store   Store
	period  time.Duration
	batch   int
	timeout time.Duration
	log     *slog.Logger
	observe func(d time.Duration, n int, err error) // one Touch batch

	mu    sync.Mutex
	refs  map[presence.SessionRef]*hbEntry
	slots [][]presence.SessionRef
	// busy[i] is held while slot i's batch is in the store, so a release
	// can wait out a touch that copied its session before it was dropped:
	// a touch landing after a release would revive the session.
	busy []sync.Mutex

	// stripes serialize hold and unhold of one session, so the store sees
	// its creates and releases in the order the node decided them.
	stripes [64]sync.Mutex
}

type hbEntry struct {
	slot, idx int32 // position in slots
	holders   int32
}

func newScheduler(store Store, period time.Duration, nslots, batch int, timeout time.Duration, log *slog.Logger, observe func(time.Duration, int, error)) *scheduler {
	return &scheduler{
		store: store, period: period, batch: batch, timeout: timeout, log: log, observe: observe,
		refs:  map[presence.SessionRef]*hbEntry{},
		slots: make([][]presence.SessionRef, nslots),
		busy:  make([]sync.Mutex, nslots),
	}
}

func (s *scheduler) stripe(r presence.SessionRef) *sync.Mutex {
	h := uint32(2166136261) // FNV-1a
	for _, str := range [3]string{r.Room, r.User, r.Session} {
		for i := 0; i < len(str); i++ {
			h = (h ^ uint32(str[i])) * 16777619
		}
		h = (h ^ 0xff) * 16777619
	}
	return &s.stripes[h%uint32(len(s.stripes))]
}

// acquire adds a holder of r and reports whether it is the first. A new
// session goes to the least loaded slot: every slot comes round within a
// period, so it is refreshed in time whichever it is, and a burst of
// joins (a reconnect wave) does not pile into one slot.
func (s *scheduler) acquire(r presence.SessionRef) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.refs[r]; ok {
		e.holders++
		return false
	}
	best := 0
	for i := range s.slots {
		if len(s.slots[i]) < len(s.slots[best]) {
			best = i
		}
	}
	s.refs[r] = &hbEntry{slot: int32(best), idx: int32(len(s.slots[best])), holders: 1}
	s.slots[best] = append(s.slots[best], r)
	return true
}

// drop removes a holder of r. It reports whether that was the last one
// and, if so, the slot r was in.
func (s *scheduler) drop(r presence.SessionRef) (last bool, slot int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.refs[r]
	if !ok {
		return false, 0
	}
	if e.holders--; e.holders > 0 {
		return false, 0
	}
	delete(s.refs, r)
	sl := s.slots[e.slot]
	end := len(sl) - 1
	if int(e.idx) != end {
		moved := sl[end]
		sl[e.idx] = moved
		s.refs[moved].idx = e.idx
	}
	sl[end] = presence.SessionRef{}
	s.slots[e.slot] = sl[:end]
	return true, int(e.slot)
}

// hold registers r for heartbeats; the first holder creates the session
// in the store at once. On error nothing is held.
func (s *scheduler) hold(ctx context.Context, r presence.SessionRef) error {
	mu := s.stripe(r)
	mu.Lock()
	defer mu.Unlock()
	if !s.acquire(r) {
		return nil
	}
	if _, err := s.store.Touch(ctx, []presence.SessionRef{r}); err != nil {
		s.drop(r)
		return err
	}
	return nil
}

// unhold drops a holder of r. When it was the last, the scheduler stops
// refreshing r and, if release is set, releases it in the store (the
// offline grace applies); otherwise the session lives out its TTL, which
// is what a drain wants. It reports whether the store was asked to
// release.
func (s *scheduler) unhold(ctx context.Context, r presence.SessionRef, release bool) (bool, error) {
	mu := s.stripe(r)
	mu.Lock()
	defer mu.Unlock()
	last, slot := s.drop(r)
	if !last || !release {
		return false, nil
	}
	// Wait out a touch that may have copied r before it was dropped.
	s.busy[slot].Lock()
	//lint:ignore SA2001 the lock is a barrier: the batch in flight ends first
	s.busy[slot].Unlock()
	return true, s.store.Release(ctx, r)
}

// held reports the number of sessions held.
func (s *scheduler) held() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.refs)
}

// run touches one slot per tick until ctx is done. Ticks are counted
// from the start, so a tick lost to a slow store is caught up on the next
// one rather than leaving its slot a whole period late.
func (s *scheduler) run(ctx context.Context) {
	n := int64(len(s.slots))
	tick := s.period / time.Duration(n)
	t := time.NewTicker(tick)
	defer t.Stop()
	start := time.Now()
	var done int64 // slot visits made
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		due := int64(time.Since(start) / tick)
		if due-done > n {
			done = due - n // a whole round behind: visit each slot once
		}
		for ; done < due && ctx.Err() == nil; done++ {
			s.touchSlot(ctx, int(done%n))
		}
	}
}

// touchSlot refreshes every session of slot i, in batches.
func (s *scheduler) touchSlot(ctx context.Context, i int) {
	s.busy[i].Lock()
	defer s.busy[i].Unlock()
	s.mu.Lock()
	refs := slices.Clone(s.slots[i])
	s.mu.Unlock()
	for len(refs) > 0 {
		b := refs[:min(len(refs), s.batch)]
		refs = refs[len(b):]
		tctx, cancel := context.WithTimeout(ctx, s.timeout)
		start := time.Now()
		_, err := s.store.Touch(tctx, b)
		cancel()
		s.observe(time.Since(start), len(b), err)
		if err != nil && ctx.Err() == nil {
			s.log.Warn("node: heartbeat touch failed; sessions expire after their TTL if this persists", "slot", i, "sessions", len(b), "err", err)
		}
	}
}

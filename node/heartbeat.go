package node

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/presence-dev/presence/presence"
)

// sessionKeeper owns the sessions held on this node: it claims and
// releases them in the store, writes their state, and keeps them alive
// with a heartbeat. Each session is in one of N slots, and slot i is
// refreshed in one batch every period, a period/N after slot i-1, so the
// load is spread over the period instead of arriving in one burst.
// Connection goroutines only hold, unhold and write state; the
// refreshes happen on the keeper's goroutine (run).
//
// A session is held once per connection that joined it (its owners); two
// connections with the same session id share it, and only the last one
// out releases it. Every join claims the session in the store, so a
// connection that comes back to this node takes the session back from
// another node that holds it now.
//
// Locks (see locksordering.txt): refLock of a session, then mu; mu is
// never held across a store call. A session's refLock is held across its
// own claim or release, so the store sees one session's claims and
// releases in the order this node decided them; no other session waits
// on it.
type sessionKeeper struct {
	store   Store
	period  time.Duration
	batch   int
	timeout time.Duration
	log     *slog.Logger
	observe func(d time.Duration, n int, err error) // one Refresh batch
	// moved is told the sessions another node has taken over, with the
	// owners that held them here; taken, the sessions a claim of this
	// node took from another.
	moved func(owners []owner)
	taken func(refs []presence.SessionRef)
	// batcher coalesces the claims of concurrent joins (claims.go).
	batcher *claimBatcher

	mu     sync.Mutex
	claims uint64 // successful claims so far; an entry's gen is its last one's number
	refs   map[presence.SessionRef]*heldSession
	slots  [][]presence.SessionRef
	rooms  map[string]*roomPlace
	locks  map[presence.SessionRef]*refLock
	// pending are releases that failed (the store was out of reach):
	// retried every tick until the store answers, and before any new
	// claim of the session, so a departure is never dropped and a late
	// release never ends a later claim.
	pending map[presence.SessionRef]struct{}
	// behind are slots whose last refresh failed: refreshed again at once
	// after the next refresh that succeeds.
	behind map[int]struct{}
	// suspects are sessions a refresh found taken from a live connection
	// here, or orphaned, waiting for confirmMove (see there).
	suspects    map[presence.SessionRef]suspect
	moveConfirm time.Duration
}

// suspect is a session found moved at since, while its last claim here was
// gen.
type suspect struct {
	since time.Time
	gen   uint64
}

// owner is a connection holding a session; the keeper tells it when
// another node has taken the session over.
type owner interface{ sessionMoved() }

// heldSession is the keeper's record of one session: where it is in the
// slots, the connections holding it, and its claims.
type heldSession struct {
	slot, idx int32 // position in slots; slot -1 until the first claim lands
	owners    []owner
	claiming  int32  // claims in flight
	gen       uint64 // s.claims at its last claim: a refresh's verdict is stale if a claim came after it was sent
}

// roomPlace is where a room's next session goes (see place) and how many
// of its sessions are placed.
type roomPlace struct{ slot, n int32 }

type refLock struct {
	mu sync.Mutex
	n  int // goroutines holding or waiting
}

func newSessionKeeper(store Store, period time.Duration, nslots, batch int, timeout time.Duration, log *slog.Logger, observe func(time.Duration, int, error)) *sessionKeeper {
	return &sessionKeeper{
		store: store, period: period, batch: batch, timeout: timeout, log: log, observe: observe,
		moved: func([]owner) {}, taken: func([]presence.SessionRef) {},
		batcher: &claimBatcher{store: store, timeout: timeout, max: batch},
		refs:    map[presence.SessionRef]*heldSession{},
		slots:   make([][]presence.SessionRef, nslots),
		rooms:   map[string]*roomPlace{},
		locks:   map[presence.SessionRef]*refLock{},
		pending: map[presence.SessionRef]struct{}{},
		behind:  map[int]struct{}{},
		// A connection's claim can reach the store after its client has
		// already left it for another node: the dead connection's node
		// then takes the session from the live one, and releases it a
		// moment later. So a move is confirmed after this long before the
		// live connection is closed.
		suspects:    map[presence.SessionRef]suspect{},
		moveConfirm: min(time.Second, period/2),
	}
}

// lockRef serializes the claims and releases of one session.
func (s *sessionKeeper) lockRef(r presence.SessionRef) (unlock func()) {
	s.mu.Lock()
	l := s.locks[r]
	if l == nil {
		l = &refLock{}
		s.locks[r] = l
	}
	l.n++
	s.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		s.mu.Lock()
		if l.n--; l.n == 0 {
			delete(s.locks, r)
		}
		s.mu.Unlock()
	}
}

// place puts a newly claimed session in the slot of its room's last
// placed session, unless that slot holds a batch more than the least
// loaded one; then (and for a room's first session) in the least loaded
// slot, which the room's next sessions follow. So a slot's sessions are
// few rooms, and a batch of them, sorted by room (touchSlot), is a few
// script calls: on a Redis Cluster the store makes one per Redis slot
// in a batch, so a batch spanning a thousand rooms costs Redis several
// times one spanning forty. Slots stay within a batch of each other:
// every slot comes round within a period whichever it is, and a burst of
// joins (a reconnect wave, a big room) does not pile into one slot.
// s.mu is held.
func (s *sessionKeeper) place(r presence.SessionRef, e *heldSession) {
	best := 0
	for i := range s.slots {
		if len(s.slots[i]) < len(s.slots[best]) {
			best = i
		}
	}
	rp := s.rooms[r.Room]
	if rp == nil {
		rp = &roomPlace{}
		s.rooms[r.Room] = rp
	} else if len(s.slots[rp.slot]) < len(s.slots[best])+s.batch {
		best = int(rp.slot)
	}
	rp.slot, rp.n = int32(best), rp.n+1
	e.slot, e.idx = int32(best), int32(len(s.slots[best]))
	s.slots[best] = append(s.slots[best], r)
}

// forget removes an entry and its slot position. s.mu is held.
func (s *sessionKeeper) forget(r presence.SessionRef, e *heldSession) {
	delete(s.refs, r)
	if e.slot < 0 {
		return
	}
	if rp := s.rooms[r.Room]; rp != nil {
		if rp.n--; rp.n <= 0 {
			delete(s.rooms, r.Room)
		}
	}
	sl := s.slots[e.slot]
	end := len(sl) - 1
	if int(e.idx) != end {
		moved := sl[end]
		sl[e.idx] = moved
		s.refs[moved].idx = e.idx
	}
	sl[end] = presence.SessionRef{}
	s.slots[e.slot] = sl[:end]
}

// hold claims r for o in the store and registers it for heartbeats. On
// error o does not hold r.
func (s *sessionKeeper) hold(ctx context.Context, r presence.SessionRef, o owner) error {
	unlock := s.lockRef(r)
	defer unlock()
	if err := s.retryRelease(ctx, r); err != nil {
		return err
	}
	s.mu.Lock()
	e := s.refs[r]
	if e == nil {
		e = &heldSession{slot: -1}
		s.refs[r] = e
	}
	e.claiming++
	s.mu.Unlock()

	res, err := s.batcher.claim(ctx, r)

	s.mu.Lock()
	e.claiming--
	if err == nil {
		e.owners = append(e.owners, o)
		s.claims++
		e.gen = s.claims
		if e.slot < 0 {
			s.place(r, e)
		}
	} else if len(e.owners) == 0 && e.claiming == 0 {
		s.forget(r, e)
	}
	s.mu.Unlock()
	if len(res.Taken) > 0 {
		s.taken(res.Taken)
	}
	return err
}

// revive refreshes r at once: a state write found it not live, so the
// store lost it while it was held here (out of reach for a TTL, or its
// data lost). A refresh brings it back as it was (silently after a data
// loss) and reports it lost if another node took it over meanwhile.
func (s *sessionKeeper) revive(ctx context.Context, r presence.SessionRef) error {
	if !s.holds(r) {
		return nil
	}
	return s.refresh(ctx, []presence.SessionRef{r})
}

// setState sets or (nil) clears r's state. A session that lapsed while
// held (the store was out of reach for a TTL, or lost its data) is
// brought back and written once more. An error wrapping presence.ErrMoved
// means another node holds the session now.
func (s *sessionKeeper) setState(ctx context.Context, r presence.SessionRef, state json.RawMessage) error {
	ok, err := s.store.SetState(ctx, r, state)
	switch {
	case err == nil && !ok:
		if err = s.revive(ctx, r); err == nil {
			_, err = s.store.SetState(ctx, r, state)
		}
	case errors.Is(err, presence.ErrMoved):
		// Moved, or taken by a connection that is already gone: wait for
		// the verdict as the heartbeat does.
		s.mu.Lock()
		e := s.refs[r]
		gen := uint64(0)
		if e != nil {
			gen = e.gen
		}
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return err
		case <-time.After(s.moveConfirm):
		}
		if kept, cerr := s.confirmMove(ctx, r, gen); cerr != nil {
			return cerr
		} else if kept {
			_, err = s.store.SetState(ctx, r, state)
		}
	}
	return err
}

// unhold drops o as an owner of r. When it was the last, the keeper
// stops refreshing r and, if release is set, releases it in the store
// (the offline grace applies); otherwise the session lives out its TTL,
// which is what a drain wants. It reports whether the store was asked to
// release.
func (s *sessionKeeper) unhold(ctx context.Context, r presence.SessionRef, o owner, release bool) (bool, error) {
	unlock := s.lockRef(r)
	defer unlock()
	s.mu.Lock()
	e := s.refs[r]
	i := -1
	if e != nil {
		i = slices.Index(e.owners, o)
	}
	if i < 0 {
		s.mu.Unlock()
		return false, nil
	}
	e.owners = slices.Delete(e.owners, i, i+1)
	last := len(e.owners) == 0
	if last {
		s.forget(r, e)
	}
	s.mu.Unlock()
	if !last || !release {
		return false, nil
	}
	// A refresh that copied r before it was dropped may still be under
	// way: the store's release leaves a tombstone that keeps it from
	// bringing r back, so the release need not wait for it.
	err := s.store.Release(ctx, r)
	if err != nil {
		s.mu.Lock()
		s.pending[r] = struct{}{}
		s.mu.Unlock()
	}
	return true, err
}

// retryRelease sends r's failed release again, if it has one. The
// session's refLock is held.
func (s *sessionKeeper) retryRelease(ctx context.Context, r presence.SessionRef) error {
	s.mu.Lock()
	_, ok := s.pending[r]
	s.mu.Unlock()
	if !ok {
		return nil
	}
	if err := s.store.Release(ctx, r); err != nil {
		return err
	}
	s.mu.Lock()
	delete(s.pending, r)
	s.mu.Unlock()
	return nil
}

// retryReleases retries every failed release, until one fails again.
func (s *sessionKeeper) retryReleases(ctx context.Context) {
	s.mu.Lock()
	refs := make([]presence.SessionRef, 0, len(s.pending))
	for r := range s.pending {
		refs = append(refs, r)
	}
	s.mu.Unlock()
	for _, r := range refs {
		unlock := s.lockRef(r)
		tctx, cancel := context.WithTimeout(ctx, s.timeout)
		err := s.retryRelease(tctx, r)
		cancel()
		unlock()
		if err != nil {
			return // the store is still out of reach
		}
	}
}

// pendingReleases reports the releases waiting to be retried.
func (s *sessionKeeper) pendingReleases() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pending)
}

// held reports the number of sessions held.
func (s *sessionKeeper) held() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.refs)
}

// holds reports whether r is held here.
func (s *sessionKeeper) holds(r presence.SessionRef) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.refs[r]
	return e != nil && len(e.owners) > 0
}

// run refreshes one slot per tick until ctx is done. Ticks are counted
// from the start, so a tick lost to a slow store is caught up on the next
// one rather than leaving its slot a whole period late.
func (s *sessionKeeper) run(ctx context.Context) {
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
		s.catchUp(ctx)
		if s.pendingReleases() > 0 {
			s.retryReleases(ctx)
		}
		s.confirmMoves(ctx)
	}
}

// catchUp refreshes at once the slots whose refresh failed, once the
// store answers again: after an outage every session is refreshed within
// a tick, not only in its slot's turn.
func (s *sessionKeeper) catchUp(ctx context.Context) {
	s.mu.Lock()
	var slots []int
	for i := range s.behind {
		slots = append(slots, i)
	}
	s.mu.Unlock()
	for _, i := range slots {
		if !s.touchSlot(ctx, i) {
			return
		}
	}
}

// touchSlot refreshes every session of slot i, in batches, and reports
// whether they all went through. A slot that failed is behind until one
// of its refreshes succeeds.
func (s *sessionKeeper) touchSlot(ctx context.Context, i int) bool {
	s.mu.Lock()
	refs := slices.Clone(s.slots[i])
	s.mu.Unlock()
	// By room: each batch is a run of whole rooms (see place).
	slices.SortFunc(refs, func(a, b presence.SessionRef) int { return strings.Compare(a.Room, b.Room) })
	ok := true
	for len(refs) > 0 {
		b := refs[:min(len(refs), s.batch)]
		refs = refs[len(b):]
		start := time.Now()
		err := s.refresh(ctx, b)
		s.observe(time.Since(start), len(b), err)
		if err != nil && ctx.Err() == nil {
			ok = false
			s.log.Warn("node: heartbeat refresh failed; sessions expire after their TTL if this persists", "slot", i, "sessions", len(b), "err", err)
		}
	}
	s.mu.Lock()
	if ok {
		delete(s.behind, i)
	} else {
		s.behind[i] = struct{}{}
	}
	s.mu.Unlock()
	return ok
}

// verify refreshes the given sessions if they are held here, at once: a
// node announced it took one over. Only what the store says counts.
func (s *sessionKeeper) verify(ctx context.Context, refs []presence.SessionRef) {
	refs = slices.DeleteFunc(slices.Clone(refs), func(r presence.SessionRef) bool { return !s.holds(r) })
	if len(refs) == 0 {
		return
	}
	if err := s.refresh(ctx, refs); err != nil && ctx.Err() == nil {
		s.log.Warn("node: takeover check failed", "sessions", len(refs), "err", err)
	}
}

// refresh refreshes refs and marks as suspects the held ones another node
// took over or that nobody holds now; confirmMove settles them. A verdict
// is stale, and ignored, when a claim of this node went out since the
// refresh was sent: that claim decides.
func (s *sessionKeeper) refresh(ctx context.Context, refs []presence.SessionRef) error {
	// One counter read instead of a map of the batch's entries: the
	// heartbeat's cost per session is what idle nodes spend their CPU on.
	s.mu.Lock()
	sent := s.claims
	s.mu.Unlock()
	tctx, cancel := context.WithTimeout(ctx, s.timeout)
	res, err := s.store.Refresh(tctx, refs)
	cancel()
	if len(res.Lost) == 0 && len(res.Orphaned) == 0 {
		return err
	}
	now := time.Now()
	s.mu.Lock()
	for _, r := range slices.Concat(res.Lost, res.Orphaned) {
		e := s.refs[r]
		if _, ok := s.suspects[r]; !ok && e != nil && len(e.owners) > 0 && e.claiming == 0 && e.gen <= sent {
			s.suspects[r] = suspect{since: now, gen: e.gen}
		}
	}
	s.mu.Unlock()
	return err
}

// confirmMoves settles the suspects found at least moveConfirm ago.
func (s *sessionKeeper) confirmMoves(ctx context.Context) {
	s.mu.Lock()
	var due []presence.SessionRef
	var gens []uint64
	for r, sp := range s.suspects {
		if time.Since(sp.since) >= s.moveConfirm {
			due, gens = append(due, r), append(gens, sp.gen)
		}
	}
	s.mu.Unlock()
	for i, r := range due {
		if _, err := s.confirmMove(ctx, r, gens[i]); err != nil && ctx.Err() == nil {
			s.log.Warn("node: checking a moved session failed; retried", "room", r.Room, "user", r.User, "err", err)
		}
	}
}

// confirmMove asks the store once more about a session found moved while
// its last claim here was gen, and acts on the answer: held by another
// node, its connections here are told (they close with 4001); held by no
// one (the taker's connection ended and released it), it is claimed back
// silently; still here, nothing. It reports whether the session is held
// here after it. A claim here since gen decides instead: nothing is done.
func (s *sessionKeeper) confirmMove(ctx context.Context, r presence.SessionRef, gen uint64) (bool, error) {
	unlock := s.lockRef(r)
	defer unlock()
	s.mu.Lock()
	delete(s.suspects, r)
	e := s.refs[r]
	live := e != nil && len(e.owners) > 0
	s.mu.Unlock()
	if !live {
		return false, nil
	}
	if e.gen != gen {
		return true, nil
	}
	retry := func(err error) (bool, error) {
		s.mu.Lock()
		if _, ok := s.suspects[r]; !ok {
			s.suspects[r] = suspect{since: time.Now(), gen: gen}
		}
		s.mu.Unlock()
		return true, err
	}
	tctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	res, err := s.store.Refresh(tctx, []presence.SessionRef{r})
	switch {
	case err != nil:
		return retry(err)
	case len(res.Lost) > 0:
		s.mu.Lock()
		owners := slices.Clone(e.owners)
		s.mu.Unlock()
		s.moved(owners)
		return false, nil
	case len(res.Orphaned) > 0:
		cres, err := s.store.Claim(tctx, []presence.SessionRef{r})
		if err != nil {
			return retry(err)
		}
		s.mu.Lock()
		s.claims++
		e.gen = s.claims
		s.mu.Unlock()
		if len(cres.Taken) > 0 {
			s.taken(cres.Taken)
		}
	}
	return true, nil
}

// suspectCount is how many sessions wait for confirmMove.
func (s *sessionKeeper) suspectCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.suspects)
}

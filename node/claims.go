package node

import (
	"context"
	"sync"
	"time"

	"github.com/presence-dev/presence/presence"
)

// claimBatcher coalesces the claims of concurrent joins into one store
// call: while a call is under way, the claims that arrive wait for the
// next, which takes them all (up to max). The store groups a call by room
// into one script each, so a storm of 1,000 joins into one room costs a
// few scripts, not 1,000 queued on its slot ahead of the joiners'
// snapshot reads. A lone join goes at once: nothing waits for company.
type claimBatcher struct {
	store   Store
	timeout time.Duration // bounds one store call, whoever waits on it
	max     int           // the store's batch size
	// observe, if set, learns each store call's time and error: the
	// store's pace, which the join limiter follows.
	observe func(time.Duration, error)

	mu      sync.Mutex
	queue   []*claimReq
	running bool
}

type claimReq struct {
	ctx  context.Context
	ref  presence.SessionRef
	done chan struct{}
	res  presence.TouchResult // the call's, Taken narrowed to ref
	err  error
}

// claim claims r in the next store call and returns its outcome: the
// call's error, and Taken holding r if the claim took it from another
// node. The call ends by the earliest deadline of the claims it carries,
// and the caller waits for it: an answer never comes before the claim
// was made or failed, so a claim the caller gave up on is never left
// behind in the store, held by no one.
func (b *claimBatcher) claim(ctx context.Context, r presence.SessionRef) (presence.TouchResult, error) {
	q := &claimReq{ctx: ctx, ref: r, done: make(chan struct{})}
	b.mu.Lock()
	b.queue = append(b.queue, q)
	start := !b.running
	b.running = true
	b.mu.Unlock()
	if start {
		// The call serves every claim queued, so no one caller's
		// cancellation ends it: only the timeout does.
		go b.run(context.WithoutCancel(ctx))
	}
	<-q.done
	return q.res, q.err
}

// run makes store calls until no claim waits.
func (b *claimBatcher) run(base context.Context) {
	for {
		b.mu.Lock()
		n := min(len(b.queue), b.max)
		if n == 0 {
			b.queue, b.running = nil, false
			b.mu.Unlock()
			return
		}
		queued := b.queue[:n:n]
		b.queue = b.queue[n:]
		b.mu.Unlock()

		// Claims whose caller is gone are not made; the call ends by the
		// earliest deadline of the rest.
		deadline := time.Now().Add(b.timeout)
		batch := queued[:0:0]
		var refs []presence.SessionRef
		for _, q := range queued {
			if err := q.ctx.Err(); err != nil {
				q.err = err
				close(q.done)
				continue
			}
			if d, ok := q.ctx.Deadline(); ok && d.Before(deadline) {
				deadline = d
			}
			batch = append(batch, q)
			refs = append(refs, q.ref)
		}
		if len(batch) == 0 {
			continue
		}
		ctx, cancel := context.WithDeadline(base, deadline)
		began := time.Now()
		res, err := b.store.Claim(ctx, refs)
		if b.observe != nil {
			b.observe(time.Since(began), err)
		}
		cancel()
		taken := make(map[presence.SessionRef]bool, len(res.Taken))
		for _, t := range res.Taken {
			taken[t] = true
		}
		for _, q := range batch {
			q.err = err
			if taken[q.ref] {
				q.res.Taken = []presence.SessionRef{q.ref}
			}
			close(q.done)
		}
	}
}

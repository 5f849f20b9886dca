package storm

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/presence-dev/presence/presence"
)

// Extender keeps the sessions of clients whose joins a node refused (a
// reconnect storm: JoinLimiter, MaxInflight) as they were while the
// clients wait to be admitted, whichever node held them: it collects
// their refs and sends them to Store.Extend in batches, every Every,
// coalescing the refusals of one session (a client retrying) into one
// extension per Again. The store pushes the session's existing entries
// and membership back a TTL; it never creates or claims one. A client
// that gives up is no longer refused, so no longer extended, and its
// session ends as it would have. The queue holds at most Max refs; past
// it refusals are not extended (counted as dropped).
type Extender struct {
	store   Extending
	cfg     ExtendConfig
	log     *slog.Logger
	Metrics *ExtendMetrics // optional

	mu    sync.Mutex
	queue map[presence.SessionRef]struct{}
	done  map[presence.SessionRef]time.Time // last sent, for Again
}

// Extending is what an Extender needs of the store; *region.Store has it.
type Extending interface {
	Extend(ctx context.Context, refs []presence.SessionRef) (int, error)
}

// ExtendConfig configures an Extender.
type ExtendConfig struct {
	Every   time.Duration // how often queued refs are sent
	Again   time.Duration // a session is sent at most once per Again
	Batch   int           // refs per store call (the store's MaxBatch at most)
	Max     int           // refs queued at most
	Timeout time.Duration // bounds one flush
}

// ExtendMetrics are the extender's collectors (any may be nil).
type ExtendMetrics struct {
	Sent, Extended, Dropped, Errors prometheus.Counter
}

// NewExtender returns an extender on store; run it with Run.
func NewExtender(store Extending, cfg ExtendConfig, log *slog.Logger) *Extender {
	return &Extender{store: store, cfg: cfg, log: log,
		queue: map[presence.SessionRef]struct{}{}, done: map[presence.SessionRef]time.Time{}}
}

// Add queues r for the next flush, unless it was sent within Again
// before now or the queue is full.
func (e *Extender) Add(now time.Time, r presence.SessionRef) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if t, ok := e.done[r]; ok && now.Sub(t) < e.cfg.Again {
		return
	}
	if _, ok := e.queue[r]; !ok && len(e.queue) >= e.cfg.Max {
		if m := e.Metrics; m != nil && m.Dropped != nil {
			m.Dropped.Inc()
		}
		return
	}
	e.queue[r] = struct{}{}
}

// Run flushes every Every until ctx is done.
func (e *Extender) Run(ctx context.Context) {
	t := time.NewTicker(e.cfg.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			e.Flush(ctx, now)
		}
	}
}

// Flush sends the queued refs, in batches, and forgets the sends older
// than Again. A batch that fails is not sent again as such: its clients
// are still retrying, and their next refusal queues them again.
func (e *Extender) Flush(ctx context.Context, now time.Time) {
	e.mu.Lock()
	refs := make([]presence.SessionRef, 0, len(e.queue))
	for r := range e.queue {
		refs = append(refs, r)
		e.done[r] = now // refusals meanwhile wait for Again
	}
	clear(e.queue)
	for r, t := range e.done {
		if now.Sub(t) >= e.cfg.Again {
			delete(e.done, r)
		}
	}
	e.mu.Unlock()
	if len(refs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	m := e.Metrics
	for len(refs) > 0 {
		b := refs[:min(len(refs), e.cfg.Batch)]
		refs = refs[len(b):]
		n, err := e.store.Extend(ctx, b)
		if m != nil && m.Sent != nil {
			m.Sent.Add(float64(len(b)))
		}
		if err != nil {
			// Their next refusal queues them again.
			e.mu.Lock()
			for _, r := range b {
				delete(e.done, r)
			}
			e.mu.Unlock()
			e.log.Warn("node: extending waiting sessions failed", "sessions", len(b), "err", err)
			if m != nil && m.Errors != nil {
				m.Errors.Inc()
			}
			continue
		}
		if m != nil && m.Extended != nil {
			m.Extended.Add(float64(n))
		}
	}
}

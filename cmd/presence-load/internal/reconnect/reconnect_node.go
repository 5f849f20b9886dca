package reconnect

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/presence-dev/presence/cmd/presence-load/internal/load"
	nodestorm "github.com/presence-dev/presence/internal/storm"
	"github.com/presence-dev/presence/node"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/region"
)

// standIn is what a node does with the joins of a reconnect storm (see
// reconnect.go): admit or refuse with the node's JoinLimiter, keep the
// refused clients' sessions with the node's Extender, claim the admitted
// in coalesced store calls (as node/claims.go does: one call at a time,
// taking every claim queued meanwhile), read their rooms' snapshots, and
// refresh what it holds every heartbeat in slots.
type standIn struct {
	r        *reconnectRun
	store    *region.Store
	lim      *nodestorm.JoinLimiter  // nil: the code before the limiter
	appts    *nodestorm.Appointments // nil: --fair=false
	ext      *nodestorm.Extender     // nil: the code before the extender
	extended *countingExtend
	queue    chan *rclient  // admitted, waiting for their claim
	rooms    chan roomJoins // snapshot reads to make
	inflight atomic.Int64   // admitted joins not yet served their snapshot (the node's MaxInflight)

	mu    sync.Mutex
	slots [][]*rclient // held, by heartbeat slot
	next  int
}

// heartbeatSlots is the node's default HeartbeatSlots.
const heartbeatSlots = node.DefaultHeartbeatSlots

// countingExtend counts what the extender sends and the store extends.
type countingExtend struct {
	s              *region.Store
	sent, extended atomic.Int64
}

func (c *countingExtend) Extend(ctx context.Context, refs []presence.SessionRef) (int, error) {
	n, err := c.s.Extend(ctx, refs)
	c.sent.Add(int64(len(refs)))
	c.extended.Add(int64(n))
	return n, err
}

func (r *reconnectRun) startNodes(ctx context.Context) ([]*standIn, error) {
	o := r.o
	nodes := make([]*standIn, o.Nodes)
	for i := range nodes {
		s, err := r.store(fmt.Sprintf("node%d", i), true)
		if err != nil {
			return nil, err
		}
		s.Start() // its reaper, as presenced runs it
		r.closers = append(r.closers, s.Close)
		n := &standIn{r: r, store: s, queue: make(chan *rclient, o.Sessions), rooms: make(chan roomJoins, o.Sessions),
			slots: make([][]*rclient, heartbeatSlots)}
		t := s.Timing()
		if o.JoinRate > 0 {
			n.lim = nodestorm.NewJoinLimiter(nodestorm.JoinLimit{Rate: o.JoinRate, MinRate: cmpOr(o.JoinRateMin, min(node.DefaultJoinRateMin, o.JoinRate)),
				Latency: o.JoinLatency, MinRetry: 250 * time.Millisecond, MaxRetry: o.MaxRetry})
		}
		if o.Fair {
			n.appts = nodestorm.NewAppointments(200000, o.MaxRetry)
		}
		if o.Extend {
			n.extended = &countingExtend{s: s}
			n.ext = nodestorm.NewExtender(n.extended, nodestorm.ExtendConfig{Every: min(250*time.Millisecond, t.Heartbeat/4), Again: t.Heartbeat,
				Batch: o.Batch, Max: 200000, Timeout: 5 * time.Second}, slog.New(slog.DiscardHandler))
			go n.ext.Run(ctx)
		}
		go n.claimer(ctx)
		for range 8 {
			go n.reader(ctx)
		}
		go n.heartbeat(ctx, t.Heartbeat)
		nodes[i] = n
	}
	return nodes, nil
}

func cmpOr(v, d float64) float64 {
	if v != 0 {
		return v
	}
	return d
}

// arrive is one attempt of c's join at now.
func (n *standIn) arrive(c *rclient, now time.Time) {
	st := &n.r.stats
	if c.attempts.Add(1) > 1 {
		st.retried.Add(1)
	}
	if n.appts != nil {
		if left, early := n.appts.Early(c.ref, now); early {
			n.refuse(c, now, left)
			return
		}
	}
	if n.inflight.Load() >= int64(n.r.o.MaxInflight) {
		n.refuse(c, now, n.capacityHint(now))
		return
	}
	if n.lim != nil {
		if ok, hint := n.lim.Admit(now); !ok {
			n.refuse(c, now, hint)
			return
		}
	}
	n.inflight.Add(1)
	st.admitted.Add(1)
	c.admitted.Store(now.UnixNano())
	n.queue <- c
}

// capacityHint is the hint of a join refused at MaxInflight: the
// limiter's, or before it the admission's (about AdmitWait, jittered).
func (n *standIn) capacityHint(now time.Time) time.Duration {
	if n.lim != nil {
		return n.lim.Defer(now)
	}
	w := node.DefaultAdmitWait
	return w/2 + time.Duration(rand.Int64N(int64(w)))
}

// refuse answers unavailable with hint; the client comes back after it,
// with its own jitter, and its session is kept meanwhile.
func (n *standIn) refuse(c *rclient, now time.Time, hint time.Duration) {
	st := &n.r.stats
	st.refused.Add(1)
	st.hint(hint)
	if n.ext != nil {
		n.ext.Add(now, c.ref)
	}
	if n.appts != nil {
		n.appts.Set(c.ref, now, hint)
	}
	wait := load.Jitter(hint)
	if c.greedy {
		wait = n.r.o.GreedyEvery
	}
	time.AfterFunc(wait, func() { n.arrive(c, time.Now()) })
}

// claimer makes one claim call at a time for every join queued.
func (n *standIn) claimer(ctx context.Context) {
	st := &n.r.stats
	for {
		var batch []*rclient
		select {
		case <-ctx.Done():
			return
		case c := <-n.queue:
			batch = append(batch, c)
		}
	fill:
		for len(batch) < n.r.o.Batch {
			select {
			case c := <-n.queue:
				batch = append(batch, c)
			default:
				break fill
			}
		}
		refs := make([]presence.SessionRef, len(batch))
		for i, c := range batch {
			refs[i] = c.ref
		}
		start := time.Now()
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := n.store.Claim(cctx, refs)
		cancel()
		now := time.Now()
		st.claimCalls.Add(1)
		st.claimNanos.Add(int64(now.Sub(start)))
		if n.lim != nil { // the store's pace, as the node's claim batcher tells it
			n.lim.Observe(now, now.Sub(start), err)
		}
		if err != nil {
			st.claimErrs.Add(1)
			n.inflight.Add(-int64(len(batch)))
			for _, c := range batch {
				n.refuse(c, now, n.capacityHint(now))
			}
			continue
		}
		n.held(batch, now)
	}
}

// roomJoins are the joins of one room in a claim call: they share one
// snapshot read, as joiners of a room at once do in the node.
type roomJoins struct {
	room    string
	clients []*rclient
}

// held records an admitted batch as held (heartbeat slots) and queues the
// snapshot reads of its rooms.
func (n *standIn) held(batch []*rclient, now time.Time) {
	st := &n.r.stats
	byRoom := map[string][]*rclient{}
	var order []string
	n.mu.Lock()
	for _, c := range batch {
		c.held.Store(now.UnixNano())
		n.slots[n.next] = append(n.slots[n.next], c)
		n.next = (n.next + 1) % len(n.slots)
		if byRoom[c.ref.Room] == nil {
			order = append(order, c.ref.Room)
		}
		byRoom[c.ref.Room] = append(byRoom[c.ref.Room], c)
	}
	n.mu.Unlock()
	st.held.Add(int64(len(batch)))
	st.lastHeld.Store(now.UnixNano())
	for _, room := range order {
		n.rooms <- roomJoins{room: room, clients: byRoom[room]}
	}
}

// reader reads the joiners' snapshots; a join is served, and leaves the
// node's inflight, with its snapshot.
func (n *standIn) reader(ctx context.Context) {
	st := &n.r.stats
	for {
		select {
		case <-ctx.Done():
			return
		case j := <-n.rooms:
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, _ = n.store.Snapshot(rctx, j.room, 0, node.DefaultSnapshotMembers)
			cancel()
			now := time.Now()
			n.inflight.Add(-int64(len(j.clients)))
			st.served.Add(int64(len(j.clients)))
			st.lastServed.Store(now.UnixNano())
		}
	}
}

// heartbeat refreshes one slot of what it holds every heartbeat/slots.
func (n *standIn) heartbeat(ctx context.Context, period time.Duration) {
	st := &n.r.stats
	tick := period / heartbeatSlots
	t := time.NewTicker(tick)
	defer t.Stop()
	for k := 0; ; k = (k + 1) % heartbeatSlots {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n.mu.Lock()
		refs := make([]presence.SessionRef, len(n.slots[k]))
		for i, c := range n.slots[k] {
			refs[i] = c.ref
		}
		n.mu.Unlock()
		start := time.Now()
		for len(refs) > 0 {
			b := refs[:min(len(refs), n.r.o.Batch)]
			refs = refs[len(b):]
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, _ = n.store.Refresh(rctx, b)
			cancel()
			st.refreshed.Add(int64(len(b)))
		}
		d := time.Since(start)
		if d > tick {
			st.tickOver.Add(1)
		}
		for {
			m := st.tickMax.Load()
			if int64(d) <= m || st.tickMax.CompareAndSwap(m, int64(d)) {
				break
			}
		}
	}
}

package global

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/presence"
)

// payloadSlack is kept free of each publication for its envelope.
const payloadSlack = 1024

// publisherStartTimeout bounds finding (or creating) the lease bucket.
const publisherStartTimeout = 30 * time.Second

// RegionPublisher publishes one region's presence to the aggregators:
// once per cadence it reads the regional truth, and sends the difference
// from what it sent last (an empty delta when nothing changed: the
// region's liveness signal); every FullEvery cadences, when it becomes
// active, and when an aggregator asks, it sends a full snapshot instead.
//
// Run one in every node of the region: a lease in the region's KV bucket
// makes exactly one of them active. The others wait, holding nothing.
type RegionPublisher struct {
	cfg   PublisherConfig
	log   *slog.Logger
	stats PublisherStats

	mu        sync.Mutex
	active    bool
	gen, seq  uint64
	last      truth // what the aggregators hold, as far as we know
	fullDue   bool
	sinceFull int // cadences since the last full

	cancel context.CancelFunc
	wg     sync.WaitGroup
	subs   []*nats.Subscription
	lease  *lease
	once   sync.Once
}

// PublisherStats counts what a RegionPublisher did.
type PublisherStats struct {
	Deltas     atomic.Int64 // delta messages sent (empty ones included)
	Fulls      atomic.Int64 // full snapshots sent (not parts)
	Bytes      atomic.Int64 // publication bytes sent
	ReadErrors atomic.Int64 // cadences skipped because the truth could not be read
	SendErrors atomic.Int64
	Resyncs    atomic.Int64 // resync requests received
}

// NewRegionPublisher checks cfg and returns a publisher; Start runs it.
func NewRegionPublisher(cfg PublisherConfig) (*RegionPublisher, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &RegionPublisher{cfg: cfg, log: cfg.Logger.With("component", "global-publisher", "region", cfg.Region)}, nil
}

// Stats returns the live counters.
func (p *RegionPublisher) Stats() *PublisherStats { return &p.stats }

// Active reports whether this publisher holds the region's lease.
func (p *RegionPublisher) Active() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.active
}

// Start creates the lease bucket, listens for resync requests and runs
// the lease and cadence loops until ctx is done or Close is called.
func (p *RegionPublisher) Start(ctx context.Context) error {
	sctx, cancel := context.WithTimeout(ctx, publisherStartTimeout)
	defer cancel()
	kv, err := ensureLeaseBucket(sctx, p.cfg.JetStream, p.cfg.LeaseBucket, p.cfg.LeaseTTL, p.cfg.Placement, 1, p.cfg.Storage)
	if err != nil {
		return err
	}
	p.lease = newLease(p.cfg.JetStream, kv, p.cfg.LeaseBucket, "publisher", p.cfg.Instance, p.cfg.LeaseTTL)
	for _, subj := range []string{bus.SyncResyncSubject(p.cfg.Region), bus.SyncResyncAllSubject} {
		sub, err := p.cfg.NATS.Subscribe(subj, func(*nats.Msg) { p.requestFull() })
		if err != nil {
			p.unsubscribe()
			return fmt.Errorf("global: publisher: subscribe %s: %w", subj, err)
		}
		p.subs = append(p.subs, sub)
	}
	ctx, p.cancel = context.WithCancel(ctx)
	p.wg.Add(2)
	go p.leaseLoop(ctx)
	go p.cadenceLoop(ctx)
	return nil
}

// Close stops the publisher and gives the lease up, so another node of
// the region takes over at once. It waits for the loops to end.
func (p *RegionPublisher) Close() {
	p.once.Do(func() {
		p.unsubscribe()
		if p.cancel != nil {
			p.cancel()
		}
		p.wg.Wait()
	})
}

func (p *RegionPublisher) unsubscribe() {
	for _, s := range p.subs {
		_ = s.Unsubscribe()
	}
}

// requestFull honours a resync request at the next cadence; fulls are
// rate limited there.
func (p *RegionPublisher) requestFull() {
	p.stats.Resyncs.Add(1)
	p.mu.Lock()
	p.fullDue = true
	p.mu.Unlock()
}

func (p *RegionPublisher) leaseLoop(ctx context.Context) {
	defer p.wg.Done()
	t := time.NewTicker(p.lease.interval())
	defer t.Stop()
	for {
		held, gen := p.lease.tick(ctx)
		p.mu.Lock()
		switch {
		case held && (!p.active || gen != p.gen):
			// A new term: aggregators need a full from this generation.
			p.active, p.gen, p.seq, p.last, p.fullDue = true, gen, 0, truth{}, true
			p.log.Info("global: publisher active", "gen", gen)
		case !held && p.active:
			p.active = false
			p.log.Info("global: publisher lost its lease")
		}
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			p.mu.Lock()
			p.active = false
			p.mu.Unlock()
			p.lease.release(context.WithoutCancel(ctx))
			return
		case <-t.C:
		}
	}
}

func (p *RegionPublisher) cadenceLoop(ctx context.Context) {
	defer p.wg.Done()
	t := time.NewTicker(p.cfg.Cadence)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.cadence(ctx)
		}
	}
}

// cadence reads the truth and sends one publication, if active.
func (p *RegionPublisher) cadence(ctx context.Context) {
	p.mu.Lock()
	active, gen := p.active, p.gen
	p.mu.Unlock()
	if !active {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, p.cfg.ReadTimeout)
	view, err := readRegion(rctx, p.cfg.Source, p.cfg.PageSize)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return // closing
		}
		// Sending nothing is right: aggregators hold the region's last
		// state, and drop it if the truth stays unreadable.
		p.stats.ReadErrors.Add(1)
		p.log.Warn("global: cannot read the regional truth; skipping a cadence", "err", err)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.active || p.gen != gen {
		return
	}
	// Requested fulls: at most one per ResyncInterval, counted in
	// cadences so timer jitter cannot push one a whole cadence late.
	resyncEvery := max(1, int((p.cfg.ResyncInterval+p.cfg.Cadence-1)/p.cfg.Cadence))
	full := p.last.Members == nil || p.sinceFull+1 >= p.cfg.FullEvery || (p.fullDue && p.sinceFull+1 >= resyncEvery)
	maxPayload := int(p.cfg.NATS.MaxPayload())
	if maxPayload <= 0 {
		maxPayload = 1 << 20 // not connected yet: the server default
	}
	budget := max(maxPayload-payloadSlack, 4096)
	var sendErr error
	if full {
		p.seq++
		parts := chunkOps(view.Ops(), budget)
		if len(parts) == 0 {
			parts = [][]roomOps{nil}
		}
		for i, ops := range parts {
			sendErr = errors.Join(sendErr, p.send(bus.SyncFullSubject(p.cfg.Region), publication{
				Kind: kindFull, Seq: p.seq, Part: i + 1, Parts: len(parts), Rooms: ops,
			}))
		}
		p.stats.Fulls.Add(1)
		p.fullDue, p.sinceFull = false, 0
	} else {
		chunks := chunkOps(view.Diff(p.last), budget)
		if len(chunks) == 0 {
			chunks = [][]roomOps{nil}
		}
		for _, ops := range chunks {
			p.seq++
			sendErr = errors.Join(sendErr, p.send(bus.SyncDeltaSubject(p.cfg.Region), publication{Kind: kindDelta, Seq: p.seq, Rooms: ops}))
			p.stats.Deltas.Add(1)
		}
		p.sinceFull++
	}
	p.last = view
	if sendErr != nil {
		// Aggregators see the gap and ask; send a full next time anyway.
		p.stats.SendErrors.Add(1)
		p.fullDue = true
		p.log.Warn("global: publication failed", "err", sendErr)
	}
}

// send fills in the envelope and publishes. p.mu is held.
func (p *RegionPublisher) send(subject string, pub publication) error {
	pub.V, pub.Region, pub.Gen, pub.Inst, pub.At = syncVersion, p.cfg.Region, p.gen, p.cfg.Instance, time.Now().UnixMilli()
	if pub.Rooms == nil {
		pub.Rooms = []roomOps{}
	}
	data, err := json.Marshal(pub)
	if err != nil {
		return err
	}
	p.stats.Bytes.Add(int64(len(data)))
	return p.cfg.NATS.Publish(subject, data)
}

// RosterSource is a RegionSource that also reads whole rooms in bulk;
// *region.Store is one. readRegion prefers it: one round trip per 100
// rooms instead of one per page of each room.
type RosterSource interface {
	RegionSource
	// Rosters returns every member of each room, in the order given.
	Rosters(ctx context.Context, rooms []string) ([]presence.Snapshot, error)
}

// readRegion reads a region's truth: every room's members with their
// live session ids and those sessions' states. Members inside the
// regional offline grace (no sessions) are present with an empty list.
// Rooms (and pages of one room, from a source that is not a
// RosterSource) are read at slightly different moments; the next cadence
// corrects any skew.
func readRegion(ctx context.Context, src RegionSource, pageSize int) (truth, error) {
	rooms, err := src.Rooms(ctx)
	if err != nil {
		return truth{}, fmt.Errorf("global: read region: rooms: %w", err)
	}
	rooms = slices.DeleteFunc(rooms, func(r string) bool { return presence.ValidateRoom(r) != nil })
	t := truth{Members: regionView{}, States: stateView{}}
	if rs, ok := src.(RosterSource); ok {
		snaps, err := rs.Rosters(ctx, rooms)
		if err != nil {
			return truth{}, fmt.Errorf("global: read region: %w", err)
		}
		for _, snap := range snaps {
			t.add(snap.Room, snap.Members)
		}
		return t, nil
	}
	for _, room := range rooms {
		for off := 0; ; {
			snap, err := src.Snapshot(ctx, room, off, pageSize)
			if err != nil {
				return truth{}, fmt.Errorf("global: read region: room %s: %w", room, err)
			}
			t.add(room, snap.Members)
			off += len(snap.Members)
			if len(snap.Members) == 0 || off >= snap.Total {
				break
			}
		}
	}
	return t, nil
}

// add records members of room.
func (t truth) add(room string, members []presence.Member) {
	for _, m := range members {
		ss := make([]string, 0, len(m.Sessions))
		for _, s := range m.Sessions {
			ss = append(ss, s.ID)
			if len(s.State) > 0 {
				if t.States[room] == nil {
					t.States[room] = map[string]map[string]string{}
				}
				if t.States[room][m.User] == nil {
					t.States[room][m.User] = map[string]string{}
				}
				t.States[room][m.User][s.ID] = string(s.State)
			}
		}
		sort.Strings(ss)
		if t.Members[room] == nil {
			t.Members[room] = map[string][]string{}
		}
		t.Members[room][m.User] = ss
	}
}

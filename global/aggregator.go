package global

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/presence-dev/presence/bus"
)

// Internal bounds.
const (
	syncQueue    = 8192 // region publications waiting for the engine
	roundWindow  = 1000 // stream writes in flight at once
	purgeQueue   = 4096
	purgeRetries = 3
	reloadPause  = time.Second // between failed reloads
	// startTimeout bounds one attempt to reach JetStream while starting;
	// the attempts go on until they succeed or Start's context is done.
	startTimeout = 5 * time.Second
	maxBackoff   = 5 * time.Second
	loadTimeout  = 30 * time.Second // one full read of the global stream
	infoEvery    = 16               // reads between checks that the stream was not reset
	readBatches  = 100              // direct get requests per read of new messages
)

// Aggregator unions the regions' publications into the global view and
// announces its transitions. Any number may run: a lease elects one to
// write; the others follow the stream and the regions, ready to take
// over, and all of them answer queries.
//
// The stream is the announced view. The writer appends each transition
// with Nats-Expected-Last-Sequence set to the stream's last sequence as
// it knows it, so a write lands only if nothing else was written since
// the view it decided on; any rejection makes it re-read the stream
// before deciding again. Two writers can therefore never both announce
// the same change, and a new writer announces only what differs from
// what the stream already says.
//
// One goroutine, the engine, owns the decisions. It never waits on the
// network: reads of the stream, write rounds and re-reads run beside it
// and hand their results back, so publications and ticks are handled
// whatever the stream's servers do.
type Aggregator struct {
	cfg   AggregatorConfig
	log   *slog.Logger
	stats AggregatorStats

	mu sync.RWMutex // guards c; the engine writes, queries read
	c  *core

	stream jetstream.Stream
	prefix string // JetStream API prefix
	lease  *lease
	leader atomic.Bool

	// Engine only.
	chainOK     bool   // next is the stream's last sequence as we wrote it
	next        uint64 // expected last sequence of the next write
	lastReload  time.Time
	loading     bool     // a re-read of the stream is under way
	viewGen     uint64   // counts installed re-reads; older reads are stale
	round       []write  // the write round under way, if any
	pending     touchSet // touched while a round was under way
	reading     bool     // a read of the stream's new messages is under way
	reads       int
	readWaiters []chan error // queries the read under way will answer
	nextWaiters []chan error // queries waiting for the next read

	syncCh    chan *nats.Msg
	readCh    chan readResult
	loadCh    chan loadResult
	roundCh   chan error
	currentCh chan chan error
	leaseCh   chan struct{}
	purgeCh   chan purgeReq

	subs    []*nats.Subscription
	svc     micro.Service
	cancel  context.CancelFunc
	stopped chan struct{} // closed when the engine ends
	wg      sync.WaitGroup
	once    sync.Once
}

// AggregatorStats counts what an Aggregator did.
type AggregatorStats struct {
	Publications atomic.Int64 // region publications applied (a full counts once)
	Malformed    atomic.Int64 // publications or stream messages dropped as malformed
	Gaps         atomic.Int64 // a region's publications arrived out of sequence
	// DigestMismatches counts deltas whose digest differed from this
	// aggregator's copy of the region once applied (a full was asked for).
	DigestMismatches atomic.Int64
	ResyncRequests   atomic.Int64 // full snapshots asked for
	Transitions      atomic.Int64 // global transitions this aggregator stored
	Conflicts        atomic.Int64 // write rounds the stream rejected (another writer, lost ack)
	Reloads          atomic.Int64 // announced view re-read from the stream
	Purges           atomic.Int64 // superseded online messages removed
	PurgeErrors      atomic.Int64
	UnknownRegions   atomic.Int64 // publications of regions not in Regions, dropped
	Contenders       atomic.Int64 // publications of another publisher while a region's current one speaks, dropped
	DroppedFulls     atomic.Int64 // fulls dropped before they completed: a lost part, too large, too slow
	OversizeFulls    atomic.Int64 // of which over MaxFullBytes
	Stalls           atomic.Int64 // ticks more than a cadence apart: the aggregator itself stalled
	StartRetries     atomic.Int64 // failed attempts to reach JetStream while starting
	ReadErrors       atomic.Int64 // failed reads of the global stream (follow, reload)
}

// NewAggregator checks cfg and returns an aggregator; Start runs it.
func NewAggregator(cfg AggregatorConfig) (*Aggregator, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	a := &Aggregator{
		cfg: cfg, log: cfg.Logger.With("component", "global-aggregator", "instance", cfg.Instance),
		syncCh:    make(chan *nats.Msg, syncQueue),
		readCh:    make(chan readResult),
		loadCh:    make(chan loadResult),
		roundCh:   make(chan error),
		currentCh: make(chan chan error),
		leaseCh:   make(chan struct{}, 1),
		purgeCh:   make(chan purgeReq, purgeQueue),
		stopped:   make(chan struct{}),
	}
	a.c = newCore(cfg, time.Now(), &a.stats)
	return a, nil
}

// Stats returns the live counters.
func (a *Aggregator) Stats() *AggregatorStats { return &a.stats }

// Leader reports whether this aggregator holds the lease and writes.
func (a *Aggregator) Leader() bool { return a.leader.Load() }

// StreamConfig returns the configuration of the global stream: writers
// publish on presence-sync.global.<room>.<kind>.<user>; the stream stores
// each as presence.global.<room>.<kind>.<user> and, once stored,
// republishes it there. Only the last message of each subject is kept,
// and offline messages expire after OfflineRetention, so the stream holds
// the current view, not its history.
func (a *Aggregator) StreamConfig() jetstream.StreamConfig {
	glob := bus.Root + "." + bus.GlobalRegion + ".>"
	return jetstream.StreamConfig{
		Name:              StreamName,
		Description:       "presence: the announced cross-region view",
		Subjects:          []string{bus.GlobalIngestRoot + ".>"},
		SubjectTransform:  &jetstream.SubjectTransformConfig{Source: bus.GlobalIngestRoot + ".>", Destination: glob},
		RePublish:         &jetstream.RePublish{Source: glob, Destination: glob},
		Retention:         jetstream.LimitsPolicy,
		Discard:           jetstream.DiscardOld,
		MaxMsgsPerSubject: 1,
		AllowMsgTTL:       true,
		Storage:           a.cfg.Storage,
		Replicas:          a.cfg.Replicas,
		Placement:         a.cfg.Placement,
		Duplicates:        bus.DuplicateWindow,
		AllowDirect:       true,
	}
}

// Start reaches JetStream (the global stream and the lease bucket,
// created if missing), reads the announced view, subscribes to the
// regions' publications, asks every region for a full snapshot and
// starts the query service (presence-api.global.*, and the disconnect
// endpoint presence-ctl.global.disconnect) and the engine. It
// runs until ctx is done or Close is called.
//
// JetStream may not answer yet: the stream's cluster is cut off, or
// another aggregator created the stream a moment ago. Start then retries,
// logging why, until it succeeds or ctx is done; only an error the
// server gives for the request itself (a configuration it refuses) ends
// it at once.
func (a *Aggregator) Start(ctx context.Context) error {
	a.prefix = apiPrefix(a.cfg.JetStream)
	if err := a.retry(ctx, "reach the global stream and lease bucket", a.ensureJetStream); err != nil {
		return err
	}
	nc := a.cfg.NATS
	for _, subj := range []string{bus.SyncDeltaSubject("*"), bus.SyncFullSubject("*")} {
		sub, err := nc.ChanSubscribe(subj, a.syncCh)
		if err != nil {
			a.unsubscribe()
			return fmt.Errorf("global: aggregator: subscribe %s: %w", subj, err)
		}
		a.subs = append(a.subs, sub)
	}
	var (
		ann     *announced
		through uint64
	)
	err := a.retry(ctx, "read the global stream", func(ctx context.Context) error {
		if err := nc.FlushWithContext(ctx); err != nil {
			return fmt.Errorf("global: aggregator: flush: %w", err)
		}
		var err error
		ann, through, _, err = a.load(ctx)
		return err
	})
	if err != nil {
		a.unsubscribe()
		return err
	}
	_ = nc.Publish(bus.SyncResyncAllSubject, a.resyncBody())
	a.mu.Lock()
	a.c.ann = ann
	a.mu.Unlock()
	a.next = through

	ctx, a.cancel = context.WithCancel(ctx)
	if a.svc, err = bus.StartService(nc, bus.GlobalRegion, a, bus.WithLogger(a.log), bus.WithDisconnect(a)); err != nil {
		a.cancel()
		a.unsubscribe()
		return err
	}
	a.wg.Add(3)
	go a.engine(ctx)
	go a.leaseLoop(ctx)
	go a.purger(ctx)
	return nil
}

// retry calls f until it succeeds, returns a permanent error or ctx is
// done, waiting longer after each failure (up to maxBackoff).
func (a *Aggregator) retry(ctx context.Context, what string, f func(context.Context) error) error {
	wait := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, startTimeout)
		err := f(actx)
		cancel()
		if err == nil {
			if attempt > 1 {
				a.log.Info("global: aggregator: JetStream answers", "what", what, "attempts", attempt)
			}
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("global: aggregator: %s: %w (last error: %v)", what, ctx.Err(), err)
		}
		if permanent(err) {
			return err
		}
		a.stats.StartRetries.Add(1)
		a.log.Warn("global: aggregator: JetStream does not answer yet; retrying", "what", what, "attempt", attempt, "retry_in", wait, "err", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("global: aggregator: %s: %w (last error: %v)", what, ctx.Err(), err)
		case <-time.After(wait):
		}
		wait = min(2*wait, maxBackoff)
	}
}

// permanent reports whether err is the server's refusal of the request
// itself, which asking again cannot change. "No suitable peers" is not:
// the peers of a cluster that is cut off come back.
func permanent(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.Code == 400 && apiErr.ErrorCode != errCodeNoPeers
}

// errCodeNoPeers is JetStream's "no suitable peers for placement".
const errCodeNoPeers jetstream.ErrorCode = 10005

// ensureJetStream finds (or creates) the global stream and the lease
// bucket. A stream that exists with this configuration is only looked
// up: a lookup is answered by the stream's servers, while a create or an
// update needs the JetStream meta leader, which a partition of a
// two-cluster supercluster leaves on neither side.
func (a *Aggregator) ensureJetStream(ctx context.Context) error {
	js, want := a.cfg.JetStream, a.StreamConfig()
	st, err := js.Stream(ctx, StreamName)
	switch {
	case err == nil && sameStream(st.CachedInfo().Config, want):
	case err == nil:
		st, err = js.UpdateStream(ctx, want)
	case errors.Is(err, jetstream.ErrStreamNotFound):
		st, err = js.CreateStream(ctx, want)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			err = errors.New("created meanwhile by another aggregator") // look it up again
		}
	}
	if err != nil {
		return fmt.Errorf("global: aggregator: stream %s: %w", StreamName, err)
	}
	kv, err := ensureLeaseBucket(ctx, js, a.cfg.LeaseBucket, a.cfg.LeaseTTL, a.cfg.Placement, a.cfg.Replicas, a.cfg.Storage)
	if err != nil {
		return err
	}
	a.stream = st
	a.lease = newLease(js, kv, a.cfg.LeaseBucket, "aggregator", a.cfg.Instance, a.cfg.LeaseTTL)
	return nil
}

// sameStream reports whether an existing stream has every setting
// StreamConfig sets (the server fills in the others).
func sameStream(got, want jetstream.StreamConfig) bool {
	placement := func(p *jetstream.Placement) jetstream.Placement {
		if p == nil {
			return jetstream.Placement{}
		}
		return *p
	}
	gp, wp := placement(got.Placement), placement(want.Placement)
	return slices.Equal(got.Subjects, want.Subjects) &&
		reflect.DeepEqual(got.SubjectTransform, want.SubjectTransform) &&
		reflect.DeepEqual(got.RePublish, want.RePublish) &&
		got.Description == want.Description && got.Retention == want.Retention && got.Discard == want.Discard &&
		got.MaxMsgsPerSubject == want.MaxMsgsPerSubject && got.AllowMsgTTL == want.AllowMsgTTL &&
		got.Storage == want.Storage && got.Replicas == want.Replicas && got.Duplicates == want.Duplicates &&
		got.AllowDirect == want.AllowDirect && gp.Cluster == wp.Cluster && slices.Equal(gp.Tags, wp.Tags)
}

// Close stops the aggregator and gives the lease up, so a standby takes
// over at its next lease tick. It waits for every goroutine to end.
func (a *Aggregator) Close() {
	a.once.Do(func() {
		if a.svc != nil {
			_ = a.svc.Stop()
		}
		a.unsubscribe()
		if a.cancel != nil {
			a.cancel()
		}
		a.wg.Wait()
	})
}

func (a *Aggregator) unsubscribe() {
	for _, s := range a.subs {
		_ = s.Unsubscribe()
	}
}

func (a *Aggregator) leaseLoop(ctx context.Context) {
	defer a.wg.Done()
	t := time.NewTicker(a.lease.interval())
	defer t.Stop()
	for {
		held, _ := a.lease.tick(ctx)
		if a.leader.Swap(held) != held {
			a.log.Info("global: aggregator leadership changed", "leader", held)
			select {
			case a.leaseCh <- struct{}{}:
			default:
			}
		}
		select {
		case <-ctx.Done():
			a.leader.Store(false)
			a.lease.release(context.WithoutCancel(ctx))
			return
		case <-t.C:
		}
	}
}

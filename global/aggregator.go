package global

import (
	"context"
	"encoding/json"
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
	"github.com/presence-dev/presence/presence"
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
	Publications   atomic.Int64 // region publications applied (a full counts once)
	Malformed      atomic.Int64 // publications or stream messages dropped as malformed
	Gaps           atomic.Int64 // a region's publications arrived out of sequence
	ResyncRequests atomic.Int64 // full snapshots asked for
	Transitions    atomic.Int64 // global transitions this aggregator stored
	Conflicts      atomic.Int64 // write rounds the stream rejected (another writer, lost ack)
	Reloads        atomic.Int64 // announced view re-read from the stream
	Purges         atomic.Int64 // superseded online messages removed
	PurgeErrors    atomic.Int64
	UnknownRegions atomic.Int64 // publications of regions not in Regions, dropped
	Contenders     atomic.Int64 // publications of another publisher while a region's current one speaks, dropped
	DroppedFulls   atomic.Int64 // fulls dropped before they completed: a lost part, too large, too slow
	OversizeFulls  atomic.Int64 // of which over MaxFullBytes
	Stalls         atomic.Int64 // ticks more than a cadence apart: the aggregator itself stalled
	StartRetries   atomic.Int64 // failed attempts to reach JetStream while starting
	ReadErrors     atomic.Int64 // failed reads of the global stream (follow, reload)
}

type purgeReq struct {
	subject string
	below   uint64
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
// starts the query service (presence-api.global.*) and the engine. It
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
	if a.svc, err = bus.StartService(nc, bus.GlobalRegion, a, bus.WithLogger(a.log)); err != nil {
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

// engine owns the decisions: every input is applied, the touched users
// evaluated and, on the leader, the resulting transitions written. The
// network work it starts (reads, re-reads, write rounds) runs in its own
// goroutines and comes back as an input.
func (a *Aggregator) engine(ctx context.Context) {
	defer a.wg.Done()
	defer close(a.stopped)
	t := time.NewTicker(max(a.cfg.Cadence/4, 10*time.Millisecond))
	defer t.Stop()
	prune := time.NewTicker(time.Minute)
	defer prune.Stop()
	for {
		var touched touchSet
		select {
		case <-ctx.Done():
			a.answer(append(a.readWaiters, a.nextWaiters...), errClosed)
			return
		case m := <-a.syncCh:
			touched = a.onPublication(m)
		case res := <-a.readCh:
			touched = a.onRead(ctx, res)
		case res := <-a.loadCh:
			touched = a.onLoad(ctx, res)
		case err := <-a.roundCh:
			touched = a.onRound(ctx, err)
		case w := <-a.currentCh:
			a.nextWaiters = append(a.nextWaiters, w)
			a.startRead(ctx)
		case <-a.leaseCh:
			a.chainOK = false
			if a.leader.Load() {
				a.startReload(ctx)
			}
		case <-t.C:
			a.mu.Lock()
			touched = a.c.tick(time.Now())
			a.mu.Unlock()
			if a.leader.Load() && !a.chainOK && time.Since(a.lastReload) >= reloadPause {
				a.startReload(ctx) // an earlier one failed
			}
			a.startRead(ctx)
		case <-prune.C:
			a.mu.Lock()
			a.c.ann.prune(time.Now(), func(room string) bool { return a.c.dec[room] != nil })
			a.mu.Unlock()
		}
		a.settle(ctx, touched)
	}
}

func (a *Aggregator) onPublication(m *nats.Msg) touchSet {
	p, err := DecodePublication(m.Subject, m.Data)
	if err != nil {
		a.stats.Malformed.Add(1)
		a.log.Debug("global: dropping a malformed publication", "subject", m.Subject, "err", err)
		return nil
	}
	oversize := a.stats.OversizeFulls.Load()
	a.mu.Lock()
	touched, ask := a.c.publication(p, time.Now())
	a.mu.Unlock()
	if a.stats.OversizeFulls.Load() != oversize {
		a.log.Error("global: dropped a full snapshot larger than MaxFullBytes; the region cannot sync until it is raised",
			"region", p.Region, "gen", p.Gen, "seq", p.Seq, "max_full_bytes", a.cfg.MaxFullBytes)
	}
	if ask {
		_ = a.cfg.NATS.Publish(bus.SyncResyncSubject(p.Region), a.resyncBody())
	}
	return touched
}

// resyncBody is the body of a resync request: who asks (informational).
func (a *Aggregator) resyncBody() []byte {
	b, _ := json.Marshal(struct {
		From string `json:"from"`
	}{a.cfg.Instance})
	return b
}

// errClosed answers the queries still waiting when the aggregator stops.
var errClosed = errors.New("global: aggregator closed")

// current returns once the announced view holds everything the global
// stream held when it was called, or why it cannot: the stream does not
// answer (this aggregator is cut off from it) or ctx is done. Queries
// call it first, so an answer is never older than a transition the
// asker may already have received; an aggregator that cannot vouch for
// its view refuses to answer, and the asker falls back.
func (a *Aggregator) current(ctx context.Context) error {
	if a.cancel == nil {
		return errors.New("global: aggregator not started")
	}
	done := make(chan error, 1)
	select {
	case a.currentCh <- done:
	case <-a.stopped:
		return errClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (a *Aggregator) answer(ws []chan error, err error) {
	for _, w := range ws {
		w <- err // buffered, read at most once
	}
}

// readResult is what one read of the stream's new messages found.
type readResult struct {
	gen   uint64 // viewGen when it started
	msgs  []storedMsg
	more  bool // it stopped before the stream's end: a busy stream
	reset bool // the stream ends before where the read started: it was recreated
	err   error
}

// startRead reads the stream's messages after the announced view, unless
// a read or a re-read is under way. Every tick starts one, so a standby
// follows the leader's writes and the leader sees any other writer's;
// queries waiting on current are answered by the first read that starts
// after they asked.
func (a *Aggregator) startRead(ctx context.Context) {
	if a.reading || a.loading {
		return
	}
	a.reading = true
	a.readWaiters, a.nextWaiters = a.nextWaiters, nil
	from, gen := a.c.ann.through+1, a.viewGen
	a.reads++
	checkInfo := a.reads%infoEvery == 0
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		rctx, cancel := context.WithTimeout(ctx, a.cfg.AckTimeout)
		defer cancel()
		res := readResult{gen: gen}
		_, res.more, res.err = readStream(rctx, a.cfg.NATS, a.prefix, StreamName, bus.RegionFilter(bus.GlobalRegion), from, readBatches,
			func(m storedMsg) { res.msgs = append(res.msgs, m) })
		if res.err == nil && checkInfo && len(res.msgs) == 0 {
			info, err := a.stream.Info(rctx)
			res.err = err
			res.reset = err == nil && info.State.LastSeq+1 < from
		}
		select {
		case a.readCh <- res:
		case <-ctx.Done():
		}
	}()
}

// onRead folds what a read found into the announced view.
func (a *Aggregator) onRead(ctx context.Context, res readResult) touchSet {
	a.reading = false
	waiters := a.readWaiters
	a.readWaiters = nil
	if res.gen != a.viewGen {
		// A re-read was installed meanwhile: read again after it.
		a.nextWaiters = append(waiters, a.nextWaiters...)
		a.startRead(ctx)
		return nil
	}
	if res.err != nil {
		a.stats.ReadErrors.Add(1)
		a.log.Debug("global: cannot read the global stream", "err", res.err)
		a.answer(waiters, fmt.Errorf("global: the global stream does not answer: %w", res.err))
		return nil
	}
	if res.reset {
		a.log.Warn("global: the global stream was recreated; re-reading it")
		a.nextWaiters = append(waiters, a.nextWaiters...)
		a.chainOK = false
		a.startReload(ctx)
		return nil
	}
	touched := touchSet{}
	a.mu.Lock()
	for _, m := range res.msgs {
		if m.seq <= a.c.ann.through {
			continue // our own write, already folded
		}
		t, ok := decodeGlobal(m.subject, m.data)
		if !ok {
			a.stats.Malformed.Add(1)
			a.c.ann.skip(m.seq)
			a.chainOK = false // our next write would be rejected
			continue
		}
		a.c.ann.apply(t, m.seq, m.at)
		// Another writer moved the stream: our next write would be
		// rejected.
		a.chainOK = false
		touched.add(t.Room, t.User)
	}
	a.mu.Unlock()
	if res.more {
		// Not at the stream's end yet: the waiters wait for the rest.
		a.nextWaiters = append(waiters, a.nextWaiters...)
	} else {
		a.answer(waiters, nil)
	}
	if len(a.nextWaiters) > 0 || res.more {
		a.startRead(ctx)
	}
	return touched
}

// decodeGlobal decodes a message of the global stream.
func decodeGlobal(subject string, data []byte) (presence.Transition, bool) {
	t, err := bus.DecodeEvent(data)
	if err != nil || t.Region != bus.GlobalRegion || bus.EventSubject(t) != subject {
		return presence.Transition{}, false
	}
	return t, true
}

// loadResult is a re-read of the whole stream.
type loadResult struct {
	ann     *announced
	through uint64
	stale   []purgeReq
	err     error
}

// startReload re-reads the announced view from the stream, unless a
// re-read or a write round is under way (the round's end starts one if
// still needed).
func (a *Aggregator) startReload(ctx context.Context) {
	if a.loading || a.round != nil {
		return
	}
	a.loading, a.lastReload = true, time.Now()
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		var res loadResult
		res.ann, res.through, res.stale, res.err = a.load(ctx)
		select {
		case a.loadCh <- res:
		case <-ctx.Done():
		}
	}()
}

// onLoad installs a re-read view and restarts the write chain on it. It
// returns everyone, to evaluate against the new view.
func (a *Aggregator) onLoad(ctx context.Context, res loadResult) touchSet {
	a.loading = false
	if res.err != nil {
		a.stats.ReadErrors.Add(1)
		a.log.Warn("global: cannot read the global stream", "err", res.err)
		a.answer(a.nextWaiters, fmt.Errorf("global: the global stream does not answer: %w", res.err))
		a.nextWaiters = nil
		return nil
	}
	a.stats.Reloads.Add(1)
	a.viewGen++
	a.next, a.chainOK = res.through, a.leader.Load()
	a.mu.Lock()
	a.c.ann = res.ann
	for _, p := range res.stale {
		a.queuePurge(p)
	}
	touched := a.c.everyone()
	a.mu.Unlock()
	if len(a.nextWaiters) > 0 {
		a.startRead(ctx)
	}
	return touched
}

// load reads the stream's messages, in stream order, into a new announced
// view (the stream keeps one message per subject, so that is each
// subject's last). It returns the view, the stream sequence it is
// complete through, and the online messages that a later offline of the
// same user superseded (to purge). It uses no consumer: see direct.go.
func (a *Aggregator) load(ctx context.Context) (*announced, uint64, []purgeReq, error) {
	ctx, cancel := context.WithTimeout(ctx, loadTimeout)
	defer cancel()
	// The last sequence first: every message up to it that still exists
	// is then read, and messages stored meanwhile may be too.
	info, err := a.stream.Info(ctx)
	if err != nil {
		return nil, 0, nil, fmt.Errorf("global: load %s: %w", StreamName, err)
	}
	ann := newAnnounced()
	var stale []purgeReq
	now := time.Now()
	_, _, err = readStream(ctx, a.cfg.NATS, a.prefix, StreamName, bus.RegionFilter(bus.GlobalRegion), 1, 0, func(m storedMsg) {
		t, ok := decodeGlobal(m.subject, m.data)
		if !ok {
			a.stats.Malformed.Add(1)
			ann.skip(m.seq)
			return
		}
		if on := ann.apply(t, m.seq, m.at); on != 0 {
			stale = append(stale, purgeReq{onlineSubject(t.Room, t.User), m.seq})
		}
	})
	if err != nil {
		return nil, 0, nil, fmt.Errorf("global: load %s: %w", StreamName, err)
	}
	ann.skip(info.State.LastSeq)
	ann.settle(now, a.cfg.OfflineRetention)
	return ann, ann.through, stale, nil
}

func onlineSubject(room, user string) string {
	return bus.EventSubject(presence.Transition{Region: bus.GlobalRegion, Room: room, Kind: presence.Online, User: user})
}

// queuePurge asks the purger to remove a superseded online message.
func (a *Aggregator) queuePurge(p purgeReq) {
	select {
	case a.purgeCh <- p:
	default:
		a.stats.PurgeErrors.Add(1) // the next reload finds it again
	}
}

func (a *Aggregator) purger(ctx context.Context) {
	defer a.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case p := <-a.purgeCh:
			var err error
			for i := range purgeRetries {
				pctx, cancel := context.WithTimeout(ctx, a.cfg.AckTimeout)
				err = a.stream.Purge(pctx, jetstream.WithPurgeSubject(p.subject), jetstream.WithPurgeSequence(p.below))
				cancel()
				if err == nil || ctx.Err() != nil {
					break
				}
				time.Sleep(time.Duration(i+1) * 100 * time.Millisecond)
			}
			if err != nil {
				a.stats.PurgeErrors.Add(1)
			} else {
				a.stats.Purges.Add(1)
			}
		}
	}
}

// write is one transition of a round with the stream sequence it must
// get.
type write struct {
	t    presence.Transition
	msg  *nats.Msg
	seq  uint64
	prev uint64 // the online an offline supersedes, to purge once stored
}

// settle evaluates the touched users and, on the leader, starts a round
// writing the transitions they call for. While a round is under way the
// touched users wait for its end: their intents are decided on the view
// it leaves.
func (a *Aggregator) settle(ctx context.Context, touched touchSet) {
	if len(touched) == 0 {
		return
	}
	if a.round != nil {
		if a.pending == nil {
			a.pending = touchSet{}
		}
		for room, users := range touched {
			for u := range users {
				a.pending.add(room, u)
			}
		}
		return
	}
	a.mu.Lock()
	now := time.Now()
	// A standby evaluates too: its timers stay the leader's. Its intents,
	// and a leader's while its chain is broken, are dropped: the re-read
	// that any new leader or broken chain starts evaluates everyone.
	intents := a.c.evaluate(touched, now)
	if !a.leader.Load() || !a.chainOK || len(intents) == 0 {
		a.mu.Unlock()
		return
	}
	round := a.prepare(intents, now)
	a.mu.Unlock()
	if len(round) == 0 {
		return
	}
	a.round = round
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		err := a.send(ctx, round)
		select {
		case a.roundCh <- err:
		case <-ctx.Done():
		}
	}()
}

// onRound ends a write round: stored, its offlines are forgotten and the
// onlines they supersede purged; rejected, the stream is re-read. It
// returns the users touched while the round was under way.
func (a *Aggregator) onRound(ctx context.Context, err error) touchSet {
	round := a.round
	a.round = nil
	if err == nil {
		a.stats.Transitions.Add(int64(len(round)))
		a.mu.Lock()
		for _, w := range round {
			if w.t.Kind == presence.Offline {
				// Kept until stored: a failed round decides again.
				a.c.forget(w.t.Room, w.t.User)
			}
			if w.prev != 0 {
				a.queuePurge(purgeReq{onlineSubject(w.t.Room, w.t.User), w.seq})
			}
		}
		a.mu.Unlock()
	} else if ctx.Err() == nil {
		a.stats.Conflicts.Add(1)
		a.log.Info("global: the stream rejected a round; re-reading it", "err", err)
		a.chainOK = false
	}
	if !a.chainOK && a.leader.Load() {
		a.startReload(ctx)
	}
	touched := a.pending
	a.pending = nil
	return touched
}

// prepare numbers the intents, folds them into the announced view as if
// stored (a failed round reloads the view) and builds their messages.
// a.mu is held.
func (a *Aggregator) prepare(intents []intent, now time.Time) []write {
	round := make([]write, 0, len(intents))
	for _, it := range intents {
		epoch, seq := a.c.ann.next(it.room, now)
		t := presence.Transition{
			ID: transitionID(it.room, epoch, seq), Region: bus.GlobalRegion, Room: it.room, User: it.user,
			Kind: it.kind, Reason: it.reason, Sessions: it.sessions, Seq: seq, Epoch: epoch, At: now,
			Session: it.session,
		}
		if it.state != "" {
			t.State = json.RawMessage(it.state)
		}
		data, err := bus.EncodeEvent(t)
		if err != nil {
			a.log.Error("global: cannot encode a transition", "err", err)
			continue
		}
		a.next++
		w := write{t: t, seq: a.next, msg: &nats.Msg{Subject: bus.GlobalIngestSubject(t), Data: data, Header: nats.Header{}}}
		w.prev = a.c.ann.apply(t, w.seq, now)
		round = append(round, w)
	}
	return round
}

// send writes a round in order, each message expecting the one before it
// as the stream's last, and waits for every ack (AckTimeout per window of
// roundWindow writes).
func (a *Aggregator) send(ctx context.Context, round []write) error {
	js := a.cfg.JetStream
	for start := 0; start < len(round); start += roundWindow {
		if err := a.sendWindow(ctx, js, round[start:min(start+roundWindow, len(round))]); err != nil {
			return err
		}
	}
	return nil
}

func (a *Aggregator) sendWindow(ctx context.Context, js jetstream.JetStream, ws []write) error {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.AckTimeout)
	defer cancel()
	futs := make([]jetstream.PubAckFuture, 0, len(ws))
	for _, w := range ws {
		opts := []jetstream.PublishOpt{
			jetstream.WithExpectLastSequence(w.seq - 1),
			jetstream.WithMsgID(w.t.ID),
			jetstream.WithExpectStream(StreamName),
		}
		if w.t.Kind != presence.Online {
			// Offlines and updates age out; an online stays while its
			// user is a member.
			opts = append(opts, jetstream.WithMsgTTL(a.cfg.OfflineRetention))
		}
		f, err := js.PublishMsgAsync(w.msg, opts...)
		if err != nil {
			return fmt.Errorf("write %s: %w", w.t.ID, err)
		}
		futs = append(futs, f)
	}
	for i, f := range futs {
		w := ws[i]
		select {
		case ack := <-f.Ok():
			if ack.Sequence != w.seq || ack.Duplicate {
				return fmt.Errorf("write %s: stored at %d (duplicate %v), expected %d", w.t.ID, ack.Sequence, ack.Duplicate, w.seq)
			}
		case err := <-f.Err():
			return fmt.Errorf("write %s: %w", w.t.ID, err)
		case <-ctx.Done():
			return fmt.Errorf("write %s: waiting for ack: %w", w.t.ID, ctx.Err())
		}
	}
	return nil
}

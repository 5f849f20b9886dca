package global

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
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
	followQueue  = 1024 // stream messages waiting for the engine
	roundWindow  = 1000 // stream writes in flight at once
	purgeQueue   = 4096
	purgeRetries = 3
	reloadPause  = time.Second // between failed reloads
	startTimeout = 30 * time.Second
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
type Aggregator struct {
	cfg   AggregatorConfig
	log   *slog.Logger
	stats AggregatorStats

	mu sync.RWMutex // guards c; the engine writes, queries read
	c  *core

	stream jetstream.Stream
	lease  *lease
	leader atomic.Bool

	// Engine only.
	chainOK    bool   // next is the stream's last sequence as we wrote it
	next       uint64 // expected last sequence of the next write
	lastReload time.Time

	syncCh   chan *nats.Msg
	followCh chan jetstream.Msg
	leaseCh  chan struct{}
	purgeCh  chan purgeReq

	subs     []*nats.Subscription
	follower jetstream.ConsumeContext
	svc      micro.Service
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	once     sync.Once
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
		syncCh:   make(chan *nats.Msg, syncQueue),
		followCh: make(chan jetstream.Msg, followQueue),
		leaseCh:  make(chan struct{}, 1),
		purgeCh:  make(chan purgeReq, purgeQueue),
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
		Subjects:          []string{ingestRoot + ".>"},
		SubjectTransform:  &jetstream.SubjectTransformConfig{Source: ingestRoot + ".>", Destination: glob},
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

// Start creates the stream and the lease bucket, reads the announced
// view, subscribes to the regions' publications, asks every region for a
// full snapshot and starts the query service (presence-api.global.*) and
// the engine. It runs until ctx is done or Close is called.
func (a *Aggregator) Start(ctx context.Context) error {
	sctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	js := a.cfg.JetStream
	st, err := js.CreateOrUpdateStream(sctx, a.StreamConfig())
	if err != nil {
		return fmt.Errorf("global: aggregator: stream %s: %w", StreamName, err)
	}
	a.stream = st
	kv, err := ensureLeaseBucket(sctx, js, a.cfg.LeaseBucket, a.cfg.LeaseTTL, a.cfg.Placement, a.cfg.Replicas, a.cfg.Storage)
	if err != nil {
		return err
	}
	a.lease = newLease(js, kv, a.cfg.LeaseBucket, "aggregator", a.cfg.Instance, a.cfg.LeaseTTL)

	nc := a.cfg.NATS
	for _, subj := range []string{DeltaSubject("*"), FullSubject("*")} {
		sub, err := nc.ChanSubscribe(subj, a.syncCh)
		if err != nil {
			a.unsubscribe()
			return fmt.Errorf("global: aggregator: subscribe %s: %w", subj, err)
		}
		a.subs = append(a.subs, sub)
	}
	if err := nc.FlushWithContext(sctx); err != nil {
		a.unsubscribe()
		return fmt.Errorf("global: aggregator: flush: %w", err)
	}
	_ = nc.Publish(ResyncAllSubject, a.resyncBody())

	ann, through, _, err := a.load(sctx)
	if err != nil {
		a.unsubscribe()
		return err
	}
	a.mu.Lock()
	a.c.ann = ann
	a.mu.Unlock()

	ctx, a.cancel = context.WithCancel(ctx)
	cons, err := st.OrderedConsumer(sctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{bus.RegionFilter(bus.GlobalRegion)},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    through + 1,
	})
	if err == nil {
		a.follower, err = cons.Consume(func(m jetstream.Msg) {
			select {
			case a.followCh <- m:
			case <-ctx.Done():
			}
		})
	}
	if err != nil {
		a.cancel()
		a.unsubscribe()
		return fmt.Errorf("global: aggregator: follow %s: %w", StreamName, err)
	}
	if a.svc, err = bus.StartService(nc, bus.GlobalRegion, a, bus.WithLogger(a.log)); err != nil {
		a.cancel()
		a.follower.Stop()
		a.unsubscribe()
		return err
	}
	a.wg.Add(3)
	go a.engine(ctx)
	go a.leaseLoop(ctx)
	go a.purger(ctx)
	return nil
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
		if a.follower != nil {
			a.follower.Stop()
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
// evaluated and, on the leader, the resulting transitions written.
func (a *Aggregator) engine(ctx context.Context) {
	defer a.wg.Done()
	t := time.NewTicker(max(a.cfg.Cadence/4, 10*time.Millisecond))
	defer t.Stop()
	prune := time.NewTicker(time.Minute)
	defer prune.Stop()
	for {
		var touched touchSet
		select {
		case <-ctx.Done():
			return
		case m := <-a.syncCh:
			touched = a.onPublication(m)
		case m := <-a.followCh:
			touched = a.onFollow(m)
		case <-a.leaseCh:
			a.chainOK = false
			if a.leader.Load() {
				touched = a.reload(ctx)
			}
		case <-t.C:
			a.mu.Lock()
			touched = a.c.tick(time.Now())
			a.mu.Unlock()
			if a.leader.Load() && !a.chainOK {
				touched = a.reload(ctx) // an earlier reload failed
			}
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
	a.mu.Lock()
	touched, ask := a.c.publication(p, time.Now())
	a.mu.Unlock()
	if ask {
		_ = a.cfg.NATS.Publish(ResyncSubject(p.Region), a.resyncBody())
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

// onFollow folds one stream message into the announced view.
func (a *Aggregator) onFollow(m jetstream.Msg) touchSet {
	md, err := m.Metadata()
	if err != nil {
		a.stats.Malformed.Add(1)
		return nil
	}
	t, ok := decodeGlobal(m.Subject(), m.Data())
	a.mu.Lock()
	defer a.mu.Unlock()
	if !ok {
		a.stats.Malformed.Add(1)
		a.c.ann.skip(md.Sequence.Stream)
		return nil
	}
	if md.Sequence.Stream <= a.c.ann.through {
		return nil // our own write, already folded
	}
	a.c.ann.apply(t, md.Sequence.Stream, md.Timestamp)
	// Another writer moved the stream: our next write would be rejected.
	a.chainOK = false
	touched := touchSet{}
	touched.add(t.Room, t.User)
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

// reload re-reads the announced view from the stream and restarts the
// write chain on it. It returns everyone, to evaluate against the new
// view.
func (a *Aggregator) reload(ctx context.Context) touchSet {
	if time.Since(a.lastReload) < reloadPause {
		return nil
	}
	a.lastReload = time.Now()
	ann, through, stale, err := a.load(ctx)
	if err != nil {
		a.log.Warn("global: cannot read the global stream", "err", err)
		return nil
	}
	a.stats.Reloads.Add(1)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.c.ann = ann
	a.next, a.chainOK = through, true
	for _, p := range stale {
		a.queuePurge(p)
	}
	return a.c.everyone()
}

// load reads the stream's last message per subject, in stream order, into
// a new announced view. It returns the view, the stream sequence it is
// complete through, and the online messages that a later offline of the
// same user superseded (to purge).
func (a *Aggregator) load(ctx context.Context) (*announced, uint64, []purgeReq, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cons, err := a.stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
		DeliverPolicy:     jetstream.DeliverLastPerSubjectPolicy,
		AckPolicy:         jetstream.AckNonePolicy,
		FilterSubject:     bus.RegionFilter(bus.GlobalRegion),
		InactiveThreshold: time.Minute,
		MemoryStorage:     true,
	})
	if err != nil {
		return nil, 0, nil, fmt.Errorf("global: load %s: %w", StreamName, err)
	}
	defer func() {
		dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		_ = a.stream.DeleteConsumer(dctx, cons.CachedInfo().Name)
		dcancel()
	}()
	ann := newAnnounced()
	var stale []purgeReq
	now := time.Now()
	drain := func() error {
		for {
			batch, err := cons.FetchNoWait(roundWindow)
			if err != nil {
				return err
			}
			n := 0
			for m := range batch.Messages() {
				n++
				md, err := m.Metadata()
				if err != nil {
					continue
				}
				t, ok := decodeGlobal(m.Subject(), m.Data())
				if !ok {
					a.stats.Malformed.Add(1)
					ann.skip(md.Sequence.Stream)
					continue
				}
				if on := ann.apply(t, md.Sequence.Stream, md.Timestamp); on != 0 {
					stale = append(stale, purgeReq{onlineSubject(t.Room, t.User), md.Sequence.Stream})
				}
			}
			if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
				return err
			}
			if n == 0 {
				return nil
			}
		}
	}
	for {
		if err := drain(); err != nil {
			return nil, 0, nil, fmt.Errorf("global: load %s: %w", StreamName, err)
		}
		info, err := a.stream.Info(ctx)
		if err != nil {
			return nil, 0, nil, fmt.Errorf("global: load %s: %w", StreamName, err)
		}
		ci, err := cons.Info(ctx)
		if err != nil {
			return nil, 0, nil, fmt.Errorf("global: load %s: %w", StreamName, err)
		}
		// Nothing undelivered after the stream's last sequence was read:
		// every message up to it that still exists is folded in.
		if ci.NumPending == 0 {
			ann.skip(info.State.LastSeq)
			ann.settle(now, a.cfg.OfflineRetention)
			return ann, ann.through, stale, nil
		}
	}
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

// settle evaluates the touched users and, on the leader, writes the
// transitions they call for.
func (a *Aggregator) settle(ctx context.Context, touched touchSet) {
	for attempt := 0; len(touched) > 0 && attempt < 3; attempt++ {
		a.mu.Lock()
		now := time.Now()
		intents := a.c.evaluate(touched, now)
		if !a.leader.Load() || !a.chainOK || len(intents) == 0 {
			a.mu.Unlock()
			return
		}
		round := a.prepare(intents, now)
		a.mu.Unlock()
		if err := a.send(ctx, round); err == nil {
			a.stats.Transitions.Add(int64(len(round)))
			a.mu.Lock()
			for _, w := range round {
				if w.t.Kind == presence.Offline {
					// Kept until stored: a failed round retries at once.
					a.c.forget(w.t.Room, w.t.User)
				}
				if w.prev != 0 {
					a.queuePurge(purgeReq{onlineSubject(w.t.Room, w.t.User), w.seq})
				}
			}
			a.mu.Unlock()
			return
		} else if ctx.Err() != nil {
			return
		} else {
			a.stats.Conflicts.Add(1)
			a.log.Info("global: the stream rejected a round; re-reading it", "err", err)
		}
		a.chainOK = false
		a.lastReload = time.Time{}
		touched = a.reload(ctx)
	}
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
		w := write{t: t, seq: a.next, msg: &nats.Msg{Subject: ingestSubject(t), Data: data, Header: nats.Header{}}}
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

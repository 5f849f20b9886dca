package bus

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/presence-dev/presence/presence"
)

// DefaultGapTimeout is how long a Replayer holds transitions behind a
// missing Seq before it gives the missing one up. The regional store
// redelivers an unacknowledged transition after its publish lease (5s by
// default), so a late one normally arrives well inside it.
const DefaultGapTimeout = 10 * time.Second

// maxHeld bounds the transitions held behind a gap; past it the gap is
// given up at once.
const maxHeld = 4096

// Replayer follows one room's transitions in a region's stream, starting
// where a snapshot left off. Create it with Replay.
type Replayer struct {
	region, room string
	fn           func(presence.Transition)
	notBefore    time.Time // set when the snapshot has no stream position
	gapTimeout   time.Duration
	ctx          context.Context
	// resnapshot, when set, gives a fresh snapshot of the room, and apply
	// replaces the follower's view with it (see WithResnapshot).
	resnapshot func(context.Context) (presence.Snapshot, error)
	apply      func(presence.Snapshot)

	mu      sync.Mutex // held while fn runs
	stopped bool
	seq     *Sequencer[presence.Transition] // the room's order; epoch 0 until known
	gapGen  int                             // invalidates a pending gap timer
	gap     *time.Timer                     // armed while seq has a gap open

	js       jetstream.JetStream
	ccMu     sync.Mutex // cc, created, checking
	cc       jetstream.ConsumeContext
	created  time.Time // of the stream followed: a new one was made again
	checking bool
	stopOnce sync.Once
	done     chan struct{}
}

// ReplayOption configures Replay.
type ReplayOption func(*Replayer)

// WithGapTimeout sets how long transitions wait behind a missing Seq
// (default DefaultGapTimeout). Non-positive values are ignored.
func WithGapTimeout(d time.Duration) ReplayOption {
	return func(r *Replayer) {
		if d > 0 {
			r.gapTimeout = d
		}
	}
}

// WithResnapshot makes the Replayer follow a new epoch of the room the way
// BUS.md asks every reader to: when a transition of a later epoch than
// the one it follows arrives, it takes a fresh snapshot with get, hands it
// to apply (replace your view of the room with it), and goes on with the
// transitions above the snapshot's RoomSeq. A new epoch means the room's
// history before it is not complete for you (Redis lost its data, or an
// outbox at its cap dropped events); this is the one thing it asks.
// bus.NewClient(nc, region).Snapshot makes a get: for rooms larger than
// a page, page through the members in get. get is retried until its
// snapshot reaches the new epoch or the replay stops.
func WithResnapshot(get func(context.Context) (presence.Snapshot, error), apply func(presence.Snapshot)) ReplayOption {
	return func(r *Replayer) { r.resnapshot, r.apply = get, apply }
}

// Replay applies the snapshot + replay contract of presence.Snapshot: it
// starts an ordered consumer on region's stream at snap.StreamSeq+1,
// filtered to the room, skips the room's transitions with Seq <=
// snap.RoomSeq and calls fn with every later one, once each, in Seq order.
// Apply snap, then what fn receives: the result follows the room's
// membership as it changes.
//
// It returns once the consumer exists; fn is then called, for live
// transitions too, until ctx is done or Stop is called. Calls to fn never
// overlap.
//
// Concurrent publishers can store a room's transitions out of Seq order; a
// transition that arrives above a missing Seq is held until the missing
// one arrives, for at most the gap timeout, after which the missing one is
// given up (and dropped if it comes later). Duplicates are dropped. When
// the room's numbering restarts (a new epoch) the Replayer takes a new
// snapshot if WithResnapshot says how; without it, it only follows the
// new numbering from 1, which is right for a room that was simply empty
// for a while but leaves the view wrong after Redis lost its data or the
// stream its store. With WithResnapshot a snapshot older than the stream
// (snap.At before its creation) is replaced by a fresh one before the
// replay starts. With snap.StreamSeq == 0 (no transition of the room
// acknowledged yet) the whole retained stream is read and transitions
// older than snap.At are skipped.
func Replay(ctx context.Context, js jetstream.JetStream, region, room string, snap presence.Snapshot, fn func(presence.Transition), opts ...ReplayOption) (*Replayer, error) {
	if js == nil || fn == nil {
		return nil, errors.New("bus: replay: JetStream context and callback are required")
	}
	if err := errors.Join(ValidateRegion(region), presence.ValidateRoom(room)); err != nil {
		return nil, fmt.Errorf("bus: replay: %w", err)
	}
	if snap.Region != region || snap.Room != room {
		return nil, fmt.Errorf("bus: replay: snapshot is of %s/%s, not %s/%s", snap.Region, snap.Room, region, room)
	}
	r := &Replayer{
		region: region, room: room, fn: fn, ctx: ctx,
		gapTimeout: DefaultGapTimeout,
		done:       make(chan struct{}),
	}
	for _, o := range opts {
		o(r)
	}
	r.seq = NewSequencer[presence.Transition](SeqLimits{GapTimeout: r.gapTimeout, MaxHeld: maxHeld})
	r.js = js
	stream, err := js.Stream(ctx, StreamName(region))
	if err != nil {
		return nil, fmt.Errorf("bus: replay %s/%s: %w", region, room, err)
	}
	info := stream.CachedInfo()
	r.created = info.Created
	if snap.At.Before(info.Created) && r.resnapshot != nil {
		// The snapshot is older than the stream: what happened between
		// them may have gone with an earlier stream.
		if snap, err = r.resnapshot(ctx); err != nil {
			return nil, fmt.Errorf("bus: replay %s/%s: fresh snapshot: %w", region, room, err)
		}
		r.apply(snap)
	}
	cfg := r.startAt(snap, info.State.LastSeq, info.Created)
	if err := r.consume(ctx, cfg); err != nil {
		return nil, err
	}
	go func() {
		select {
		case <-ctx.Done():
			r.Stop()
		case <-r.done:
		}
	}()
	return r, nil
}

// startAt is where the replay's consumer starts after snap, in a stream
// whose last seq is lastSeq and that was made at created, with the
// sequencer reset to what the snapshot has.
func (r *Replayer) startAt(snap presence.Snapshot, lastSeq uint64, created time.Time) jetstream.OrderedConsumerConfig {
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{RoomFilter(r.region, r.room)}}
	switch {
	case snap.StreamSeq > lastSeq || (snap.StreamSeq > 0 && snap.Epoch < created.UnixMilli()):
		// The snapshot's position is of an earlier stream (its
		// JetStream store lost; the room, numbered before this stream
		// was made, has not been renumbered yet). Read the room's part
		// of this one whole; room seq and epoch skip what the snapshot
		// has.
		cfg.DeliverPolicy = jetstream.DeliverAllPolicy
		r.seq.Reset(snap.Epoch, snap.RoomSeq)
	case snap.StreamSeq > 0:
		cfg.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		cfg.OptStartSeq = snap.StreamSeq + 1
		r.seq.Reset(snap.Epoch, snap.RoomSeq)
	default:
		cfg.DeliverPolicy = jetstream.DeliverAllPolicy
		r.notBefore = snap.At
		r.seq.Reset(0, snap.RoomSeq) // the first transition's epoch is the room's
	}
	return cfg
}

// consume starts an ordered consumer with cfg. Its errors make the
// Replayer check whether the stream was made again.
func (r *Replayer) consume(ctx context.Context, cfg jetstream.OrderedConsumerConfig) error {
	cons, err := r.js.OrderedConsumer(ctx, StreamName(r.region), cfg)
	if err != nil {
		return fmt.Errorf("bus: replay %s/%s: %w", r.region, r.room, err)
	}
	cc, err := cons.Consume(r.handle, jetstream.ConsumeErrHandler(func(jetstream.ConsumeContext, error) { r.checkStream() }))
	if err != nil {
		return fmt.Errorf("bus: replay %s/%s: %w", r.region, r.room, err)
	}
	r.ccMu.Lock()
	r.cc = cc
	r.ccMu.Unlock()
	select {
	case <-r.done: // stopped meanwhile
		cc.Stop()
	default:
	}
	return nil
}

// checkStream runs after a consumer error: if the stream was made again
// (its store lost; the nodes make it again), the ordered consumer would
// wait for sequences the new stream reaches much later, so the Replayer
// starts over on the new stream from its first message, after a fresh
// snapshot (WithResnapshot: what it had not read of the old stream is
// gone); room seq and epoch skip what was delivered, and the rooms' new
// epoch in the new stream takes another snapshot.
func (r *Replayer) checkStream() {
	r.ccMu.Lock()
	if r.checking {
		r.ccMu.Unlock()
		return
	}
	r.checking = true
	r.ccMu.Unlock()
	go func() {
		defer func() {
			r.ccMu.Lock()
			r.checking = false
			r.ccMu.Unlock()
		}()
		for r.ctx.Err() == nil {
			select {
			case <-r.done:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(r.ctx, 5*time.Second)
			st, err := r.js.Stream(ctx, StreamName(r.region))
			cancel()
			if err == nil {
				r.ccMu.Lock()
				same := st.CachedInfo().Created.Equal(r.created)
				if !same {
					r.created = st.CachedInfo().Created
				}
				old := r.cc
				r.ccMu.Unlock()
				if same {
					return // a passing error; the consumer recovers
				}
				old.Stop()
				if !r.restartOnNewStream() {
					return // stopped
				}
				cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{RoomFilter(r.region, r.room)},
					DeliverPolicy: jetstream.DeliverAllPolicy}
				if r.consume(r.ctx, cfg) == nil {
					return
				}
			}
			select {
			case <-r.ctx.Done():
				return
			case <-r.done:
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
}

// restartOnNewStream prepares the Replayer for a stream made again: what
// it had not read of the old one is lost, so with WithResnapshot it
// replaces the view with a fresh snapshot now, rather than at the room's
// next transition (of a new epoch). It returns false once stopped.
func (r *Replayer) restartOnNewStream() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return false
	}
	if r.resnapshot == nil {
		return true
	}
	epoch, _, _ := r.seq.Position()
	snap, ok := r.freshSnapshot(epoch)
	if !ok {
		return false
	}
	r.apply(snap)
	r.seq.Reset(snap.Epoch, snap.RoomSeq)
	r.syncGap()
	return true
}

func (r *Replayer) handle(m jetstream.Msg) {
	t, ok := decodeFor(r.region, r.room, m.Subject(), m.Data())
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped || t.At.Before(r.notBefore) {
		return
	}
	// The Sequencer orders a transition without an epoch within the
	// current numbering; the Replayer drops it as a stray of an earlier
	// one once the numbering is known.
	if epoch, _, _ := r.seq.Position(); t.Epoch == 0 && epoch != 0 {
		return
	}
	r.offer(t)
	r.syncGap()
}

// offer passes t to the sequencer and acts on its verdict. r.mu is held.
func (r *Replayer) offer(t presence.Transition) {
	switch r.seq.Offer(t.Epoch, t.Seq, t, time.Now()) {
	case Deliver:
		r.fn(t)
		r.drain()
	case GaveUp:
		r.drain()
	case NewEpoch:
		r.newEpoch(t)
	}
}

// newEpoch follows the room's later numbering that t opens: what is held
// is delivered with its gaps given up, then the Replayer starts from a
// fresh snapshot (WithResnapshot) or from seq 1, and offers t again.
// r.mu is held.
func (r *Replayer) newEpoch(t presence.Transition) {
	for r.seq.Held() > 0 {
		r.seq.SkipGap(time.Now())
		r.drain()
	}
	if r.resnapshot == nil {
		r.seq.Reset(t.Epoch, 0) // a later numbering starts at 1
		r.offer(t)
		return
	}
	snap, ok := r.freshSnapshot(t.Epoch)
	if !ok {
		return // stopped
	}
	r.apply(snap)
	// snap.Epoch >= t.Epoch: t is offered in the snapshot's numbering, or
	// dropped as Stale when the snapshot is of a later one still.
	r.seq.Reset(snap.Epoch, snap.RoomSeq)
	r.offer(t)
}

// freshSnapshot gets snapshots until one of at least epoch comes, or the
// replay's context ends. r.mu is held: the consumer waits meanwhile.
func (r *Replayer) freshSnapshot(epoch int64) (presence.Snapshot, bool) {
	for {
		snap, err := r.resnapshot(r.ctx)
		if err == nil && snap.Epoch >= epoch {
			return snap, true
		}
		select {
		case <-r.ctx.Done():
			return presence.Snapshot{}, false
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// drain delivers the held transitions that are now next. r.mu is held.
func (r *Replayer) drain() {
	for t, ok := r.seq.Next(); ok; t, ok = r.seq.Next() {
		r.fn(t)
	}
	r.syncGap()
}

// syncGap keeps the gap timer armed exactly while the sequencer has a gap
// open, for its deadline. r.mu is held.
func (r *Replayer) syncGap() {
	deadline := r.seq.Deadline()
	switch {
	case deadline.IsZero() && r.gap != nil:
		r.gap.Stop()
		r.gap = nil
		r.gapGen++
	case !deadline.IsZero() && r.gap == nil:
		r.gapGen++
		gen := r.gapGen
		r.gap = time.AfterFunc(time.Until(deadline), func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.stopped || gen != r.gapGen {
				return
			}
			r.gap = nil
			if now := time.Now(); r.seq.Overdue(now) {
				r.seq.SkipGap(now) // what remains waits a full timeout
			}
			r.drain()
		})
	}
}

// Seq returns the room Seq through which every transition has been
// delivered, given up, or was in the snapshot. The Replayer has caught up
// with a later snapshot of the room once Seq reaches its RoomSeq.
func (r *Replayer) Seq() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, seq, _ := r.seq.Position()
	return seq
}

// Stop ends the replay: once it returns, fn is not running and will not be
// called again. Do not call it from fn; cancel Replay's context instead.
func (r *Replayer) Stop() {
	r.stopOnce.Do(func() {
		r.mu.Lock()
		r.stopped = true
		if r.gap != nil {
			r.gap.Stop()
		}
		r.mu.Unlock()
		// done first: a consumer started again after this (checkStream)
		// sees it and stops itself.
		close(r.done)
		r.ccMu.Lock()
		cc := r.cc
		r.ccMu.Unlock()
		cc.Stop()
	})
}

// Done is closed when the replay has stopped.
func (r *Replayer) Done() <-chan struct{} { return r.done }

package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/presence-dev/presence/bus"
)

// Lane timings.
const (
	// ackWait is long: the lane's holder owns what it was sent, and a
	// new holder resets the consumer to its ack floor instead of waiting
	// for redeliveries; redelivered copies of what the lane holds are
	// ignored.
	ackWait       = 2 * time.Minute
	laneTick      = 250 * time.Millisecond
	statsEvery    = 2 * time.Second
	evictEvery    = time.Minute
	roomIdle      = 10 * time.Minute
	maxHeld       = 4096
	pullBatch     = 500
	persistMaxTry = 2 * time.Second
)

// ConsumerName is the durable consumer of endpoint on each stream it
// reads.
func ConsumerName(endpoint string) string { return "webhook_" + endpoint }

// endpointRT is an endpoint's configuration with its HTTP client.
type endpointRT struct {
	e      *Endpoint
	client *http.Client
}

// lane delivers one stream to one endpoint while this dispatcher holds
// its lease: a goroutine that owns the core, a consumer that feeds it,
// and one attempt at a time in flight.
type lane struct {
	id     LaneID
	d      *Dispatcher
	ep     atomic.Pointer[endpointRT]
	until  atomic.Int64 // the lease holds until (unix ns)
	enable chan bool    // a new configuration; true: lift a 410 too

	cancel   context.CancelFunc // ends the lane
	abort    context.CancelFunc // ends an attempt in flight (lease lost)
	graceful atomic.Bool        // on stop, let the attempt in flight finish
	done     chan struct{}
	status   atomic.Pointer[LaneStatus]
	stalled  chan struct{} // the watchdog: start over from the ack floor
	// busyAt is when the lane last showed it is not stuck (unix ns): an
	// attempt started or answered, or nothing to deliver.
	busyAt atomic.Int64

	// The lane goroutine's own.
	core     *core
	msgs     map[uint64]jetstream.Msg
	in       chan jetstream.Msg
	results  chan result
	trouble  chan struct{}
	inflight bool
	stream   jetstream.Stream
	cons     jetstream.Consumer
	created  time.Time
	horizon  time.Duration
}

// LaneStatus is what /healthz reports of a lane.
type LaneStatus struct {
	Endpoint    string  `json:"endpoint"`
	Source      string  `json:"source"`
	State       string  `json:"state"` // starting, delivering, retrying, disabled
	LagEvents   uint64  `json:"lag_events"`
	LagSeconds  float64 `json:"lag_seconds"`
	LastFailure string  `json:"last_failure,omitempty"`
}

func newLane(d *Dispatcher, id LaneID, rt *endpointRT) *lane {
	ln := &lane{id: id, d: d, enable: make(chan bool, 1), done: make(chan struct{}),
		in: make(chan jetstream.Msg, pullBatch), results: make(chan result, 1), trouble: make(chan struct{}, 1),
		stalled: make(chan struct{}, 1), msgs: map[uint64]jetstream.Msg{}}
	ln.busy(time.Now())
	ln.ep.Store(rt)
	ln.status.Store(&LaneStatus{Endpoint: id.Endpoint, Source: id.Source, State: "starting"})
	return ln
}

// start runs the lane until stop; err, if the lane ended by itself
// (its stream made again, a setup that failed), goes to ended.
func (ln *lane) start(ended func(*lane, error)) {
	ctx, cancel := context.WithCancel(context.Background())
	actx, abort := context.WithCancel(context.Background())
	ln.cancel, ln.abort = cancel, abort
	go func() {
		defer close(ln.done)
		defer abort()
		err := ln.run(ctx, actx)
		if ctx.Err() == nil {
			ended(ln, err)
		}
	}()
}

// stop ends the lane: graceful lets an attempt in flight finish and
// settle (a lease given up); otherwise it is cut off (a lease lost).
func (ln *lane) stop(graceful bool) {
	ln.graceful.Store(graceful)
	if !graceful {
		ln.abort()
	}
	ln.cancel()
}

func (ln *lane) busy(now time.Time) { ln.busyAt.Store(now.UnixNano()) }

// stallAfter is how long a lane with lag may go without an attempt
// before the watchdog starts it over: longer than any wait the lane
// makes on purpose (a retry's backoff and its attempt, a gap and its
// reading again, a batch filling, a lease refresh).
func stallAfter(e *Endpoint, leaseTTL time.Duration) time.Duration {
	return time.Duration(e.MaxBackoff) + time.Duration(e.Timeout) + 2*time.Duration(e.GapTimeout) +
		time.Duration(e.MaxWait) + leaseTTL + 4*laneTick
}

func (ln *lane) setup(ctx context.Context) error {
	rt := ln.ep.Load()
	s, err := ln.d.js.Stream(ctx, bus.StreamName(ln.id.Source))
	if err != nil {
		return fmt.Errorf("stream: %w", err)
	}
	info := s.CachedInfo()
	ln.stream, ln.created = s, info.Created
	rec, err := ln.d.st.lane(ctx, ln.id)
	if err != nil {
		return err
	}
	prev := ln.d.lastCreated(ln.id)
	reset := (rec != nil && !rec.StreamCreated.Equal(ln.created)) || (!prev.IsZero() && !prev.Equal(ln.created))
	if ln.cons, err = ln.consumer(ctx, rt.e, reset); err != nil {
		return err
	}
	// What a previous holder held unacknowledged comes first, in stream
	// order: the consumer starts again at its ack floor.
	if _, err := s.ResetConsumer(ctx, ConsumerName(ln.id.Endpoint)); err != nil {
		return fmt.Errorf("reset consumer: %w", err)
	}
	ln.horizon = time.Duration(rt.e.RetryHorizon)
	if ln.horizon == 0 {
		ln.horizon = max(info.Config.MaxAge, time.Hour)
	}
	now := time.Now()
	ln.core = newCore(ln.id.Source, limitsOf(rt.e, ln.horizon), ln.d.rnd)
	if reset {
		ln.core.resetSince = now
		ln.d.lg.Warn("webhook: the stream was made again: rooms met without a position get a stream_reset marker", "lane", ln.id.String())
	}
	owed, err := ln.d.st.owed(ctx, ln.id)
	if err != nil {
		return err
	}
	for room, p := range owed {
		ln.core.owe(room, p, now)
	}
	if err := ln.d.st.setLane(ctx, ln.id, laneRecord{StreamCreated: ln.created}); err != nil {
		return err
	}
	ln.d.setLastCreated(ln.id, ln.created)
	return nil
}

func limitsOf(e *Endpoint, horizon time.Duration) coreLimits {
	return coreLimits{batchSize: e.BatchSize, maxWait: time.Duration(e.MaxWait), horizon: horizon,
		minBackoff: time.Duration(e.MinBackoff), maxBkf: time.Duration(e.MaxBackoff),
		gapTimeout: time.Duration(e.GapTimeout), maxHeld: maxHeld}
}

// consumer returns the lane's durable consumer, creating it: from new
// events for an endpoint not seen before, from the stream's first event
// when the stream was made again (all it holds was never delivered).
func (ln *lane) consumer(ctx context.Context, e *Endpoint, reset bool) (jetstream.Consumer, error) {
	name := ConsumerName(e.Name)
	c, err := ln.stream.Consumer(ctx, name)
	if err == nil {
		cfg := c.CachedInfo().Config
		if cfg.MaxAckPending == e.MaxPending {
			return c, nil
		}
		cfg.MaxAckPending = e.MaxPending
		return ln.stream.UpdateConsumer(ctx, cfg)
	}
	if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("consumer %s: %w", name, err)
	}
	policy := jetstream.DeliverNewPolicy
	if reset {
		policy = jetstream.DeliverAllPolicy
	}
	return ln.stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: name, Description: "presence webhooks: endpoint " + e.Name,
		DeliverPolicy: policy, AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, MaxDeliver: -1,
		MaxAckPending: e.MaxPending, FilterSubject: bus.RegionFilter(ln.id.Source),
	})
}

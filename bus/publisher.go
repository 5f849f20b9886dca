package bus

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/presence-dev/presence/presence"
)

// DefaultAckTimeout bounds the wait for a batch's acks when the caller's
// context has no earlier deadline.
const DefaultAckTimeout = 5 * time.Second

// publishWindow bounds the async publishes one Publish keeps in flight,
// well under the client's default limit of 4000 pending, so concurrent
// batches do not stall each other.
const publishWindow = 256

// Publisher stores a region's transitions in its stream. It is the
// region.Sink of the regional store, and is safe for concurrent use.
//
// It publishes on the ingest subjects (IngestSubject), where only the
// stream listens: a transition reaches subscribers of presence.> when, and
// only when, it is stored, so a failed or repeated publish delivers
// nothing twice, and a subscriber that replies to what it receives cannot
// be taken for the stream's acknowledgement. If the stream is gone (the
// JetStream store was lost), the publisher creates it again and retries.
type Publisher struct {
	js         jetstream.JetStream
	region     string
	stream     string
	ackTimeout time.Duration
	config     StreamConfig

	mu      sync.Mutex
	lastErr error // of the last Publish; nil once one succeeds
	floor   floor // the stream's creation time, as last read
}

// PublisherOption configures a Publisher.
type PublisherOption func(*Publisher)

// WithAckTimeout bounds how long Publish waits for acks when its context
// has no earlier deadline. Non-positive values are ignored.
func WithAckTimeout(d time.Duration) PublisherOption {
	return func(p *Publisher) {
		if d > 0 {
			p.ackTimeout = d
		}
	}
}

// WithStreamConfig is the configuration the publisher creates the
// region's stream with if it finds it gone (default: StreamConfig with
// the region and defaults). Give it the one EnsureStream was given.
func WithStreamConfig(c StreamConfig) PublisherOption {
	return func(p *Publisher) { p.config = c }
}

// NewPublisher returns a Publisher for region's stream (see EnsureStream).
// An invalid region makes every Publish fail.
func NewPublisher(js jetstream.JetStream, region string, opts ...PublisherOption) *Publisher {
	p := &Publisher{js: js, region: region, stream: StreamName(region), ackTimeout: DefaultAckTimeout,
		config: StreamConfig{Region: region}}
	for _, o := range opts {
		o(p)
	}
	p.config.Region = region
	return p
}

// Err reports why the last Publish failed, or nil if it succeeded:
// while it is not nil, transitions wait in the regional store's outbox.
func (p *Publisher) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastErr
}

// streamGone reports whether a publish error means no stream listens on
// the ingest subjects (or the one there is not the region's).
func streamGone(err error) bool {
	return errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrStreamNotFound)
}

// Publish stores ts in the stream, in slice order, and returns the stream
// sequence of the last one. Each message carries Nats-Msg-Id: t.ID, so
// publishing a transition again within DuplicateWindow stores nothing and
// is acknowledged with the original sequence. On error some of ts may be
// stored; publishing the whole batch again is safe. A batch with a
// transition of an epoch below the stream's creation (EpochFloor) is
// refused whole: its room starts a new epoch first (the regional store
// does so for a FlooredSink).
func (p *Publisher) Publish(ctx context.Context, ts []presence.Transition) (uint64, error) {
	var seq uint64
	err := errBelowFloor
	if !p.belowFloor(ts) {
		seq, err = p.publish(ctx, ts)
	}
	if err != nil && streamGone(err) {
		// The stream is gone (its JetStream store was lost): this node
		// owns it, so it makes it again, then sends the batch once more,
		// unless the batch's numbering is older than the new stream.
		// Nothing of the failed attempt reached any subscriber.
		rec := p.reconnects()
		if st, eerr := EnsureStream(ctx, p.js, p.config); eerr == nil {
			p.setFloor(st, rec)
			if err = errBelowFloor; !p.belowFloor(ts) {
				seq, err = p.publish(ctx, ts)
			}
		} else {
			err = errors.Join(err, eerr)
		}
	}
	p.mu.Lock()
	p.lastErr = err
	p.mu.Unlock()
	return seq, err
}

// errDisconnected: publishing now would only wait for the reconnect.
var errDisconnected = errors.New("bus: publish: not connected to NATS")

func (p *Publisher) publish(ctx context.Context, ts []presence.Transition) (uint64, error) {
	if p.js == nil {
		return 0, errors.New("bus: publish: publisher has no JetStream context")
	}
	if err := ValidateRegion(p.region); err != nil {
		return 0, fmt.Errorf("bus: publish: %w", err)
	}
	if len(ts) == 0 {
		return 0, nil
	}
	// While NATS is away, fail at once: the transitions wait in the
	// store's outbox instead of in this call, for a whole ack timeout.
	if nc := p.js.Conn(); nc != nil && !nc.IsConnected() {
		return 0, errDisconnected
	}
	msgs, err := p.messages(ts)
	if err != nil {
		return 0, err
	}

	ctx, cancel := context.WithTimeout(ctx, p.ackTimeout)
	defer cancel()
	var last uint64
	for start := 0; start < len(msgs); start += publishWindow {
		end := min(start+publishWindow, len(msgs))
		futs := make([]jetstream.PubAckFuture, 0, end-start)
		for i := start; i < end; i++ {
			// One connection sends in call order, so the stream stores a
			// room's transitions in Seq order.
			// No client-side retry on "no responders": a retry still
			// pending when Publish remakes a lost stream would store this
			// batch's old numbering in the new one. Publish retries itself.
			f, err := p.js.PublishMsgAsync(msgs[i], jetstream.WithMsgID(ts[i].ID), jetstream.WithExpectStream(p.stream),
				jetstream.WithRetryAttempts(0))
			if err != nil {
				return 0, fmt.Errorf("bus: publish %s: %w", ts[i].ID, err)
			}
			futs = append(futs, f)
		}
		for j, f := range futs {
			select {
			case ack := <-f.Ok():
				// A duplicate ack carries the original message's sequence.
				// The highest: a retried batch may find its later events
				// stored already (duplicates ack their first sequence).
				last = max(last, ack.Sequence)
			case err := <-f.Err():
				settle(ctx, futs[j+1:])
				return 0, fmt.Errorf("bus: publish %s: %w", ts[start+j].ID, err)
			case <-ctx.Done():
				return 0, fmt.Errorf("bus: publish %s: waiting for ack: %w", ts[start+j].ID, ctx.Err())
			}
		}
	}
	return last, nil
}

// messages encodes ts as the messages of this region's stream, refusing
// a transition of another region or with an invalid id.
func (p *Publisher) messages(ts []presence.Transition) ([]*nats.Msg, error) {
	msgs := make([]*nats.Msg, len(ts))
	for i, t := range ts {
		// The subject must land in this region's stream, and every token
		// must be one valid id.
		if t.Region != p.region {
			return nil, fmt.Errorf("bus: publish: transition %s is of region %q, publisher is for %q", t.ID, t.Region, p.region)
		}
		if err := errors.Join(presence.ValidateRoom(t.Room), presence.ValidateUser(t.User)); err != nil {
			return nil, fmt.Errorf("bus: publish: transition %s: %w", t.ID, err)
		}
		data, err := EncodeEvent(t)
		if err != nil {
			return nil, fmt.Errorf("bus: publish: %w", err)
		}
		msgs[i] = &nats.Msg{Subject: IngestSubject(t), Data: data, Header: nats.Header{}}
	}
	return msgs, nil
}

// settle waits until every future has its answer or ctx ends, so that
// nothing of a failed attempt is still in flight when Publish decides
// what to do next.
func settle(ctx context.Context, futs []jetstream.PubAckFuture) {
	for _, f := range futs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			_ = err // this attempt failed already: Publish decides on its first error
		case <-ctx.Done():
			return
		}
	}
}

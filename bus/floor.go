package bus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/presence-dev/presence/presence"
)

// floorMaxAge bounds how long the publisher trusts the stream's creation
// time it read without a NATS reconnect or a publish that found no stream
// in between; past it EpochFloor reads it again.
const floorMaxAge = 5 * time.Second

// errBelowFloor: a batch's numbering began before the stream was made.
var errBelowFloor = errors.New("bus: publish: the room's numbering began before the stream was made (its store was lost); the room starts a new epoch first")

// floor is the creation time of the stream a Publisher stores into, as
// last read. p.mu guards it.
type floor struct {
	ms         int64     // unix ms; valid when read is not zero
	read       time.Time // when it was read
	reconnects uint64    // the connection's reconnects when it was read
}

// EpochFloor returns the creation time of the region's stream, unix ms
// (region.FlooredSink): a room numbered before it starts a new epoch
// before its transitions are stored, so that a stream made again after
// its store was lost holds no room's transitions under the numbering of
// the old one. It reads the stream's info again after a NATS reconnect,
// after a publish found the stream gone, and every floorMaxAge; if the
// stream is gone it makes it again, as Publish does.
func (p *Publisher) EpochFloor(ctx context.Context) (int64, error) {
	rec := p.reconnects()
	p.mu.Lock()
	f := p.floor
	p.mu.Unlock()
	if !f.read.IsZero() && f.reconnects == rec && time.Since(f.read) < floorMaxAge {
		return f.ms, nil
	}
	if p.js == nil {
		return 0, errors.New("bus: epoch floor: publisher has no JetStream context")
	}
	st, err := p.js.Stream(ctx, p.stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		st, err = EnsureStream(ctx, p.js, p.config)
	}
	if err != nil {
		return 0, fmt.Errorf("bus: epoch floor of %s: %w", p.stream, err)
	}
	return p.setFloor(st, rec), nil
}

// setFloor records the creation time of st, read with the connection at
// rec reconnects, and returns it.
func (p *Publisher) setFloor(st jetstream.Stream, rec uint64) int64 {
	ms := st.CachedInfo().Created.UnixMilli()
	p.mu.Lock()
	p.floor = floor{ms: ms, read: time.Now(), reconnects: rec}
	p.mu.Unlock()
	return ms
}

// reconnects counts the connection's reconnects (0 without one).
func (p *Publisher) reconnects() uint64 {
	if p.js == nil {
		return 0
	}
	if nc := p.js.Conn(); nc != nil {
		return nc.Stats().Reconnects
	}
	return 0
}

// belowFloor reports whether a transition of ts is numbered under the
// last floor read.
func (p *Publisher) belowFloor(ts []presence.Transition) bool {
	p.mu.Lock()
	ms := p.floor.ms
	p.mu.Unlock()
	for _, t := range ts {
		if t.Epoch < ms {
			return true
		}
	}
	return false
}

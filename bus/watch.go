package bus

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/presence-dev/presence/presence"
)

// flushTimeout bounds the round trip that makes a new subscription live.
const flushTimeout = 5 * time.Second

var malformed atomic.Uint64

// MalformedEvents returns how many messages WatchRoom and Replay have
// dropped, process-wide, because they did not decode or did not belong to
// the subject they came on.
func MalformedEvents() uint64 { return malformed.Load() }

// checkWatch validates a region (or GlobalRegion) and a room.
func checkWatch(region, room string) error {
	if region != GlobalRegion {
		if err := ValidateRegion(region); err != nil {
			return err
		}
	}
	return presence.ValidateRoom(room)
}

// decodeFor decodes a message of RoomFilter(region, room). An event whose
// body disagrees with the subject it came on is malformed.
func decodeFor(region, room, subject string, data []byte) (presence.Transition, bool) {
	t, err := DecodeEvent(data)
	if err != nil || t.Region != region || t.Room != room || EventSubject(t) != subject {
		malformed.Add(1)
		return presence.Transition{}, false
	}
	return t, true
}

// WatchRoom calls fn with every transition of room in region (or, with
// GlobalRegion, of the room's global view) published from now on. It is a
// core NATS subscription: nothing is replayed, and a slow fn can make the
// server drop messages (see nats.Conn's slow consumer errors).
//
// The subscription is live on the server when WatchRoom returns, so a
// snapshot taken afterwards misses nothing: apply the snapshot, then the
// watched transitions with Seq > snap.RoomSeq. (In a NATS cluster, interest
// reaches other servers a moment later; Replay has no such window.) fn is called from one
// goroutine in arrival order; one publisher's transitions of a room arrive
// in Seq order. Malformed messages are dropped and counted (see
// MalformedEvents). Unsubscribe to stop.
func WatchRoom(nc *nats.Conn, region, room string, fn func(presence.Transition)) (*nats.Subscription, error) {
	if nc == nil || fn == nil {
		return nil, errors.New("bus: watch: connection and callback are required")
	}
	if err := checkWatch(region, room); err != nil {
		return nil, fmt.Errorf("bus: watch: %w", err)
	}
	sub, err := nc.Subscribe(RoomFilter(region, room), func(m *nats.Msg) {
		if t, ok := decodeFor(region, room, m.Subject, m.Data); ok {
			fn(t)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("bus: watch %s: %w", RoomFilter(region, room), err)
	}
	// The server has processed SUB once it answers the PING that follows.
	if err := nc.FlushTimeout(flushTimeout); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("bus: watch %s: flush: %w", RoomFilter(region, room), err)
	}
	return sub, nil
}

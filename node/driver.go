package node

import (
	"context"
	"log/slog"
	"time"

	"github.com/presence-dev/presence/presence"
)

// HeartbeatDriver is a node's session keeper without its connections:
// what a load tool standing in for a node runs to keep sessions alive on
// the node's own heartbeat schedule (slots, batches, catch-up after a
// failed refresh), so a region's store can be measured at a node count
// and size no machine's sockets would hold.
type HeartbeatDriver struct{ k *sessionKeeper }

// driverOwner stands for the connection that holds a session.
type driverOwner struct{}

func (driverOwner) sessionMoved() {}

// NewHeartbeatDriver returns a keeper on store with the store's
// heartbeat, slots slots (DefaultHeartbeatSlots if 0), batches of at most
// batch (DefaultTouchBatch if 0) and timeout per store call
// (DefaultStoreTimeout if 0). observe, if not nil, is told of every
// Refresh batch, as the node's heartbeat metrics are.
func NewHeartbeatDriver(store Store, slots, batch int, timeout time.Duration, log *slog.Logger, observe func(time.Duration, int, error)) *HeartbeatDriver {
	if slots == 0 {
		slots = DefaultHeartbeatSlots
	}
	if batch == 0 {
		batch = DefaultTouchBatch
	}
	if timeout == 0 {
		timeout = DefaultStoreTimeout
	}
	if observe == nil {
		observe = func(time.Duration, int, error) {}
	}
	if log == nil {
		log = slog.Default()
	}
	return &HeartbeatDriver{newSessionKeeper(store, store.Timing().Heartbeat, slots, batch, timeout, log, observe)}
}

// Adopt registers sessions already claimed in the store (a seed claimed
// in large batches) as if joined here, each in the least loaded slot.
func (d *HeartbeatDriver) Adopt(refs []presence.SessionRef) {
	s := d.k
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range refs {
		if s.refs[r] != nil {
			continue
		}
		s.claims++
		e := &heldSession{slot: -1, owners: []owner{driverOwner{}}, gen: s.claims}
		s.refs[r] = e
		s.place(r, e)
	}
}

// Hold claims r and keeps it alive: a join.
func (d *HeartbeatDriver) Hold(ctx context.Context, r presence.SessionRef) error {
	return d.k.hold(ctx, r, driverOwner{})
}

// Release stops refreshing r and releases it in the store: a clean close.
func (d *HeartbeatDriver) Release(ctx context.Context, r presence.SessionRef) error {
	_, err := d.k.unhold(ctx, r, driverOwner{}, true)
	return err
}

// Held is the number of sessions kept alive.
func (d *HeartbeatDriver) Held() int { return d.k.held() }

// Run refreshes the sessions on the heartbeat until ctx is done.
func (d *HeartbeatDriver) Run(ctx context.Context) { d.k.run(ctx) }

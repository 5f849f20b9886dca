package node

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/presence"
)

// A node with Config.Global shows its clients the global view while it
// can, and its own region's view while it cannot: no aggregator answers
// (none runs, or the region is cut off from all of them), or the one
// that answers cannot read the global stream and so cannot vouch for its
// view. Joins never fail for want of the global view, and the region
// keeps serving its own users. A room follows whichever view its latest
// snapshot came from: the snapshot's region says which ("global", or the
// node's region), and the room's subscription moves with it.

const (
	// viewProbe is how often the global view is probed, in either mode.
	viewProbe = time.Second
	// viewRecover is how many answers in a row it takes to trust the
	// global view again: a link that flaps does not move every room back
	// and forth at each answer.
	viewRecover = 2
	// probeRoom is the room the probe asks about; any valid id will do.
	probeRoom = "presence-probe"
)

// views is the Snapshotter of a node with Config.Global: the global view,
// or the regional one while the global view does not answer.
type views struct {
	global, regional Snapshotter
	region           string
	timeout          time.Duration
	log              *slog.Logger

	degraded atomic.Bool
	changed  chan struct{} // the mode changed: every room must follow
	probe    time.Duration
}

// newViews returns the views of a node with Config.Global, and registers
// its gauge.
func newViews(cfg Config, log *slog.Logger) *views {
	v := &views{
		global: cfg.Global, regional: cfg.Store, region: cfg.Region, timeout: cfg.StoreTimeout, log: log,
		changed: make(chan struct{}, 1), probe: viewProbe,
	}
	err := cfg.Metrics.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "presence", Subsystem: "node", Name: "global_view",
		Help: "1 while clients see the global view, 0 while the node serves its region's view because the global view does not answer.",
	}, func() float64 {
		if v.degraded.Load() {
			return 0
		}
		return 1
	}))
	if err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
		log.Warn("node: cannot register the global view gauge", "err", err)
	}
	return v
}

// view returns the region token of the view rooms should follow now.
func (v *views) view() string {
	if v.degraded.Load() {
		return v.region
	}
	return bus.GlobalRegion
}

// known reports whether region names one of the two views.
func (v *views) known(region string) bool { return region == bus.GlobalRegion || region == v.region }

// Snapshot reads the global view, or the regional one while the global
// view does not answer. A failed global read degrades the node at once:
// the read is for a client waiting on a join.
func (v *views) Snapshot(ctx context.Context, room string, offset, limit int) (presence.Snapshot, error) {
	if !v.degraded.Load() {
		snap, err := v.global.Snapshot(ctx, room, offset, limit)
		if err == nil {
			return snap, nil
		}
		if errors.Is(ctx.Err(), context.Canceled) {
			return snap, err // the node is closing
		}
		v.degrade(err)
	}
	return v.regional.Snapshot(ctx, room, offset, limit)
}

// Count is the member count from the view snapshots come from now.
func (v *views) Count(ctx context.Context, room string) (int, error) {
	if !v.degraded.Load() {
		if c, ok := v.global.(Counter); ok {
			n, err := c.Count(ctx, room)
			if err == nil || errors.Is(ctx.Err(), context.Canceled) {
				return n, err
			}
			v.degrade(err)
		}
	}
	if c, ok := v.regional.(Counter); ok {
		return c.Count(ctx, room)
	}
	return 0, errNoCounts
}

func (v *views) degrade(err error) {
	if v.degraded.CompareAndSwap(false, true) {
		v.log.Warn("node: the global view does not answer; serving the region's view", "region", v.region, "err", err)
		v.notify()
	}
}

func (v *views) notify() {
	select {
	case v.changed <- struct{}{}:
	default:
	}
}

// run probes the global view until ctx is done: a failure degrades the
// node, viewRecover answers in a row restore the global view.
func (v *views) run(ctx context.Context) {
	t := time.NewTicker(v.probe)
	defer t.Stop()
	ok := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, v.timeout)
		_, err := v.global.Snapshot(pctx, probeRoom, 0, 1)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			ok = 0
			v.degrade(err)
		case v.degraded.Load():
			if ok++; ok >= viewRecover {
				ok = 0
				v.degraded.Store(false)
				v.log.Info("node: the global view answers again; serving it", "region", v.region)
				v.notify()
			}
		}
	}
}

// moveRoom makes a room follow the view a snapshot of it came from, and
// reports whether the snapshot must be read again: it is of a view the
// node no longer serves (the mode changed since it was read), or it was
// read before the room's subscription to its view existed.
func (h *hub) moveRoom(name, view string) (bool, error) {
	if h.views == nil || !h.views.known(view) {
		return false, nil
	}
	if view != h.views.view() {
		return true, nil // stale: never move a room away from the node's view
	}
	h.mu.Lock()
	r := h.rooms[name]
	if r == nil || r.view == view {
		h.mu.Unlock()
		return false, nil
	}
	h.mu.Unlock()
	sub, err := h.nc.ChanSubscribe(bus.RoomFilter(view, name), h.msgs)
	if err == nil {
		ctx, cancel := context.WithTimeout(h.ctx, h.timeout)
		err = h.nc.FlushWithContext(ctx)
		cancel()
	}
	if err != nil {
		unsubscribe(sub)
		return false, err
	}
	h.mu.Lock()
	if h.rooms[name] != r || r.view == view {
		h.mu.Unlock()
		unsubscribe(sub) // left meanwhile, or moved by another reader
		return true, nil
	}
	old := r.sub
	r.sub, r.view = sub, view
	h.restartLocked(r)
	h.mu.Unlock()
	unsubscribe(old)
	h.log.Info("node: room follows another view", "room", name, "view", view)
	return true, nil
}

// followView starts every room that does not follow the node's view over:
// its resync reads the view and moves the room to it.
func (h *hub) followView() {
	h.mu.Lock()
	defer h.mu.Unlock()
	view := h.views.view()
	for _, r := range h.rooms {
		select {
		case <-r.ready:
			if r.view != view {
				h.restartLocked(r)
			}
		default: // its creator is subscribing, and reads a snapshot after
		}
	}
}

// restartLocked starts a room over, as resetLocked does, except for the
// members still waiting for their join's snapshot: their join reads the
// room again and answers them, so they get no resync snapshot before it.
func (h *hub) restartLocked(r *room) {
	var joining []*member
	for _, m := range r.members {
		if !m.live && !m.resync {
			joining = append(joining, m)
		}
	}
	h.resetLocked(r)
	for _, m := range joining {
		m.resync = false
	}
}

package webhook

import (
	"context"
	"errors"
	"time"
)

// loop runs the leases: every TTL/4 it refreshes those held, gives up
// lanes no longer configured or beyond its share, and takes free ones up
// to its share. Lanes run on their own goroutines.
func (d *Dispatcher) loop(ctx context.Context) {
	defer close(d.done)
	t := time.NewTicker(d.opts.LeaseTTL / 4)
	defer t.Stop()
	d.tick(ctx)
	for {
		select {
		case <-t.C:
			d.tick(ctx)
		case lift := <-d.updates:
			d.apply(lift)
			d.tick(ctx)
		case id := <-d.gone:
			d.mu.Lock()
			delete(d.releasing, id)
			d.mu.Unlock()
			d.leases.release(ctx, id)
		case <-ctx.Done():
			d.leaveAll()
			return
		}
	}
}

func (d *Dispatcher) tick(ctx context.Context) {
	now := time.Now()
	cfg := d.cfg.Load()
	all := cfg.Lanes()
	configured := map[LaneID]bool{}
	for _, l := range all {
		configured[l] = true
	}
	tctx, cancel := context.WithTimeout(ctx, d.opts.LeaseTTL/4)
	defer cancel()
	d.refresh(tctx, now)
	mctx, mcancel := context.WithTimeout(ctx, d.opts.LeaseTTL/8)
	want := share(len(all), d.leases.members(mctx))
	mcancel()
	d.mu.Lock()
	var extra []LaneID
	for id := range d.lanes {
		if !configured[id] {
			extra = append(extra, id)
		}
	}
	n := len(d.lanes) - len(extra)
	for _, l := range all {
		if n <= want {
			break
		}
		if d.lanes[l] != nil {
			extra, n = append(extra, l), n-1
		}
	}
	d.mu.Unlock()
	for _, id := range extra {
		d.giveUp(id)
	}
	for id := range d.leases.held {
		d.mu.Lock()
		idle := d.lanes[id] == nil && d.releasing[id] == nil
		d.mu.Unlock()
		if idle && !configured[id] {
			d.leases.release(tctx, id) // a lane that ended, then left the configuration
		}
	}
	d.take(tctx, all, want, now)
	d.watch(now)
	d.mu.Lock()
	d.m.lanes.Set(float64(len(d.lanes)))
	d.mu.Unlock()
}

// refresh keeps the leases held; a lane whose lease is lost stops at
// once (its attempt in flight is cut off).
func (d *Dispatcher) refresh(ctx context.Context, now time.Time) {
	for id := range d.leases.held {
		ok := d.leases.refresh(ctx, id, now)
		d.mu.Lock()
		ln := d.lanes[id]
		if ln == nil {
			ln = d.releasing[id]
		}
		if !ok {
			d.m.leasesLost.WithLabelValues(id.Endpoint, id.Source).Inc()
		}
		if !ok && ln != nil {
			d.lg.Warn("webhook: lease lost; the lane stops here", "lane", id.String())
			ln.stop(false)
			delete(d.lanes, id)
			delete(d.releasing, id)
			d.m.forget(id)
		} else if ok && ln != nil {
			ln.until.Store(d.leases.held[id].until.UnixNano())
		}
		d.mu.Unlock()
	}
}

// take starts lanes on the leases held without one (a lane that ended by
// itself starts again), then takes free lanes up to want.
func (d *Dispatcher) take(ctx context.Context, all []LaneID, want int, now time.Time) {
	cfg := d.cfg.Load()
	off := d.offset(len(all))
	for i := range all {
		id := all[(off+i)%len(all)]
		d.mu.Lock()
		running := d.lanes[id] != nil || d.releasing[id] != nil
		count := len(d.lanes)
		d.mu.Unlock()
		if running {
			continue
		}
		if d.leases.held[id] == nil {
			if count >= want || !d.leases.acquire(ctx, id, now) {
				continue
			}
		}
		e := cfg.Endpoint(id.Endpoint)
		ln := newLane(d, id, runtimeOf(e, nil))
		ln.until.Store(d.leases.held[id].until.UnixNano())
		d.mu.Lock()
		d.lanes[id] = ln
		d.mu.Unlock()
		d.m.lane(id)
		d.lg.Info("webhook: lane taken", "lane", id.String())
		ln.start(d.ended)
	}
}

// watch starts over a lane that has lag and made no attempt for longer
// than any wait it makes on purpose (stallAfter): the lane ends with
// errStalled, and the next tick starts it again on its lease.
func (d *Dispatcher) watch(now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for id, ln := range d.lanes {
		idle := now.Sub(time.Unix(0, ln.busyAt.Load()))
		limit := stallAfter(ln.ep.Load().e, d.opts.LeaseTTL)
		if ln.status.Load().LagEvents == 0 || idle < limit {
			continue
		}
		select {
		case ln.stalled <- struct{}{}:
			d.m.stalls.WithLabelValues(id.Endpoint, id.Source).Inc()
			d.lg.Warn("webhook: lane made no progress while it had lag; starting it over from its consumer's ack floor",
				"lane", id.String(), "idle", idle.Round(time.Millisecond), "lag_events", ln.status.Load().LagEvents)
		default:
		}
		ln.busy(now) // once per stallAfter, even if the lane does not read it (it waits for JetStream)
	}
}

// ended is called by a lane that stopped by itself: its lease stays, and
// the next tick starts it afresh.
func (d *Dispatcher) ended(ln *lane, err error) {
	switch {
	case errors.Is(err, errStalled): // watch said why
	case errors.Is(err, errStreamChanged):
		d.lg.Warn("webhook: the lane's stream was made again or its consumer removed; starting the lane over", "lane", ln.id.String())
	case err != nil:
		d.lg.Error("webhook: lane stopped", "lane", ln.id.String(), "err", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.lanes[ln.id] == ln {
		delete(d.lanes, ln.id)
	}
}

// giveUp stops a lane gracefully; its lease is refreshed until the lane
// is done, then released.
func (d *Dispatcher) giveUp(id LaneID) {
	d.mu.Lock()
	ln := d.lanes[id]
	delete(d.lanes, id)
	if ln != nil {
		d.releasing[id] = ln
	}
	d.mu.Unlock()
	if ln == nil {
		return
	}
	d.m.forget(id)
	d.lg.Info("webhook: lane given up", "lane", id.String())
	ln.stop(true)
	go func() {
		<-ln.done
		d.gone <- id
	}()
}

// apply hands the new configuration to the running lanes.
func (d *Dispatcher) apply(lift bool) {
	cfg := d.cfg.Load()
	d.mu.Lock()
	defer d.mu.Unlock()
	for id, ln := range d.lanes {
		e := cfg.Endpoint(id.Endpoint)
		if e == nil {
			continue // given up at the tick
		}
		ln.ep.Store(runtimeOf(e, ln.ep.Load()))
		select {
		case ln.enable <- lift:
		default:
		}
	}
}

// leaveAll stops every lane gracefully, waits for them and gives every
// lease up. The leases are refreshed meanwhile: a lane still settling its
// last delivery when its lease expired would see the next holder send
// that delivery again.
func (d *Dispatcher) leaveAll() {
	d.mu.Lock()
	for id, ln := range d.lanes {
		d.releasing[id] = ln
	}
	d.lanes = map[LaneID]*lane{}
	all := make([]*lane, 0, len(d.releasing))
	for _, ln := range d.releasing {
		ln.stop(true)
		all = append(all, ln)
	}
	d.mu.Unlock()
	t := time.NewTicker(d.opts.LeaseTTL / 4)
	defer t.Stop()
	for _, ln := range all {
		for waiting := true; waiting; {
			select {
			case <-ln.done:
				waiting = false
			case <-t.C:
				ctx, cancel := context.WithTimeout(context.Background(), d.opts.LeaseTTL/4)
				d.refresh(ctx, time.Now())
				cancel()
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	d.leases.leave(ctx)
}

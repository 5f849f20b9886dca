package node

import (
	"sync"
	"time"
)

// Status is what a node tells an operator about itself (the HTTP API's
// /v1/nodes, over NATS): its load and how its heartbeat keeps up.
type Status struct {
	// State is starting, ok, draining or closed.
	State       string
	Connections int64
	Sessions    int
	Rooms       int
	// Heartbeat is the slowest heartbeat batch of the last one to two
	// statusWindows; HeartbeatBudget the time between two batches
	// (heartbeat / HeartbeatSlots): a slower batch makes the heartbeat
	// fall behind.
	Heartbeat, HeartbeatBudget time.Duration
	// Joins is room joins per second over the last one to two
	// statusWindows; JoinLimit the join rate limiter's rate now.
	Joins, JoinLimit float64
	Started          time.Time
}

// statusWindow is the span the status's heartbeat and join figures
// cover (one to two of it).
const statusWindow = 10 * time.Second

// Status reports the node's status now.
func (n *Node) Status() Status {
	now := time.Now()
	st := Status{State: "closed", Connections: n.counts.open.Load(), Sessions: n.keeper.held(), Rooms: n.hub.count(),
		Heartbeat: time.Duration(n.beats.value(now, false)), HeartbeatBudget: n.cfg.heartbeat / time.Duration(n.cfg.HeartbeatSlots),
		Joins: n.joinMeter.value(now, true), JoinLimit: n.joins.Rate(), Started: n.epoch}
	switch n.state.Load() {
	case stateNew:
		st.State = "starting"
	case stateRunning:
		st.State = "ok"
	case stateDraining:
		st.State = "draining"
	}
	return st
}

// windows keeps a figure over two consecutive windows: the largest value
// seen, or the sum of the values per second.
type windows struct {
	mu        sync.Mutex
	span      time.Duration
	start     time.Time // of the current window
	cur, prev float64
	sum       bool
}

func newWindows(span time.Duration, sum bool, now time.Time) *windows {
	return &windows{span: span, start: now, sum: sum}
}

// roll moves to the window of now.
func (w *windows) roll(now time.Time) {
	switch d := now.Sub(w.start); {
	case d >= 2*w.span:
		w.prev, w.cur, w.start = 0, 0, now
	case d >= w.span:
		w.prev, w.cur, w.start = w.cur, 0, w.start.Add(w.span)
	}
}

// add records v at now.
func (w *windows) add(now time.Time, v float64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.roll(now)
	if w.sum {
		w.cur += v
	} else {
		w.cur = max(w.cur, v)
	}
}

// value is the largest value of both windows or, for a sum, its rate
// per second over them.
func (w *windows) value(now time.Time, perSecond bool) float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.roll(now)
	if !w.sum {
		return max(w.cur, w.prev)
	}
	elapsed := now.Sub(w.start) + w.span
	if !perSecond || elapsed <= 0 {
		return w.cur + w.prev
	}
	return (w.cur + w.prev) / elapsed.Seconds()
}

package node

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/presence-dev/presence/internal/storm"
	"github.com/presence-dev/presence/protocol"
)

// metrics are the node's Prometheus collectors, all named presence_node_*.
type metrics struct {
	joins          prometheus.Counter
	leaves         *prometheus.CounterVec // how: leave, close, kept, revoked
	touchSeconds   prometheus.Histogram
	touchErrors    prometheus.Counter
	rejectedFrames *prometheus.CounterVec // code
	rejectedConns  *prometheus.CounterVec // reason
	closes         *prometheus.CounterVec // close code the node sent
	resyncs        prometheus.Counter
	snapshotReads  prometheus.Counter
	forwarded      prometheus.Counter
	batches        prometheus.Counter
	behind         prometheus.Counter
	watchSubs      prometheus.Counter
	badEvents      prometheus.Counter
	busCopies      prometheus.Counter
	overloaded     prometheus.Counter
	// Where an event's time goes inside the node, for events frames:
	// off NATS until in room order (a gap holds it), then until its
	// room's tick sends it, then from queued until written to a member.
	reorder, fanWait, frameWrite prometheus.Histogram
	// Where a join's time goes before that: its claim (the wait for a
	// store call under way, then its own), and its event's way from the
	// store to this node (outbox, delivery, the stream, NATS).
	claim, eventAge prometheus.Histogram
	join            storm.JoinMetrics
	extend          storm.ExtendMetrics
}

// gauges are the readings behind the node's gauges, each from the part
// of the node that owns it.
type gauges struct {
	pendingReleases, inflight, connections, sessions, rooms func() int
	joinRate                                                func() float64
}

// stormCollectors are the collectors of reconnect storms: the join
// limiter's and the extender's.
func (m *metrics) stormCollectors(g gauges) []prometheus.Collector {
	const ns, sub = "presence", "node"
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help})
	}
	m.join.Admitted = counter("joins_admitted_total", "Joins that claim a session admitted by the join rate limiter.")
	m.join.Refused = counter("joins_refused_total", "Joins refused with unavailable and a retry hint: past the join rate, the node at capacity, or the store failing.")
	hint := prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "retry_after_seconds",
		Help:    "The retry hints (retry_after_ms) sent with refused joins.",
		Buckets: []float64{.25, .5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30}})
	m.join.RetryHint = hint
	m.extend.Sent = counter("extend_sent_total", "Sessions of refused clients sent to the store to be kept while they retry.")
	m.extend.Extended = counter("extended_sessions_total", "Sessions of refused clients the store found and extended.")
	m.extend.Dropped = counter("extend_dropped_total", "Refused sessions not extended: the extender's queue was full.")
	m.extend.Errors = counter("extend_errors_total", "Extend calls that failed.")
	return []prometheus.Collector{m.join.Admitted, m.join.Refused, hint, m.extend.Sent, m.extend.Extended, m.extend.Dropped, m.extend.Errors,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "join_rate",
			Help: "The join rate limiter's rate now, joins/s (it follows the store's claim latency)."}, g.joinRate)}
}

func newMetrics(reg prometheus.Registerer, g gauges) (*metrics, error) {
	const ns, sub = "presence", "node"
	m := &metrics{
		joins: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "joins_total",
			Help: "Rooms joined by clients."}),
		leaves: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "leaves_total",
			Help: "Sessions this node stopped holding, by how: leave (frame), close (connection ended; released), kept (drain; left to the TTL) or revoked (a refreshed token no longer grants the room)."}, []string{"how"}),
		touchSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "heartbeat_touch_seconds",
			Help:    "Latency of one heartbeat Touch batch.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}}),
		touchErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "heartbeat_touch_errors_total",
			Help: "Heartbeat Touch batches that failed."}),
		rejectedFrames: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "rejected_frames_total",
			Help: "Client frames answered with an error frame, by error code (too_big: closed with 1009)."}, []string{"code"}),
		rejectedConns: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "rejected_connections_total",
			Help: "Handshakes refused before the upgrade, by reason."}, []string{"reason"}),
		closes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "closes_total",
			Help: "Connections the node closed, by close code."}, []string{"code"}),
		resyncs: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "resyncs_total",
			Help: "Rooms started over from a new snapshot (lost transitions, NATS reconnect)."}),
		snapshotReads: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "join_snapshot_reads_total",
			Help: "Snapshot reads for joins; joiners of one room who ask at once share a read."}),
		forwarded: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "events_forwarded_total",
			Help: "Transitions queued to clients one event frame each (batched ones count in events_frames_total)."}),
		batches: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "events_frames_total",
			Help: "Events frames queued to clients: one room's events of one tick, to one member."}),
		behind: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "members_behind_total",
			Help: "Members taking events frames that read too slowly: they got nothing more until their queue drained, then a resync snapshot."}),
		watchSubs: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "watch_subscriptions_total",
			Help: "NATS subscriptions made for watched users (one per room and user watched on this node)."}),
		badEvents: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "bad_events_total",
			Help: "Messages on room subjects that are not valid events of this region."}),
		busCopies: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "bus_copies_passed_total",
			Help: "Events off NATS that their room had passed on already: mostly the bus's copies of this node's own transitions, which its members got as soon as the store had them."}),
		overloaded: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "overloaded_requests_total",
			Help: "Client requests refused (unavailable, with retry advice) because MaxInflight requests already waited on the store."}),
	}
	latency := func(name, help string) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help,
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}})
	}
	m.reorder = latency("event_reorder_seconds", "From an event's arrival (off NATS, or from this node's own store call) until it is in its room's order (a gap before it holds it).")
	m.fanWait = latency("fanout_wait_seconds", "Per room and tick that sends events frames (to all members, or to those whose turn it is): how long the oldest event it sends waited, in order, for it.")
	m.frameWrite = latency("frame_write_seconds", "Shared events frames: from queued at the tick until written to the member's socket.")
	m.claim, m.eventAge = joinStages(ns, sub)
	cs := []prometheus.Collector{
		m.reorder, m.fanWait, m.frameWrite, m.claim, m.eventAge,
		m.joins, m.leaves, m.touchSeconds, m.touchErrors, m.rejectedFrames, m.rejectedConns, m.closes,
		m.resyncs, m.snapshotReads, m.forwarded, m.batches, m.behind, m.watchSubs, m.badEvents, m.busCopies, m.overloaded,
	}
	cs = append(cs, gaugeCollectors(g)...)
	for _, c := range append(cs, m.stormCollectors(g)...) {
		if err := reg.Register(c); err != nil {
			return nil, configError("metrics", "registering: "+err.Error())
		}
	}
	m.initLabels()
	return m, nil
}

// gaugeCollectors are the node's gauges, read from g.
func gaugeCollectors(g gauges) []prometheus.Collector {
	const ns, sub = "presence", "node"
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "pending_releases",
			Help: "Releases that failed (the store out of reach) and are retried until it answers."}, func() float64 { return float64(g.pendingReleases()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "inflight_requests",
			Help: "Client requests waiting on the store now."}, func() float64 { return float64(g.inflight()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "connections",
			Help: "Open client connections."}, func() float64 { return float64(g.connections()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "sessions",
			Help: "Sessions (room, user, session) held and refreshed by this node."}, func() float64 { return float64(g.sessions()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "rooms",
			Help: "Rooms with local members, each one NATS subscription."}, func() float64 { return float64(g.rooms()) }),
	}
}

// initLabels makes every code and reason exist from the start, so rates
// work before the first rejection.
func (m *metrics) initLabels() {
	for _, c := range []protocol.ErrorCode{protocol.CodeBadFrame, protocol.CodeUnknownType, protocol.CodeInvalidRoom, protocol.CodeInvalidState, protocol.CodeForbidden,
		protocol.CodeTooManyRooms, protocol.CodeNotJoined, protocol.CodeRateLimited, protocol.CodeUnavailable, protocol.CodeInvalidToken, protocol.CodeInvalidPage, "too_big"} {
		m.rejectedFrames.WithLabelValues(string(c))
	}
	for _, r := range []string{"auth", "capacity", "draining", "bad_request", "origin"} {
		m.rejectedConns.WithLabelValues(r)
	}
}

// joinStages are the histograms of a join's claim and of its event's way
// from the store to the node, with buckets fine enough for milliseconds.
func joinStages(ns, sub string) (claim, eventAge prometheus.Histogram) {
	fine := func(name, help string) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help,
			Buckets: []float64{.0005, .001, .002, .003, .005, .0075, .01, .015, .025, .05, .1, .25, .5, 1, 2.5}})
	}
	return fine("join_claim_seconds", "A join with presence: from its claim's queueing (behind a store call under way) until the store answered it."),
		fine("event_age_seconds", "From a transition's time in the regional store (its at, by Redis's clock) until it arrived off NATS: the outbox, its delivery, the stream and NATS. Across hosts it includes their clocks' skew.")
}

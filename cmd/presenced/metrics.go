package main

import (
	"context"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/presence-dev/presence/global"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/region"
)

// counter is one Stats field exported as a Prometheus counter.
type counter struct {
	name, help string
	v          *atomic.Int64
}

// registerCounters exports counters as presence_<sub>_<name>_total.
func registerCounters(reg prometheus.Registerer, sub string, cs []counter) error {
	for _, c := range cs {
		v := c.v
		if err := reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "presence", Subsystem: sub, Name: c.name + "_total", Help: c.help,
		}, func() float64 { return float64(v.Load()) })); err != nil {
			return err
		}
	}
	return nil
}

// countingSink is the store's sink, counting the transitions it delivers
// by kind and reason (presence_region_transitions_by_reason_total): the
// rate of onlines and offlines against the members online is the flapping
// signal. A batch counts once the sink took it, so a retried batch counts
// once. Every transition is delivered by one node of the region: the sum
// over the region's nodes is the region's.
type countingSink struct {
	region.Sink
	by *prometheus.CounterVec
}

func newCountingSink(reg prometheus.Registerer, sink region.Sink) (countingSink, error) {
	by := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "presence", Subsystem: "region", Name: "transitions_by_reason_total",
		Help: "Transitions this node delivered to the stream, by kind (online, offline, update) and reason (joined, left, expired, state)."},
		[]string{"kind", "reason"})
	if err := reg.Register(by); err != nil {
		return countingSink{}, err
	}
	// The pairs a region produces exist from the start, so rates work
	// before the first of each.
	for _, kr := range [][2]string{{"online", "joined"}, {"offline", "left"}, {"offline", "expired"}, {"update", "state"}} {
		by.WithLabelValues(kr[0], kr[1])
	}
	return countingSink{Sink: sink, by: by}, nil
}

func (c countingSink) Publish(ctx context.Context, ts []presence.Transition) (uint64, error) {
	seq, err := c.Sink.Publish(ctx, ts)
	if err == nil {
		for _, t := range ts {
			c.by.WithLabelValues(string(t.Kind), string(t.Reason)).Inc()
		}
	}
	return seq, err
}

// EpochFloor passes on the wrapped sink's floor (region.FlooredSink), so
// the store renumbers a room before a stream made again takes it; 0 for
// a sink without one.
func (c countingSink) EpochFloor(ctx context.Context) (int64, error) {
	if fs, ok := c.Sink.(region.FlooredSink); ok {
		return fs.EpochFloor(ctx)
	}
	return 0, nil
}

// registerStoreMetrics exports the regional store's counters
// (presence_region_*) and its timing (presence_timing_seconds), which
// the alert on heartbeat latency compares against.
func registerStoreMetrics(reg prometheus.Registerer, s *region.Store) error {
	tm := s.Timing()
	timing := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "presence", Name: "timing_seconds",
		Help: "The region's timing in force: session_ttl, heartbeat, offline_grace, reap_interval."}, []string{"setting"})
	for name, d := range map[string]float64{"session_ttl": tm.SessionTTL.Seconds(), "heartbeat": tm.Heartbeat.Seconds(),
		"offline_grace": tm.OfflineGrace.Seconds(), "reap_interval": tm.ReapInterval.Seconds()} {
		timing.WithLabelValues(name).Set(d)
	}
	if err := reg.Register(timing); err != nil {
		return err
	}
	st := s.Stats()
	return registerCounters(reg, "region", []counter{
		{"touched", "Sessions created or refreshed in the regional store.", &st.Touched},
		{"released", "Sessions released (clean closes).", &st.Released},
		{"transitions", "Transitions delivered to the stream.", &st.Transitions},
		{"publish_errors", "Failed deliveries of transitions; they stay in the room's outbox and are retried.", &st.PublishErrors},
		{"last_seen_writes", "Last-seen writes Redis reported making.", &st.LastSeenWrites},
		{"reaped_rooms", "Rooms a reaper settled.", &st.ReapedRooms},
		{"claimed_sweeps", "Cluster masters this node's reaper claimed and read.", &st.ClaimedSweeps},
		{"shared_sweeps", "Cluster masters this node's reaper left to another node's claim.", &st.SharedSweeps},
	})
}

// registerPublisherMetrics exports a region publisher's counters and
// whether it is the region's active one (presence_global_publisher_*).
func registerPublisherMetrics(reg prometheus.Registerer, p *global.RegionPublisher) error {
	st := p.Stats()
	if err := registerCounters(reg, "global_publisher", []counter{
		{"deltas", "Delta publications sent, empty ones (liveness) included.", &st.Deltas},
		{"fulls", "Full snapshots sent.", &st.Fulls},
		{"bytes", "Publication bytes sent.", &st.Bytes},
		{"read_errors", "Cadences skipped because the region could not be read.", &st.ReadErrors},
		{"send_errors", "Publications that failed to send.", &st.SendErrors},
		{"resyncs", "Full snapshots aggregators asked for.", &st.Resyncs},
	}); err != nil {
		return err
	}
	if err := reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "presence", Subsystem: "global_publisher", Name: "members",
		Help: "(room, user) pairs online in the region as its active publisher last published them (the denominator of presence events per user per minute: transitions are per (room, user)); 0 on the region's other nodes, so the sum over them is the region's.",
	}, func() float64 { return float64(p.Members()) })); err != nil {
		return err
	}
	return reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "presence", Subsystem: "global_publisher", Name: "active",
		Help: "1 while this node publishes its region (holds the lease), else 0.",
	}, func() float64 { return boolf(p.Active()) }))
}

// registerAggregatorMetrics exports an aggregator's counters, whether it
// leads, and what it makes of each region (presence_global_*).
func registerAggregatorMetrics(reg prometheus.Registerer, a *global.Aggregator) error {
	st := a.Stats()
	if err := registerCounters(reg, "global", []counter{
		{"publications", "Region publications applied (a full counts once).", &st.Publications},
		{"malformed", "Publications or stream messages dropped as malformed.", &st.Malformed},
		{"gaps", "Region publications that arrived out of sequence.", &st.Gaps},
		{"resync_requests", "Full snapshots asked of regions.", &st.ResyncRequests},
		{"transitions", "Global transitions this aggregator stored.", &st.Transitions},
		{"conflicts", "Write rounds the global stream rejected.", &st.Conflicts},
		{"reloads", "Re-reads of the announced view from the stream.", &st.Reloads},
		{"purges", "Superseded online messages removed from the stream.", &st.Purges},
		{"purge_errors", "Purges that failed (the next reload retries).", &st.PurgeErrors},
	}); err != nil {
		return err
	}
	if err := reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "presence", Subsystem: "global", Name: "leader",
		Help: "1 while this aggregator writes the global stream, else 0.",
	}, func() float64 { return boolf(a.Leader()) })); err != nil {
		return err
	}
	return reg.Register(regionCollector{a})
}

// regionCollector reports each region's state as the aggregator sees it.
type regionCollector struct{ a *global.Aggregator }

var (
	regionStateDesc = prometheus.NewDesc("presence_global_region_state",
		"1 for the state the aggregator holds the region in (live, down, dropped), 0 for the others.", []string{"region", "state"}, nil)
	regionHeardDesc = prometheus.NewDesc("presence_global_region_last_heard_seconds",
		"Unix time of the region's last applied publication; 0 if never.", []string{"region"}, nil)
)

var _ prometheus.Collector = regionCollector{}

func (regionCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- regionStateDesc
	ch <- regionHeardDesc
}

func (c regionCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.a.RegionStatuses() {
		for _, state := range []global.RegionState{global.RegionLive, global.RegionDown, global.RegionDropped} {
			ch <- prometheus.MustNewConstMetric(regionStateDesc, prometheus.GaugeValue, boolf(s.State == state), s.Region, string(state))
		}
		heard := 0.0
		if !s.Heard.IsZero() {
			heard = float64(s.Heard.UnixNano()) / 1e9
		}
		ch <- prometheus.MustNewConstMetric(regionHeardDesc, prometheus.GaugeValue, heard, s.Region)
	}
}

func boolf(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

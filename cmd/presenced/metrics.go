package main

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/presence-dev/presence/global"
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

// registerStoreMetrics exports the regional store's counters
// (presence_region_*).
func registerStoreMetrics(reg prometheus.Registerer, s *region.Store) error {
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

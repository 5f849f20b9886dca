package webhook

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the dispatcher's presence_webhook_* series. Lag is per
// lane this dispatcher holds (sum or max over dispatchers by endpoint);
// counters count this dispatcher's work.
type metrics struct {
	lagEvents   *prometheus.GaugeVec
	lagSeconds  *prometheus.GaugeVec
	deliveries  *prometheus.CounterVec
	events      *prometheus.CounterVec
	failures    *prometheus.CounterVec
	retries     *prometheus.CounterVec
	deadLetters *prometheus.CounterVec
	resyncs     *prometheus.CounterVec
	malformed   *prometheus.CounterVec
	stalls      *prometheus.CounterVec
	refetches   *prometheus.CounterVec
	leasesLost  *prometheus.CounterVec
	disabled    *prometheus.GaugeVec
	attemptTime *prometheus.HistogramVec
	lanes       prometheus.Gauge
	reloads     *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	o := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: "presence", Subsystem: "webhook", Name: name, Help: help}
	}
	lane := []string{"endpoint", "source"}
	ep := []string{"endpoint"}
	m := &metrics{
		lagEvents:   prometheus.NewGaugeVec(prometheus.GaugeOpts(o("lag_events", "Events of the lane's stream not yet delivered to the endpoint (pending in the consumer and held by the dispatcher).")), lane),
		lagSeconds:  prometheus.NewGaugeVec(prometheus.GaugeOpts(o("lag_seconds", "Age of the oldest event the lane holds undelivered; 0 when it holds none.")), lane),
		deliveries:  prometheus.NewCounterVec(prometheus.CounterOpts(o("deliveries_total", "Deliveries answered 2xx.")), ep),
		events:      prometheus.NewCounterVec(prometheus.CounterOpts(o("events_total", "Items (events and resync markers) delivered, answered 2xx.")), ep),
		failures:    prometheus.NewCounterVec(prometheus.CounterOpts(o("failures_total", "Failed attempts, by HTTP status or by what failed before one (timeout, tls, network, forbidden_address).")), []string{"endpoint", "status"}),
		retries:     prometheus.NewCounterVec(prometheus.CounterOpts(o("retries_total", "Attempts scheduled again after a failure.")), ep),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts(o("dead_letters_total", "Batches sent to the dead-letter stream once their retry horizon passed.")), ep),
		resyncs:     prometheus.NewCounterVec(prometheus.CounterOpts(o("resyncs_total", "Resync markers delivered, by reason.")), []string{"endpoint", "reason"}),
		malformed:   prometheus.NewCounterVec(prometheus.CounterOpts(o("malformed_total", "Stream messages that did not decode as events, acknowledged and skipped.")), lane),
		stalls:      prometheus.NewCounterVec(prometheus.CounterOpts(o("stalls_total", "Lanes started over from their consumer's ack floor after no progress while they had lag.")), lane),
		leasesLost:  prometheus.NewCounterVec(prometheus.CounterOpts(o("leases_lost_total", "Lane leases lost (another took them, they expired or could not be refreshed in time): the lane's delivery in flight may be sent again.")), lane),
		refetches:   prometheus.NewCounterVec(prometheus.CounterOpts(o("gap_refetches_total", "Gaps past the gap timeout read again from the consumer's ack floor before they are given up.")), lane),
		disabled:    prometheus.NewGaugeVec(prometheus.GaugeOpts(o("disabled", "1 while the lane is stopped by a 410 Gone (until the config is reloaded).")), lane),
		attemptTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "presence", Subsystem: "webhook", Name: "attempt_seconds", Help: "Duration of delivery attempts, answered or not.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 13)}, ep),
		lanes:       prometheus.NewGauge(prometheus.GaugeOpts(o("lanes", "Lanes (endpoint, source) this dispatcher delivers."))),
		reloads:     prometheus.NewCounterVec(prometheus.CounterOpts(o("config_reloads_total", "Configuration loads, by result (ok, error: the old configuration stays).")), []string{"result"}),
	}
	for _, c := range []prometheus.Collector{m.lagEvents, m.lagSeconds, m.deliveries, m.events, m.failures, m.retries,
		m.deadLetters, m.resyncs, m.malformed, m.stalls, m.refetches, m.leasesLost, m.disabled, m.attemptTime, m.lanes, m.reloads} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	m.reloads.WithLabelValues("ok")
	m.reloads.WithLabelValues("error")
	return m, nil
}

// lane creates the lane's series, so they exist (at 0) before anything
// happens, and forget removes its gauges when the lane leaves this
// dispatcher.
func (m *metrics) lane(l LaneID) {
	m.lagEvents.WithLabelValues(l.Endpoint, l.Source)
	m.lagSeconds.WithLabelValues(l.Endpoint, l.Source)
	m.disabled.WithLabelValues(l.Endpoint, l.Source)
	m.stalls.WithLabelValues(l.Endpoint, l.Source)
	m.refetches.WithLabelValues(l.Endpoint, l.Source)
	m.leasesLost.WithLabelValues(l.Endpoint, l.Source)
	m.deliveries.WithLabelValues(l.Endpoint)
	m.events.WithLabelValues(l.Endpoint)
	m.retries.WithLabelValues(l.Endpoint)
	m.deadLetters.WithLabelValues(l.Endpoint)
}

func (m *metrics) forget(l LaneID) {
	m.lagEvents.DeleteLabelValues(l.Endpoint, l.Source)
	m.lagSeconds.DeleteLabelValues(l.Endpoint, l.Source)
	m.disabled.DeleteLabelValues(l.Endpoint, l.Source)
}

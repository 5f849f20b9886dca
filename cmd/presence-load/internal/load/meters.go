package load

import (
	"errors"
	"fmt"

	"github.com/presence-dev/presence/cmd/presence-load/internal/measure"
)

// NewMeters returns the meters the flags ask for: the node always (its
// /metrics), Redis with --redis (INFO cpu), nats-server with --nats-pid
// (/proc, exact) or else --nats-monitor (/varz, sampled), and this process
// with self.
func NewMeters(o Options, self bool) ([]measure.Meter, error) {
	ms := []measure.Meter{{Name: "node", Source: "/metrics process_cpu_seconds_total", Read: func() (float64, error) {
		m, err := measure.Scrape(o.Metrics)
		if err != nil {
			return 0, err
		}
		v, ok := m["process_cpu_seconds_total"]
		if !ok {
			return 0, errors.New("process_cpu_seconds_total not in " + o.Metrics)
		}
		return v, nil
	}}}
	if o.Redis != "" {
		if _, err := measure.RedisCPU(o.Redis); err != nil {
			return nil, fmt.Errorf("--redis: %w", err)
		}
		ms = append(ms, measure.Meter{Name: "redis", Source: "INFO cpu used_cpu_sys+used_cpu_user", Read: func() (float64, error) { return measure.RedisCPU(o.Redis) }})
	}
	switch {
	case o.NatsPID > 0:
		if _, err := measure.ProcCPU(o.NatsPID); err != nil {
			return nil, fmt.Errorf("--nats-pid: %w", err)
		}
		ms = append(ms, measure.ProcMeter("nats", o.NatsPID))
	case o.NatsMonitor != "":
		m, err := measure.VarzMeter(o.NatsMonitor)
		if err != nil {
			return nil, fmt.Errorf("--nats-monitor: %w", err)
		}
		ms = append(ms, m)
	}
	ms = append(ms, measure.MachineMeter(), measure.StealMeter())
	if self {
		ms = append(ms, measure.SelfMeter())
	}
	return ms, nil
}

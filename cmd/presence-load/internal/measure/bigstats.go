// Package measure is how the modes read and print their figures: CPU
// meters (/proc, Redis INFO, nats-server's /varz), RSS, percentiles and
// latency lines, frames per tick.
package measure

import (
	"fmt"
	"slices"
	"time"
)

// The arithmetic of the big-room figures, apart from any I/O.

// ticks is how many ticks of length tick fit in window (fractional).
func ticks(window, tick time.Duration) float64 {
	if tick <= 0 {
		return 0
	}
	return float64(window) / float64(tick)
}

// perTick summarises frames received per connection over a window as
// frames per tick: the mean over the connections and the highest, with
// the connection counts. Connections that never opened (-1) are left out.
type perTick struct {
	conns     int
	Total     int64
	Mean, Max float64
	maxFrames int64
	over      int // connections above 1 frame per tick
}

// FramesPerTick is the frames each connection read per tick over the
// window (-1: a connection never opened, left out).
func FramesPerTick(frames []int64, window, tick time.Duration) perTick {
	var p perTick
	n := ticks(window, tick)
	if n <= 0 {
		return p
	}
	for _, f := range frames {
		if f < 0 {
			continue
		}
		p.conns++
		p.Total += f
		p.maxFrames = max(p.maxFrames, f)
		if float64(f) > n {
			p.over++
		}
	}
	if p.conns == 0 {
		return p
	}
	p.Mean = float64(p.Total) / float64(p.conns) / n
	p.Max = float64(p.maxFrames) / n
	return p
}

func (p perTick) String() string {
	return fmt.Sprintf("mean %.3f, max %.3f frames per tick over %d connections (%d frames; %d above 1 per tick)",
		p.Mean, p.Max, p.conns, p.Total, p.over)
}

// Ratio is a/b, or 0 when b is 0.
func Ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// latencies turns arrival and send times (µs on a common clock) into
// latencies, sorted, for the pairs where both are known; arrival 0 is
// "not seen".
func latencies(sendUS, arriveUS []int64) []time.Duration {
	var l []time.Duration
	for i, a := range arriveUS {
		if a == 0 || i >= len(sendUS) || sendUS[i] == 0 {
			continue
		}
		l = append(l, time.Duration(a-sendUS[i])*time.Microsecond)
	}
	slices.Sort(l)
	return l
}

// LatencyLine formats p50/p90/p99/max of sorted latencies, counting the
// ones never seen as infinitely late (as the latency mode does).
func LatencyLine(sorted []time.Duration, never int) string {
	all := sorted
	if never > 0 {
		all = append(slices.Clone(sorted), make([]time.Duration, never)...)
		for i := len(sorted); i < len(all); i++ {
			all[i] = neverSeen
		}
	}
	if len(all) == 0 {
		return "no samples"
	}
	return fmt.Sprintf("p50 %s  p90 %s  p99 %s  max %s  (%d samples, %d never seen)",
		FmtDur(Percentile(all, .5)), FmtDur(Percentile(all, .9)), FmtDur(Percentile(all, .99)), FmtDur(Percentile(all, 1)), len(all), never)
}

// neverSeen is `never` (account.go) under a name that reads in this file.
const neverSeen = Never

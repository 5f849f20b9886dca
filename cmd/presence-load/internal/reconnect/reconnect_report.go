package reconnect

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/presence-dev/presence/cmd/presence-load/internal/measure"
)

// storm sends every client at its moment of the window, waits until all
// are held again, measures --after more, and reports.
func (r *reconnectRun) storm(ctx context.Context, nodes []*standIn, stop func()) error {
	o := r.o
	msgs0 := r.streamMsgs(ctx)
	r.count.start()
	cpuStop := make(chan struct{})
	cpu := r.redisCPUSeries(cpuStop)
	t0 := time.Now()
	for i, c := range r.clients {
		c.first = t0.Add(time.Duration(rand.Int64N(int64(o.Window))))
		n := nodes[i%len(nodes)]
		time.AfterFunc(time.Until(c.first), func() { n.arrive(c, time.Now()) })
	}
	fmt.Fprintf(r.out, "storm: %d clients reconnect within %v to %d stand-in nodes (join rate %g/s each, extend %t, max inflight %d)\n",
		o.Sessions, o.Window, o.Nodes, o.JoinRate, o.Extend, o.MaxInflight)
	if err := r.waitHeld(ctx, t0); err != nil {
		return err
	}
	converged := time.Unix(0, max(r.stats.lastHeld.Load(), r.stats.lastServed.Load()))
	overStorm := r.stats.tickOver.Load()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(o.After):
	}
	close(cpuStop)
	series := <-cpu
	stop()
	r.report(ctx, nodes, t0, converged, series, msgs0, overStorm)
	return nil
}

// waitHeld waits until every client is held, printing progress every
// 10 s; it gives up after the window and ten minutes.
func (r *reconnectRun) waitHeld(ctx context.Context, t0 time.Time) error {
	deadline := t0.Add(r.o.Window + 10*time.Minute)
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	lastPrint := t0
	for r.stats.held.Load() < int64(r.o.Sessions) || r.stats.served.Load() < int64(r.o.Sessions) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case now := <-t.C:
			if now.After(deadline) {
				return fmt.Errorf("storm: %d of %d held after %v", r.stats.held.Load(), r.o.Sessions, now.Sub(t0))
			}
			if now.Sub(lastPrint) >= 10*time.Second {
				lastPrint = now
				fmt.Fprintf(r.out, "  t+%3.0fs held %d, served their snapshot %d, refusals so far %d\n", now.Sub(t0).Seconds(),
					r.stats.held.Load(), r.stats.served.Load(), r.stats.refused.Load())
			}
		}
	}
	return nil
}

// classes splits the clients' transitions: those whose first attempt
// came before their session expired (inside), and the others.
func (r *reconnectRun) classes() (inN, outN, inHit, outHit int, inKinds, outKinds map[string]int, other int) {
	inKinds, outKinds = map[string]int{}, map[string]int{}
	r.count.mu.Lock()
	defer r.count.mu.Unlock()
	var margins []time.Duration // how long before its expiry an inside client with transitions first came
	for _, c := range r.clients {
		ts := r.count.byUser[c.idx]
		inside := c.first.Before(c.expires)
		kinds := outKinds
		if inside {
			inN++
			kinds = inKinds
			if len(ts) > 0 {
				inHit++
				margins = append(margins, c.expires.Sub(c.first))
			}
		} else {
			outN++
			if len(ts) > 0 {
				outHit++
			}
		}
		for _, k := range ts {
			kinds[k]++
		}
	}
	if len(margins) > 0 {
		slices.Sort(margins)
		fmt.Fprintf(r.out, "inside clients with transitions came before their expiry by: p50 %v p90 %v max %v\n",
			measure.FmtDur(measure.Percentile(margins, .5)), measure.FmtDur(measure.Percentile(margins, .9)), measure.FmtDur(margins[len(margins)-1]))
	}
	return inN, outN, inHit, outHit, inKinds, outKinds, r.count.other
}

func (r *reconnectRun) report(ctx context.Context, nodes []*standIn, t0, converged time.Time, cpu []float64, msgs0 uint64, overStorm int64) {
	st := &r.stats
	out := r.out
	conv := converged.Sub(t0)
	fmt.Fprintf(out, "converged: every session held again %v after the storm began, every join served its snapshot %v (%v after the window ended)\n",
		time.Unix(0, st.lastHeld.Load()).Sub(t0).Round(time.Millisecond), conv.Round(time.Millisecond), (conv - r.o.Window).Round(time.Millisecond))
	inN, outN, inHit, outHit, inKinds, outKinds, other := r.classes()
	fmt.Fprintf(out, "transitions on NATS after the storm began: inside (first attempt before the session expired) %d clients, %d with transitions %s; after expiry %d clients, %d with transitions %s; others %d; stream +%d messages\n",
		inN, inHit, fmtKinds(inKinds), outN, outHit, fmtKinds(outKinds), other, r.streamMsgs(ctx)-msgs0)
	attempts := make([]int, 0, len(r.clients))
	refusedClients := 0
	for _, c := range r.clients {
		a := int(c.attempts.Load())
		attempts = append(attempts, a)
		if a > 1 {
			refusedClients++
		}
	}
	sort.Ints(attempts)
	hints := st.sortedHints()
	fmt.Fprintf(out, "clients: refused %d times (%d clients refused at least once), retried %d, attempts per client p50 %d p99 %d max %d\n",
		st.refused.Load(), refusedClients, st.retried.Load(), attempts[len(attempts)/2], attempts[len(attempts)*99/100], attempts[len(attempts)-1])
	if len(hints) > 0 {
		fmt.Fprintf(out, "retry hints: p10 %v p50 %v p90 %v p99 %v max %v\n", measure.FmtDur(measure.Percentile(hints, .1)), measure.FmtDur(measure.Percentile(hints, .5)),
			measure.FmtDur(measure.Percentile(hints, .9)), measure.FmtDur(measure.Percentile(hints, .99)), measure.FmtDur(hints[len(hints)-1]))
	}
	r.reportPopulations()
	r.reportStore(nodes, conv, cpu, overStorm)
}

// reportPopulations compares the clients that honour the retry hint with
// those that resend every --greedy-every (with --greedy > 0): the time
// from a client's first attempt to the one admitted, and its attempts.
func (r *reconnectRun) reportPopulations() {
	if r.o.Greedy <= 0 {
		return
	}
	for _, greedy := range []bool{false, true} {
		var waits []time.Duration
		var attempts []int
		for _, c := range r.clients {
			if c.greedy != greedy || c.admitted.Load() == 0 {
				continue
			}
			waits = append(waits, time.Unix(0, c.admitted.Load()).Sub(c.first))
			attempts = append(attempts, int(c.attempts.Load()))
		}
		if len(waits) == 0 {
			continue
		}
		slices.Sort(waits)
		sort.Ints(attempts)
		name := "honouring the hint"
		if greedy {
			name = fmt.Sprintf("resending every %v", r.o.GreedyEvery)
		}
		fmt.Fprintf(r.out, "clients %s (%d, fair %t): first attempt -> admitted p50 %v p90 %v p99 %v max %v; attempts p50 %d max %d\n",
			name, len(waits), r.o.Fair, measure.FmtDur(measure.Percentile(waits, .5)), measure.FmtDur(measure.Percentile(waits, .9)), measure.FmtDur(measure.Percentile(waits, .99)),
			measure.FmtDur(waits[len(waits)-1]), attempts[len(attempts)/2], attempts[len(attempts)-1])
	}
}

func (r *reconnectRun) reportStore(nodes []*standIn, conv time.Duration, cpu []float64, overStorm int64) {
	st := &r.stats
	out := r.out
	calls := max(st.claimCalls.Load(), 1)
	fmt.Fprintf(out, "claims: %d admitted in %d calls (mean %v), %d failed calls\n", st.admitted.Load(), st.claimCalls.Load(),
		measure.FmtDur(time.Duration(st.claimNanos.Load()/calls)), st.claimErrs.Load())
	var sent, ext int64
	var rates []string
	for _, n := range nodes {
		if n.extended != nil {
			sent += n.extended.sent.Load()
			ext += n.extended.extended.Load()
		}
		if n.lim != nil {
			rates = append(rates, fmt.Sprintf("%.0f", n.lim.Rate()))
		}
	}
	fmt.Fprintf(out, "extend: %d sessions sent, %d found and extended; join rates at the end %s\n", sent, ext, strings.Join(rates, " "))
	fmt.Fprintf(out, "heartbeat: %d sessions refreshed; ticks over their period %d during the storm, %d after; longest tick %v\n",
		st.refreshed.Load(), overStorm, st.tickOver.Load()-overStorm, measure.FmtDur(time.Duration(st.tickMax.Load())))
	n := min(len(cpu), int(conv/time.Second)+1)
	mean := func(xs []float64) float64 {
		s := 0.0
		for _, x := range xs {
			s += x
		}
		return s / float64(max(len(xs), 1))
	}
	peak := 0.0
	for _, x := range cpu {
		peak = max(peak, x)
	}
	fmt.Fprintf(out, "redis cpu: %.0f %% of a core over the storm (%d s), %.0f %% after it, peak second %.0f %%\n",
		100*mean(cpu[:n]), n, 100*mean(cpu[n:]), 100*peak)
	var b strings.Builder
	for i := 0; i < len(cpu); i += 10 {
		fmt.Fprintf(&b, " %.0f", 100*mean(cpu[i:min(i+10, len(cpu))]))
	}
	fmt.Fprintf(out, "redis cpu %% by 10 s:%s\n", b.String())
}

func fmtKinds(m map[string]int) string {
	if len(m) == 0 {
		return "(none)"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

package oracle

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// Report is the verdict on one run.
type Report struct {
	Seed   int64
	Timing Timing
	Ops    map[string]int
	// Transitions counts the stream's events by "kind/reason".
	Transitions map[string]int
	Violations  []Violation // in time order
	Counts      map[Class]int
	// Ambiguous counts the cases judged leniently, by why, with a few
	// examples of each.
	Ambiguous map[string]int
	Examples  map[string][]string
	// Departure latencies, from the clean close (or leave, or reset) and
	// from the kill, to the offline's arrival at the core subscriber.
	LatencyLeft, LatencyKilled []time.Duration
	Resyncs                    int
	Lag                        []time.Duration
	Notes                      []string
}

func newReport(r *Run) *Report {
	ops := map[string]int{}
	for k, v := range r.Ops {
		ops[k] = v
	}
	return &Report{Seed: r.Seed, Timing: r.Timing, Ops: ops, Transitions: map[string]int{}, Counts: map[Class]int{}, Ambiguous: map[string]int{}, Examples: map[string][]string{}, Lag: r.Lag}
}

func (r *Report) add(v Violation) {
	r.Violations = append(r.Violations, v)
	r.Counts[v.Class]++
}

func (r *Report) ambiguous(why string, key Key, what string) {
	r.Ambiguous[why]++
	if len(r.Examples[why]) < 3 {
		r.Examples[why] = append(r.Examples[why], key.String()+": "+what)
	}
}

func (r *Report) finish() {
	sort.SliceStable(r.Violations, func(i, j int) bool { return r.Violations[i].At < r.Violations[j].At })
}

// Failed reports whether any class that is not informational has a
// violation.
func (r *Report) Failed() bool {
	return len(r.Failures()) > 0
}

// Failures returns the violations of the classes that fail a run.
func (r *Report) Failures() []Violation {
	var out []Violation
	for _, v := range r.Violations {
		if !v.Class.Informational() {
			out = append(out, v)
		}
	}
	return out
}

// Percentiles returns p50, p90, p99 and the maximum of ds.
func Percentiles(ds []time.Duration) (p50, p90, p99, most time.Duration) {
	if len(ds) == 0 {
		return
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(q float64) time.Duration { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return at(0.50), at(0.90), at(0.99), s[len(s)-1]
}

func fmtLatency(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	p50, p90, p99, most := Percentiles(ds)
	return fmt.Sprintf("n=%d p50=%v p90=%v p99=%v max=%v", len(ds), p50.Round(time.Millisecond), p90.Round(time.Millisecond),
		p99.Round(time.Millisecond), most.Round(time.Millisecond))
}

func fmtCounts(m map[string]int) string {
	var parts []string
	total := 0
	for _, k := range sortedKeys(m) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
		total += m[k]
	}
	return fmt.Sprintf("%d (%s)", total, strings.Join(parts, " "))
}

// String is the report's summary: every class is printed, even at zero.
func (r *Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "oracle seed %d (%s)\n", r.Seed, r.Timing)
	fmt.Fprintf(&b, "  operations: %s\n", fmtCounts(r.Ops))
	fmt.Fprintf(&b, "  transitions: %s\n", fmtCounts(r.Transitions))
	fmt.Fprintf(&b, "  violations:\n")
	for _, c := range Classes {
		info := ""
		if c.Informational() {
			info = " (informational)"
		}
		fmt.Fprintf(&b, "    %-52s %d%s\n", c, r.Counts[c], info)
	}
	if m := byMinute(r.Failures()); m != "" {
		fmt.Fprintf(&b, "  failing violations by minute of the run: %s\n", m)
	}
	fmt.Fprintf(&b, "  ambiguous cases judged leniently: %s\n", fmtCounts(r.Ambiguous))
	fmt.Fprintf(&b, "  latency clean close -> offline left: %s\n", fmtLatency(r.LatencyLeft))
	fmt.Fprintf(&b, "  latency kill -> offline expired:     %s\n", fmtLatency(r.LatencyKilled))
	fmt.Fprintf(&b, "  resync snapshots: %d (spurious: %d)\n", r.Resyncs, r.Counts[C9Spurious])
	fmt.Fprintf(&b, "  harness lag behind the plan: %s\n", fmtLatency(r.Lag))
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "  note: %s\n", n)
	}
	return b.String()
}

// Details prints the first n violations that fail the run, each with the
// holds and events of its (room, user) around it, then up to n of the
// informational ones without context.
func (r *Report) Details(run *Run, n int) string {
	var b strings.Builder
	fails := r.Failures()
	if len(fails) > 0 {
		fmt.Fprintf(&b, "seed %d: first %d of %d violations:\n", r.Seed, min(n, len(fails)), len(fails))
	}
	for i, v := range fails {
		if i == n {
			break
		}
		fmt.Fprintf(&b, "%s\n", v)
		for _, l := range Context(run, v, 8*time.Second) {
			fmt.Fprintf(&b, "%s\n", l)
		}
	}
	for _, why := range sortedKeys(r.Examples) {
		fmt.Fprintf(&b, "ambiguous, %s (%d), e.g.:\n", why, r.Ambiguous[why])
		for _, ex := range r.Examples[why] {
			fmt.Fprintf(&b, "  %s\n", ex)
		}
	}
	k := 0
	for _, v := range r.Violations {
		if v.Class.Informational() && k < n {
			if k == 0 {
				fmt.Fprintf(&b, "informational:\n")
			}
			fmt.Fprintf(&b, "%s\n", v)
			k++
		}
	}
	return b.String()
}

// byMinute counts vs by the minute of the run they fall in ("0:12 5:3"),
// so a run whose failures bunch up while the machine was loaded (the
// harness lag says when it fell behind) can be told from one whose
// failures are spread evenly.
func byMinute(vs []Violation) string {
	n := map[int]int{}
	for _, v := range vs {
		n[int(v.At/time.Minute)]++
	}
	mins := make([]int, 0, len(n))
	for m := range n {
		mins = append(mins, m)
	}
	slices.Sort(mins)
	parts := make([]string, len(mins))
	for i, m := range mins {
		parts[i] = fmt.Sprintf("%d:%d", m, n[m])
	}
	return strings.Join(parts, " ")
}

package centrifugo

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/presence-dev/presence/cmd/presence-load/internal/churn"
	"github.com/presence-dev/presence/cmd/presence-load/internal/cli"
	"github.com/presence-dev/presence/cmd/presence-load/internal/load"
	"github.com/presence-dev/presence/cmd/presence-load/internal/measure"
)

// The side by side of scripts/load.sh versus: Centrifugo measured the way
// the idle and latency modes measure a node (cf-idle, cf-latency), each
// printing the same lines, and the versus mode reading the four logs into
// one table.
//
//   - cf-idle: --sessions connections, each connected with its own HS256
//     token and subscribed with "join_leave":true to one of the channels of
//     --per-room; Centrifugo's RSS (/proc/PID/status) before and after, its
//     CPU over the hold after a settle, as idle reads a node's.
//   - cf-latency: one observer per channel of 50 (join_leave), --rate
//     subscribes a second for --duration on an absolute schedule, from
//     connections connected beforehand; each join push at its channel's
//     observer is timed from the subscribe. The joiners subscribe with
//     join_leave too (--cf-join-leave), so each gets the later joins of
//     its channel, as a node's joiners get their room's later onlines in
//     latency: both servers write the same frames. With --cf-presence each
//     joiner also asks for its channel's presence in its subscribe's
//     frame, as a client that lists who is in the room must: the reading,
//     encoding and sending of the member list that a node's join does for
//     its snapshot; the reply is timed from the subscribe, like latency's
//     own snapshot reply.

// cfClient is one Centrifugo connection: a reader that answers pings and
// hands replies and join pushes on.
type cfClient struct {
	load.Conn
	replies chan cfMsg
	onJoin  func(channel, user string, at time.Time)
	onReply func(m cfMsg, at time.Time) // every reply, if set
}

func (c *cfClient) read() {
	defer close(c.replies)
	for {
		_, data, err := c.WS.ReadMessage()
		if err != nil {
			return
		}
		at := time.Now()
		cfLines(data, func(line []byte) { c.line(line, at) })
	}
}

func (c *cfClient) line(line []byte, at time.Time) {
	switch cfClassify(line) {
	case cfPing:
		_ = c.Send([]byte("{}"))
	case cfJoin:
		if c.onJoin != nil {
			if _, ch, user, err := cfJoinLeave(line); err == nil {
				c.onJoin(ch, user, at)
			}
		}
	case cfReply, cfErrReply:
		var m cfMsg
		if json.Unmarshal(line, &m) == nil {
			if c.onReply != nil {
				c.onReply(m, at)
			}
			select {
			case c.replies <- m:
			default:
			}
		}
	}
}

// cfOpenClient connects as user and, unless channel is empty, subscribes.
// onReply, if set, sees every reply, the connect's first.
func cfOpenClient(ctx context.Context, d *load.Dialer, secret, user, channel string, joinLeave bool, onJoin func(string, string, time.Time), onReply func(cfMsg, time.Time)) (*cfClient, error) {
	ws, err := cfDial(ctx, d)
	if err != nil {
		return nil, err
	}
	c := &cfClient{Conn: load.Conn{WS: ws}, replies: make(chan cfMsg, 4), onJoin: onJoin, onReply: onReply}
	go c.read()
	fail := func(err error) (*cfClient, error) { ws.Close(); return nil, err }
	tok, err := load.SignToken(secret, user, false)
	if err != nil {
		return fail(err)
	}
	if err := c.Send(cfConnectCmd(1, tok)); err != nil {
		return fail(err)
	}
	if _, err := cfAwait(c.replies, 1, 60*time.Second); err != nil {
		return fail(fmt.Errorf("connect: %w", err))
	}
	if channel == "" {
		return c, nil
	}
	if err := c.Send(cfSubscribeCmd(2, channel, joinLeave)); err != nil {
		return fail(err)
	}
	if _, err := cfAwait(c.replies, 2, 60*time.Second); err != nil {
		return fail(fmt.Errorf("subscribe: %w", err))
	}
	return c, nil
}

// cfPresenceID is the id of a joiner's presence request.
const cfPresenceID = 3

// cfListsUser reports whether a presence reply lists user.
func cfListsUser(p map[string]cfInfo, user string) bool {
	for _, in := range p {
		if in.User == user {
			return true
		}
	}
	return false
}

// cfOpenMany opens n clients, 64 at a time; open makes client i. It
// returns them (nil where one failed), the failures and the first error.
func cfOpenMany(n int, open func(i int) (*cfClient, error)) ([]*cfClient, int, error) {
	cs := make([]*cfClient, n)
	t := load.OpenEach(context.Background(), n, 64, func(i int) error {
		c, err := open(i)
		cs[i] = c
		return err
	})
	var err error
	if t.FirstErr != "" {
		err = errors.New(t.FirstErr)
	}
	return cs, t.Failed, err
}

func cfCloseAll(cs []*cfClient) {
	for _, c := range cs {
		if c != nil {
			c.WS.Close()
		}
	}
}

// Idle is the cf-idle mode: Centrifugo's RSS and CPU (pid) with
// --sessions idle subscribers.
func Idle(ctx context.Context, o load.Options, pid int, out io.Writer) error {
	if pid <= 0 {
		return errors.New("cf-idle: --node-pid (Centrifugo's) is required")
	}
	d, err := load.NewDialer(o)
	if err != nil {
		return err
	}
	rss0, err := measure.RSSOf(pid)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "centrifugo RSS before: %.1f MiB\n", rss0/(1<<20))
	run := rand.Uint32()
	start := time.Now()
	cs, failed, first := cfOpenMany(o.Sessions, func(i int) (*cfClient, error) {
		return cfOpenClient(ctx, d, o.Secret, fmt.Sprintf("u%d-%d", run, i), fmt.Sprintf("load%d-%d", run, i/o.PerRoom), true, nil, nil)
	})
	defer cfCloseAll(cs)
	open := o.Sessions - failed
	fmt.Fprintf(out, "opened %d sessions in %v (%d failed; first error: %v)\n", open, time.Since(start).Round(time.Millisecond), failed, first)
	if open == 0 {
		return errors.New("no session opened")
	}
	settle := min(o.Hold/3, 20*time.Second)
	if !load.SleepCtx(ctx, settle) {
		return ctx.Err()
	}
	cpu0, err := measure.ProcCPU(pid)
	if err != nil {
		return err
	}
	t0 := time.Now()
	if !load.SleepCtx(ctx, o.Hold-settle) {
		return ctx.Err()
	}
	cpu1, err := measure.ProcCPU(pid)
	if err != nil {
		return err
	}
	window := time.Since(t0)
	rss1, err := measure.RSSOf(pid)
	if err != nil {
		return err
	}
	pct := (cpu1 - cpu0) / window.Seconds() * 100
	fmt.Fprintf(out, "node RSS with %d sessions: %.1f MiB; per session: %.1f KiB\n", open, rss1/(1<<20), (rss1-rss0)/float64(open)/1024)
	fmt.Fprintf(out, "CPU per 10k sessions, %% of one core: node %.2f%% (Centrifugo, /proc/%d/stat over %.0fs)\n", pct*10000/float64(open), pid, window.Seconds())
	if failed > 0 {
		return fmt.Errorf("FAIL: %d of %d sessions failed to open", failed, o.Sessions)
	}
	return nil
}

// Latency is the cf-latency mode: join pushes timed at an observer per
// channel, and the CPU over the joins as latency reads a node's:
// Centrifugo's (pid, when given), Redis's (--redis), the machine's, this
// tool's and what the hypervisor took.
func Latency(ctx context.Context, o load.Options, pid int, out io.Writer) error {
	d, err := load.NewDialer(o)
	if err != nil {
		return err
	}
	meters, err := cfMeters(o, pid)
	if err != nil {
		return err
	}
	joins := int(o.Rate * o.Duration.Seconds())
	const perChannel = 50
	channels := (joins + perChannel - 1) / perChannel
	tm := newCfTimings(rand.Uint32(), joins, o.CFPresence)
	run, user := tm.run, tm.user
	channel := func(i int) string { return fmt.Sprintf("lat%d-%d", run, i) }
	joinCmd := func(ch string) []byte {
		sub := cfSubscribeCmd(2, ch, o.CFJoinLeave)
		if !o.CFPresence {
			return sub
		}
		return slices.Concat(sub, []byte("\n"), cfPresenceCmd(cfPresenceID, ch))
	}
	start := time.Now()
	obs, failedO, errO := cfOpenMany(channels, func(i int) (*cfClient, error) {
		return cfOpenClient(ctx, d, o.Secret, fmt.Sprintf("w%d-%d", run, i), channel(i), true, tm.onJoin, nil)
	})
	defer cfCloseAll(obs)
	js, failedJ, errJ := cfOpenMany(joins, func(i int) (*cfClient, error) {
		return cfOpenClient(ctx, d, o.Secret, user(i), "", false, nil, tm.onReply(i))
	})
	defer cfCloseAll(js)
	if failedO+failedJ > 0 {
		return fmt.Errorf("FAIL: %d observers and %d joiners failed to open (%v; %v)", failedO, failedJ, errO, errJ)
	}
	fmt.Fprintf(out, "%d joins at %.0f/s over %v into %d channels of %d, each with an observer; joiners with join_leave: %v, reading presence: %v; connections opened in %v\n",
		joins, o.Rate, o.Duration, channels, perChannel, o.CFJoinLeave, o.CFPresence, time.Since(start).Round(time.Millisecond))
	var writeErr error
	cpu0, began := measure.ReadMeters(meters), time.Now()
	sctx, stop := context.WithCancel(ctx)
	churn.Pacer{Rate: o.Rate}.Run(sctx, len(js), func(i int, _ time.Time) {
		tm.sent[i].Store(time.Now().UnixNano())
		if err := js[i].Send(joinCmd(channel(i / perChannel))); err != nil {
			writeErr = fmt.Errorf("subscribe %s: %w", user(i), err)
			stop()
		}
	})
	stop()
	if err := cmp.Or(writeErr, ctx.Err()); err != nil {
		return err
	}
	waitFor := time.Now().Add(o.Straggle)
	for time.Now().Before(waitFor) && tm.pending() {
		if !load.SleepCtx(ctx, 50*time.Millisecond) {
			return ctx.Err()
		}
	}
	window := time.Since(began)
	cpu := measure.Delta(cpu0, measure.ReadMeters(meters))
	missing, replyMissing := tm.report(out)
	fmt.Fprintf(out, "CPU over the joins and the wait (%v), %% of one core: %s\n", window.Round(time.Millisecond), measure.FmtCPU(cpu, window))
	if missing > 0 {
		return fmt.Errorf("FAIL: %d join pushes missing", missing)
	}
	if replyMissing > 0 {
		return fmt.Errorf("FAIL: %d presence replies missing or without the joiner (%d refused)", replyMissing, tm.refused.Load())
	}
	return nil
}

// cfTimings are a cf-latency run's times per joiner: when its subscribe
// was sent (unix ns), and the ns from then to its join push at the
// channel's observer and (with --cf-presence) to the reply to its
// presence request, if the reply lists it.
type cfTimings struct {
	run                  uint32
	presence             bool
	sent, seen, answered []atomic.Int64
	refused              atomic.Int64 // presence replies with an error or without the joiner
}

func newCfTimings(run uint32, joins int, presence bool) *cfTimings {
	return &cfTimings{run: run, presence: presence, sent: make([]atomic.Int64, joins),
		seen: make([]atomic.Int64, joins), answered: make([]atomic.Int64, joins)}
}

func (t *cfTimings) user(i int) string { return fmt.Sprintf("j%d-%d", t.run, i) }

// onJoin times a join push seen at an observer.
func (t *cfTimings) onJoin(_, u string, at time.Time) {
	i, ok := strings.CutPrefix(u, fmt.Sprintf("j%d-", t.run))
	if n, err := strconv.Atoi(i); ok && err == nil && n >= 0 && n < len(t.seen) {
		if s := t.sent[n].Load(); s > 0 {
			t.seen[n].CompareAndSwap(0, at.UnixNano()-s)
		}
	}
}

// onReply is joiner i's reply hook: it times the presence reply (nil
// without --cf-presence).
func (t *cfTimings) onReply(i int) func(cfMsg, time.Time) {
	if !t.presence {
		return nil
	}
	return func(m cfMsg, at time.Time) {
		if m.ID != cfPresenceID {
			return
		}
		if m.Error != nil || m.Presence == nil || !cfListsUser(m.Presence.Presence, t.user(i)) {
			t.refused.Add(1)
			return
		}
		if s := t.sent[i].Load(); s > 0 {
			t.answered[i].CompareAndSwap(0, at.UnixNano()-s)
		}
	}
}

// pending reports whether a push, or a presence reply, is still due.
func (t *cfTimings) pending() bool {
	for i := range t.seen {
		if t.seen[i].Load() == 0 || t.presence && t.answered[i].Load() == 0 {
			return true
		}
	}
	return false
}

// report prints the pushes' percentiles and, with --cf-presence, the
// replies'; it returns how many of each are missing.
func (t *cfTimings) report(out io.Writer) (missing, replyMissing int) {
	line := func(what string, lat []time.Duration, missing int, extra string) {
		fmt.Fprintf(out, "join -> %-22s p50 %-8s p90 %-8s p99 %-8s max %-8s seen %d/%d  missing %d%s\n", what,
			measure.FmtDur(measure.Percentile(lat, .50)), measure.FmtDur(measure.Percentile(lat, .90)), measure.FmtDur(measure.Percentile(lat, .99)),
			measure.FmtDur(measure.Percentile(lat, 1)), len(lat)-missing, len(lat), missing, extra)
	}
	lat, missing := rankSeen(t.seen)
	line("online on WebSocket:", lat, missing, "")
	if t.presence {
		var rlat []time.Duration
		rlat, replyMissing = rankSeen(t.answered)
		line("own presence reply:", rlat, replyMissing, fmt.Sprintf("  refused %d", t.refused.Load()))
	}
	return missing, replyMissing
}

// cfMeters are cf-latency's CPU meters.
func cfMeters(o load.Options, pid int) ([]measure.Meter, error) {
	var ms []measure.Meter
	if pid > 0 {
		if _, err := measure.ProcCPU(pid); err != nil {
			return nil, fmt.Errorf("--node-pid: %w", err)
		}
		ms = append(ms, measure.ProcMeter("centrifugo", pid))
	}
	if o.Redis != "" {
		if _, err := measure.RedisCPU(o.Redis); err != nil {
			return nil, fmt.Errorf("--redis: %w", err)
		}
		ms = append(ms, measure.Meter{Name: "redis", Source: "INFO cpu used_cpu_sys+used_cpu_user", Read: func() (float64, error) { return measure.RedisCPU(o.Redis) }})
	}
	return append(ms, measure.MachineMeter(), measure.StealMeter(), measure.SelfMeter()), nil
}

// rankSeen sorts the latencies seen (ns, 0 for a push never seen), each
// push never seen ranked as never, as latency ranks a node's missing
// events, so that percentile reads both sides by the same rule.
func rankSeen(seen []atomic.Int64) (lat []time.Duration, missing int) {
	lat = make([]time.Duration, len(seen))
	for i := range seen {
		if lat[i] = time.Duration(seen[i].Load()); lat[i] == 0 {
			lat[i] = measure.Never
			missing++
		}
	}
	slices.Sort(lat)
	return lat, missing
}

// The versus mode's table.

// sideFigures are one side's figures, read from its logs; a figure not
// found is negative.
type sideFigures struct {
	p50, p99  time.Duration
	rssKiB    float64
	cpuPer10k float64
	sessions  int
	// The machine's CPU, and the hypervisor's steal, over the joins, in
	// % of one core.
	machine, steal float64
}

var (
	reWSLine   = regexp.MustCompile(`join -> online on WebSocket:\s+p50 (\S+)\s+p90 \S+\s+p99 (\S+)`)
	reRSS      = regexp.MustCompile(`node RSS with (\d+) sessions: [\d.]+ MiB; per session: ([\d.]+) KiB`)
	reCPU      = regexp.MustCompile(`CPU per 10k sessions, % of one core: node ([\d.]+)%`)
	reJoinsCPU = regexp.MustCompile(`^CPU over the joins and the wait .*whole machine ([\d.]+)%`)
	reSteal    = regexp.MustCompile(`stolen by the hypervisor ([\d.]+)%`)
)

// parseFigures reads an idle log and a latency log.
func parseFigures(idleLog, latencyLog string) sideFigures {
	f := sideFigures{p50: -1, p99: -1, rssKiB: -1, cpuPer10k: -1, machine: -1, steal: -1}
	if m := reRSS.FindStringSubmatch(idleLog); m != nil {
		f.sessions, _ = strconv.Atoi(m[1])
		f.rssKiB, _ = strconv.ParseFloat(m[2], 64)
	}
	if m := reCPU.FindStringSubmatch(idleLog); m != nil {
		f.cpuPer10k, _ = strconv.ParseFloat(m[1], 64)
	}
	if m := reWSLine.FindStringSubmatch(latencyLog); m != nil {
		f.p50, _ = parseFmtDur(m[1])
		f.p99, _ = parseFmtDur(m[2])
	}
	for _, line := range strings.Split(latencyLog, "\n") {
		if m := reJoinsCPU.FindStringSubmatch(line); m != nil {
			f.machine, _ = strconv.ParseFloat(m[1], 64)
			if m := reSteal.FindStringSubmatch(line); m != nil {
				f.steal, _ = strconv.ParseFloat(m[1], 64)
			}
		}
	}
	return f
}

// parseFmtDur reads what fmtDur writes.
func parseFmtDur(s string) (time.Duration, error) {
	if s == "never" {
		return -1, nil
	}
	return time.ParseDuration(s)
}

// stealUnit marks the steal row: a disturbance, not a figure to compare.
const stealUnit = " % "

// versusTable is the side by side, Markdown: a row per figure, the
// ratio presence / Centrifugo (below 1: presence is ahead). Each side's
// latency runs (interleaved repetitions) are given in a cell together,
// the ratio then of their medians; the idle figures are cf[0]'s and
// pr[0]'s. cfp, if it has figures, are Centrifugo's runs with joiners
// reading presence (cf-latency --cf-presence): the same work per join as
// a node's join with its snapshot, in rows of their own.
func versusTable(cf, cfp, pr []sideFigures, rate float64) string {
	var b strings.Builder
	b.WriteString("| | Centrifugo | presence | ratio |\n|---|---|---|---|\n")
	row := func(name string, c, p []float64, unit string) {
		cell := func(vs []float64) string {
			parts := make([]string, len(vs))
			for i, v := range vs {
				parts[i] = "n/a"
				if v >= 0 {
					parts[i] = strconv.FormatFloat(v, 'f', 2, 64)
				}
			}
			if len(vs) == 1 && vs[0] < 0 {
				return "n/a"
			}
			return strings.Join(parts, " / ") + strings.TrimRight(unit, " ")
		}
		ratio := "n/a"
		if mc, mp := median(c), median(p); mc > 0 && mp >= 0 && unit != stealUnit {
			ratio = strconv.FormatFloat(mp/mc, 'f', 2, 64) + "×"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", name, cell(c), cell(p), ratio)
	}
	r := strconv.FormatFloat(rate, 'f', -1, 64)
	row("join → event at an observer WebSocket, "+r+" joins/s, p50", each(cf, p50ms), each(pr, p50ms), " ms")
	row("same, p99", each(cf, p99ms), each(pr, p99ms), " ms")
	row("whole machine's CPU over the joins, % of one core", each(cf, machineOf), each(pr, machineOf), " %")
	row("of it taken by the hypervisor (steal; high: a disturbed run)", each(cf, stealOf), each(pr, stealOf), stealUnit)
	if len(cfp) > 0 && (cfp[0].p50 >= 0 || cfp[0].p99 >= 0) {
		row("the same with Centrifugo's joiners also reading presence (a join's snapshot), p50", each(cfp, p50ms), each(pr, p50ms), " ms")
		row("same, p99", each(cfp, p99ms), each(pr, p99ms), " ms")
		row("whole machine's CPU over those joins, % of one core", each(cfp, machineOf), each(pr, machineOf), " %")
	}
	c0, p0 := first(cf), first(pr)
	row(fmt.Sprintf("RSS per idle WebSocket session, %s JWT clients", sessionsLabel(c0, p0)), []float64{c0.rssKiB}, []float64{p0.rssKiB}, " KiB")
	row("node CPU per 10k idle sessions", []float64{c0.cpuPer10k}, []float64{p0.cpuPer10k}, " %")
	if n := max(len(cf), len(pr)); n > 1 {
		fmt.Fprintf(&b, "\n(latency: %d interleaved runs a side, in the order run; ratios of the medians, none where a run lacks the figure)\n", n)
	}
	return b.String()
}

func each(fs []sideFigures, f func(sideFigures) float64) []float64 {
	if len(fs) == 0 {
		return []float64{-1}
	}
	out := make([]float64, len(fs))
	for i, x := range fs {
		out[i] = f(x)
	}
	return out
}

func first(fs []sideFigures) sideFigures {
	if len(fs) == 0 {
		return parseFigures("", "")
	}
	return fs[0]
}

func durMs(d time.Duration) float64 {
	if d < 0 {
		return -1
	}
	return float64(d) / float64(time.Millisecond)
}

func p50ms(f sideFigures) float64     { return durMs(f.p50) }
func p99ms(f sideFigures) float64     { return durMs(f.p99) }
func machineOf(f sideFigures) float64 { return f.machine }
func stealOf(f sideFigures) float64   { return f.steal }

// median is the median of vs; of an even number, the mean of the middle
// two. It is -1 (no ratio) if any figure is missing: a run without one (a
// push never seen reads as never) must not drop out and leave the ratio
// of the runs that went well.
func median(vs []float64) float64 {
	if len(vs) == 0 || slices.ContainsFunc(vs, func(v float64) bool { return v < 0 }) {
		return -1
	}
	sorted := slices.Sorted(slices.Values(vs))
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

func sessionsLabel(cf, pr sideFigures) string {
	if cf.sessions == pr.sessions && cf.sessions > 0 {
		return groupThousands(cf.sessions)
	}
	return groupThousands(cf.sessions) + " / " + groupThousands(pr.sessions)
}

func groupThousands(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// Versus prints the table from the logs named by its flags; the latency
// flags take a comma-separated list, one log per repetition.
func Versus(args []string, out io.Writer) error {
	var o struct {
		CfIdle    string  `flag:"cf-idle" help:"log of cf-idle"`
		CfLatency string  `flag:"cf-latency" help:"logs of cf-latency, comma-separated, in the order run"`
		CfPresent string  `flag:"cf-latency-presence" help:"logs of cf-latency --cf-presence, comma-separated (optional: rows of their own)"`
		Idle      string  `flag:"idle" help:"log of idle against the node"`
		Latency   string  `flag:"latency" help:"logs of latency against the node, comma-separated, in the order run"`
		Rate      float64 `flag:"rate" default:"1000" help:"the join rate of the latency runs"`
	}
	if _, err := cli.Parse("versus", args, &o); err != nil {
		return err
	}
	if o.CfIdle == "" || o.CfLatency == "" || o.Idle == "" || o.Latency == "" {
		return errors.New("versus: --cf-idle, --cf-latency, --idle and --latency are all required")
	}
	read := func(p string) (string, error) {
		b, err := os.ReadFile(p) // #nosec G304 -- a log path the caller gave
		return string(b), err
	}
	// side reads an idle log (none: "") and latency logs into figures.
	side := func(idle, latencies string) ([]sideFigures, error) {
		if latencies == "" {
			return nil, nil
		}
		il := ""
		if idle != "" {
			var err error
			if il, err = read(idle); err != nil {
				return nil, err
			}
		}
		var fs []sideFigures
		for i, p := range strings.Split(latencies, ",") {
			ll, err := read(p)
			if err != nil {
				return nil, err
			}
			if i > 0 {
				il = ""
			}
			fs = append(fs, parseFigures(il, ll))
		}
		return fs, nil
	}
	cf, err := side(o.CfIdle, o.CfLatency)
	if err != nil {
		return err
	}
	cfp, err := side("", o.CfPresent)
	if err != nil {
		return err
	}
	pr, err := side(o.Idle, o.Latency)
	if err != nil {
		return err
	}
	fmt.Fprint(out, versusTable(cf, cfp, pr, o.Rate))
	return nil
}

package latency

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"github.com/nats-io/nats.go"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/cmd/presence-load/internal/churn"
	"github.com/presence-dev/presence/cmd/presence-load/internal/load"
	"github.com/presence-dev/presence/cmd/presence-load/internal/measure"
	"github.com/presence-dev/presence/protocol"
)

// wsConn is one WebSocket of a run. Writes are serialised: a retry may be
// sent from a timer while the schedule is still sending.
type wsConn struct {
	load.Conn
	user string
	room string
}

// router hands each NATS event to the ledger of the run its user belongs
// to: user ids are "<run prefix>-<n>", and the prefix names the run.
type router struct {
	mu      sync.RWMutex
	ledgers map[string]*ledger
	bad     atomic.Int64 // messages of our runs that did not decode
}

func (rt *router) add(prefix string, l *ledger) {
	rt.mu.Lock()
	rt.ledgers[prefix] = l
	rt.mu.Unlock()
}

func (rt *router) remove(prefix string) {
	rt.mu.Lock()
	delete(rt.ledgers, prefix)
	rt.mu.Unlock()
}

func (rt *router) handle(m *nats.Msg) {
	at := time.Now()
	_, _, kind, user, err := bus.ParseSubject(m.Subject)
	if err != nil {
		return
	}
	i := strings.IndexByte(user, '-')
	if i < 0 {
		return
	}
	rt.mu.RLock()
	l := rt.ledgers[user[:i+1]]
	rt.mu.RUnlock()
	if l == nil {
		return
	}
	// The body must agree with the subject.
	t, err := bus.DecodeEvent(m.Data)
	if err != nil || t.User != user || t.Kind != kind {
		rt.bad.Add(1)
		return
	}
	l.natsEvent(kind, user, at)
}

// latencyEnv is what every run of a process shares: the dialer, the NATS
// subscription, the CPU meters.
type latencyEnv struct {
	o      load.Options
	d      *load.Dialer
	nc     *nats.Conn
	sub    *nats.Subscription
	rt     *router
	runID  uint32
	meters []measure.Meter
	hog    *hogProcess
}

// newLatencyEnv sets up what every latency run uses: the dialer, the NATS
// subscriber of the region, the meters, the hog if asked, and the node's
// connections before this tool opened any.
func newLatencyEnv(ctx context.Context, o load.Options) (*latencyEnv, func(), error) {
	d, err := load.NewDialer(o)
	if err != nil {
		return nil, nil, err
	}
	if o.BaseConns, err = nodeConns(o.Metrics); err != nil {
		return nil, nil, err
	}
	nc, err := nats.Connect(o.NatsURL)
	if err != nil {
		return nil, nil, err
	}
	rt := &router{ledgers: map[string]*ledger{}}
	sub, err := nc.Subscribe(bus.RegionFilter(o.Region), rt.handle)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	// No pending limit: a dropped message would read as a missing event.
	// sub.Dropped() is still checked at the end of every run.
	_ = sub.SetPendingLimits(-1, -1)
	if err := nc.Flush(); err != nil {
		nc.Close()
		return nil, nil, err
	}
	meters, err := load.NewMeters(o, true)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	env := &latencyEnv{o: o, d: d, nc: nc, sub: sub, rt: rt, runID: rand.Uint32(), meters: meters}
	if o.Hog > 0 {
		h, err := startHog(ctx, o.Hog)
		if err != nil {
			nc.Close()
			return nil, nil, err
		}
		env.hog = h
		env.meters = append(env.meters, h.meter())
	}
	return env, func() {
		if env.hog != nil {
			env.hog.stop()
		}
		nc.Close()
	}, nil
}

// stepPlan is one latency run: joins at rate, in rooms of perRoom, each
// room with one watcher.
type stepPlan struct {
	index    int
	rate     float64
	joins    int
	perRoom  int
	capped   bool // joins were cut to keep the connections under the cap
	duration time.Duration
}

func (e *latencyEnv) plan(index int, rate float64) stepPlan {
	p := stepPlan{index: index, rate: rate, perRoom: e.o.PerRoom, joins: int(rate * e.o.Duration.Seconds())}
	// One connection per join plus one watcher per room must fit under
	// the cap (itself under the open-files limit of this process and the
	// node's connection limit).
	if rooms := (p.joins + p.perRoom - 1) / p.perRoom; p.joins+rooms > e.o.MaxConns {
		p.joins = e.o.MaxConns * p.perRoom / (p.perRoom + 1)
		p.capped = true
	}
	p.duration = time.Duration(float64(p.joins) / rate * float64(time.Second))
	return p
}

// stepResult is what a run measured.
type stepResult struct {
	plan                   stepPlan
	sum                    summary
	sent                   int
	achieved               float64
	maxLag                 time.Duration
	straggle               time.Duration
	connFailed             int
	connErr                error
	cpu                    []measure.Reading
	window                 time.Duration
	resyncs, rejected      float64 // node metrics deltas
	natsDropped            int
	natsBad                int64
	openTook               time.Duration
	pendingReply           int
	pendingNATS, pendingWS int
	writeErrs              int
	quiet                  time.Duration                // how long the node took to go quiet after the run (sweep)
	notQuiet               string                       // why the node was not quiet when the wait ended
	afterNotQuiet          bool                         // this step began on a node that was not quiet
	stages                 map[string]measure.Histogram // the node's, over the joins and the wait
}

// stageNames are the node's histograms of a join's way, in its order:
// the claim, the event from the store to the node off NATS, the wait for
// room order.
var stageNames = []string{"presence_node_join_claim_seconds", "presence_node_event_age_seconds", "presence_node_event_reorder_seconds"}

// bound formats a bucket's upper bound in seconds.
func bound(s float64) string {
	if math.IsInf(s, 1) {
		return "past the last bucket"
	}
	return "≤" + measure.FmtDur(time.Duration(s*float64(time.Second)))
}

// stagesLine reports the stages as bucket bounds ("≤"): where the p50 and
// p99 of each fell.
func stagesLine(st map[string]measure.Histogram) string {
	var parts []string
	for i, n := range stageNames {
		h, ok := st[n]
		if !ok {
			continue
		}
		p50, count := h.Quantile(.50)
		p99, _ := h.Quantile(.99)
		if count == 0 {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s p50 %s p99 %s (n %.0f)", []string{"claim", "store → node", "reorder"}[i], bound(p50), bound(p99), count))
	}
	if len(parts) == 0 {
		return ""
	}
	return "node stages (its histograms' bucket bounds): " + strings.Join(parts, "; ")
}

func (r stepResult) failures() []string {
	f := r.sum.failures()
	if r.connFailed > 0 {
		f = append(f, fmt.Sprintf("%d connections failed to open (first error: %v)", r.connFailed, r.connErr))
	}
	if r.writeErrs > 0 {
		f = append(f, fmt.Sprintf("%d join frames could not be written", r.writeErrs))
	}
	if r.natsDropped > 0 {
		f = append(f, fmt.Sprintf("the NATS subscriber dropped %d messages (this tool was too slow)", r.natsDropped))
	}
	return f
}

// runStep opens the watchers and joiners of one run, sends the joins on
// an absolute schedule, waits for stragglers and closes everything. Its
// connections are all closed when it returns.
func (e *latencyEnv) runStep(ctx context.Context, p stepPlan) (stepResult, error) {
	r := e.newStepRun(p)
	e.rt.add(r.prefix, r.l)
	defer e.rt.remove(r.prefix)
	defer r.closeConns()
	res := stepResult{plan: p}
	t0 := time.Now()
	failedW, errW := r.openWatchers(ctx)
	failedJ, errJ := r.openJoiners(ctx)
	res.connFailed = failedW + failedJ
	res.connErr = errors.Join(errW, errJ)
	res.openTook = time.Since(t0)
	if ctx.Err() != nil {
		return res, ctx.Err()
	}

	m0, _ := measure.Scrape(e.o.Metrics)
	h0, _ := measure.Histograms(e.o.Metrics, stageNames...)
	dropped0, _ := e.sub.Dropped()
	bad0 := e.rt.bad.Load()
	cpu0 := measure.ReadMeters(e.meters)
	start := r.sendJoins(ctx, &res)
	r.waitStragglers(ctx, &res)
	res.pendingReply, res.pendingNATS, res.pendingWS = r.l.pending()
	r.retries.end()
	cpu1 := measure.ReadMeters(e.meters)
	res.window = time.Since(start)
	res.cpu = measure.Delta(cpu0, cpu1)
	if m1, err := measure.Scrape(e.o.Metrics); err == nil && m0 != nil {
		res.resyncs = m1["presence_node_resyncs_total"] - m0["presence_node_resyncs_total"]
		res.rejected = m1["presence_node_rejected_frames_total"] - m0["presence_node_rejected_frames_total"]
	}
	if h1, err := measure.Histograms(e.o.Metrics, stageNames...); err == nil {
		res.stages = map[string]measure.Histogram{}
		for _, n := range stageNames {
			res.stages[n] = h1[n].Sub(h0[n])
		}
	}
	if n, err := e.sub.Dropped(); err == nil {
		res.natsDropped = n - dropped0
	}
	res.natsBad = e.rt.bad.Load() - bad0

	res.sum = r.l.summarize(e.o.Late)

	r.closing.Store(true)
	r.closeConns()
	r.readers.Wait()
	if e.o.Quiesce > 0 {
		r.quiesce(ctx, &res, failedW)
	}
	return res, ctx.Err()
}

// stepRun is what one run of runStep holds: its users, its connections
// and the goroutines reading them.
type stepRun struct {
	e        *latencyEnv
	p        stepPlan
	prefix   string
	l        *ledger
	rooms    int
	joiners  []*wsConn
	watchers []*websocket.Conn
	conns    []*websocket.Conn // the joiners'
	closing  atomic.Bool       // set before this run closes its own connections
	readers  sync.WaitGroup
	retries  *joinRetries
}

func (e *latencyEnv) newStepRun(p stepPlan) *stepRun {
	r := &stepRun{e: e, p: p, prefix: fmt.Sprintf("l%ds%d-", e.runID, p.index), l: newLedger()}
	r.retries = &joinRetries{l: r.l, timers: map[*time.Timer]string{}}
	r.rooms = (p.joins + p.perRoom - 1) / p.perRoom
	r.joiners = make([]*wsConn, p.joins)
	for i := range r.joiners {
		r.joiners[i] = &wsConn{user: fmt.Sprintf("%s%d", r.prefix, i), room: r.room(i / p.perRoom)}
		r.l.add(r.joiners[i].user, r.joiners[i].room)
	}
	return r
}

func (r *stepRun) room(i int) string { return fmt.Sprintf("%sr%d", r.prefix, i) }

// closeConns closes every connection of the run; closing twice is harmless.
func (r *stepRun) closeConns() {
	load.CloseAll(r.watchers)
	load.CloseAll(r.conns)
}

// openWatchers opens one watcher per room, a different user, joined
// before any measured join, reading every frame from then on.
func (r *stepRun) openWatchers(ctx context.Context) (failed int, err error) {
	r.watchers, failed, err = load.OpenAll(ctx, r.e.d, r.rooms, func(i int) (string, string, string) {
		return fmt.Sprintf("%sw%d", r.prefix, i), "s", r.room(i)
	}, func(i int, ws *websocket.Conn) {
		room := r.room(i)
		r.read(ws, func(data []byte, at time.Time) { r.l.watcherFrame(room, data, at) },
			func(err error) { r.l.watcherGone(room, describeClose(err)) })
	})
	for i, w := range r.watchers {
		if w == nil {
			r.l.noWatcher(r.room(i)) // counted with the connections that failed
		}
	}
	return failed, err
}

// openJoiners connects the joiners, not joined; each reads its frames
// (its join's reply, then the events of the room) from the start. A
// refusal with retry_after_ms schedules the same join again after that
// delay; latency still counts from the first send.
func (r *stepRun) openJoiners(ctx context.Context) (failed int, err error) {
	r.conns, failed, err = load.OpenAll(ctx, r.e.d, r.p.joins, func(i int) (string, string, string) {
		return r.joiners[i].user, "s", ""
	}, func(i int, ws *websocket.Conn) {
		c := r.joiners[i]
		c.WS = ws
		r.read(ws, func(data []byte, at time.Time) {
			if d := r.l.joinerFrame(c.user, data, at); d > 0 {
				r.retries.schedule(c, d)
			}
		}, func(error) { r.l.joinerLost() })
	})
	return failed, err
}

// read runs ws's reader until the connection ends: each frame goes to
// frame with the time it was read, and an end before the step closes
// its connections to gone. Raw frames, not package client: the time of
// an online is when its frame comes off the socket (a client would fold
// it into a view first), and the ledger accounts for every frame,
// refusals and resyncs included, which a client handles on its own.
func (r *stepRun) read(ws *websocket.Conn, frame func([]byte, time.Time), gone func(error)) {
	r.readers.Add(1)
	go func() {
		defer r.readers.Done()
		for {
			_, data, err := ws.ReadMessage()
			if err != nil {
				if !r.closing.Load() {
					gone(err)
				}
				return
			}
			frame(data, time.Now())
		}
	}()
}

// sendJoins sends join i at start + i/rate: an absolute schedule, so a
// late send does not push the later ones back. It returns start.
func (r *stepRun) sendJoins(ctx context.Context, res *stepResult) time.Time {
	pacer := churn.Pacer{Rate: r.p.rate}
	var last time.Time
	start := pacer.Run(ctx, len(r.joiners), func(i int, at time.Time) {
		c := r.joiners[i]
		if c.WS == nil {
			return // its connection failed; counted as never sent
		}
		now := time.Now()
		res.maxLag = max(res.maxLag, now.Sub(at))
		r.l.send(c.user, now)
		if err := c.Send(joinFrame(c.room, 1)); err != nil {
			res.writeErrs++
		}
		res.sent++
		last = now
	})
	if res.sent > 0 {
		res.achieved = float64(res.sent) / (last.Sub(start) + pacer.Interval()).Seconds()
	}
	return start
}

// waitStragglers polls until every join has its outcome on both paths,
// or the bound passes. Late events enter the percentiles.
func (r *stepRun) waitStragglers(ctx context.Context, res *stepResult) {
	sendEnd := time.Now()
	deadline := sendEnd.Add(r.e.o.Straggle)
	for !r.l.settled() && time.Now().Before(deadline) && ctx.Err() == nil {
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
		}
	}
	res.straggle = time.Since(sendEnd)
}

// quiesce lets the node finish with this run before the next one: every
// user this run brought online (joiners and watchers) goes offline after
// the grace, and the node must have dropped the connections.
func (r *stepRun) quiesce(ctx context.Context, res *stepResult, failedW int) {
	o := r.e.o
	want := res.sum.nats.seen + r.rooms - failedW
	q0 := time.Now()
	conns := -1.0
	for time.Since(q0) < o.Quiesce && ctx.Err() == nil {
		if m, err := measure.Scrape(o.Metrics); err == nil {
			conns = m["presence_node_connections"]
		}
		if r.l.offlineCount() >= want && conns >= 0 && conns <= o.BaseConns {
			break
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
		}
	}
	res.quiet = time.Since(q0)
	if got := r.l.offlineCount(); got < want || conns > o.BaseConns {
		res.notQuiet = fmt.Sprintf("not quiet %v after the run: %d of %d offline events seen, node connections %.0f (%.0f before the runs)",
			o.Quiesce, got, want, conns, o.BaseConns)
	}
}

// joinRetries holds the joins refused with retry_after_ms, each sent again
// from a timer. Retries still scheduled when the run ends are dropped (the
// join counts as refused).
type joinRetries struct {
	l      *ledger
	mu     sync.Mutex
	timers map[*time.Timer]string // user of each scheduled retry
	over   bool
}

// schedule sends c's join again after d, unless the run has ended.
func (j *joinRetries) schedule(c *wsConn, d time.Duration) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.over {
		j.l.retryDropped(c.user)
		return
	}
	var t *time.Timer
	t = time.AfterFunc(load.Jitter(d), func() { // the client's own jitter, as the JS client's
		j.mu.Lock()
		_, ok := j.timers[t]
		delete(j.timers, t)
		j.mu.Unlock()
		if ok {
			n := j.l.send(c.user, time.Now())
			_ = c.Send(joinFrame(c.room, n))
		}
	})
	j.timers[t] = c.user
}

// end drops every retry still scheduled. A timer that already fired finds
// itself removed and sends nothing.
func (j *joinRetries) end() {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.over = true
	for t, user := range j.timers {
		t.Stop()
		j.l.retryDropped(user)
	}
	clear(j.timers)
}

func joinFrame(room string, attempt int) []byte {
	return load.Encode(protocol.Request{Type: protocol.TypeJoin, Room: room, Ref: "j" + strconv.Itoa(attempt)})
}

// describeClose names how a connection ended: its close code if it had one.
func describeClose(err error) string {
	var ce *websocket.CloseError
	if errors.As(err, &ce) {
		return fmt.Sprintf("close %d", ce.Code)
	}
	return err.Error()
}

// Run is the latency mode: one measurement at --rate, or a sweep with
// --sweep.
func Run(ctx context.Context, o load.Options, out io.Writer) error {
	if o.Rate <= 0 || o.PerRoom < 1 || o.MaxConns < o.PerRoom+1 {
		return errors.New("--rate must be positive, --per-room at least 1 and --max-conns above --per-room")
	}
	// Keep headroom under the open-files limit for NATS, HTTP and the
	// runtime's own descriptors.
	if limit := o.FileLimit; limit > 0 && uint64(o.MaxConns)+256 > limit {
		fmt.Fprintf(out, "--max-conns %d lowered to %d: this process may open %d files\n", o.MaxConns, limit-256, limit)
		o.MaxConns = int(limit - 256)
	}
	if o.Sweep != "" {
		return sweep(ctx, o, out)
	}
	env, done, err := newLatencyEnv(ctx, o)
	if err != nil {
		return err
	}
	defer done()
	p := env.plan(0, o.Rate)
	res, err := env.runStep(ctx, p)
	if err != nil {
		return err
	}
	report(out, res, o)
	reportQuiet(out, res)
	if f := res.failures(); len(f) > 0 {
		return fmt.Errorf("FAIL: %s", strings.Join(f, "; "))
	}
	fmt.Fprintln(out, "result: OK (every online seen on both paths, nothing refused or replaced)")
	return nil
}

// reportQuiet prints how the wait for the node to go quiet after a run
// (--quiesce) ended, if there was one.
func reportQuiet(out io.Writer, res stepResult) {
	if res.notQuiet != "" {
		fmt.Fprintf(out, "warning: %s\n", res.notQuiet)
	} else if res.quiet > 0 {
		fmt.Fprintf(out, "node quiet again %v after the run (every offline seen, connections closed)\n", res.quiet.Round(100*time.Millisecond))
	}
}

// nodeConns reads the node's open connections.
func nodeConns(url string) (float64, error) {
	m, err := measure.Scrape(url)
	if err != nil {
		return 0, err
	}
	return m["presence_node_connections"], nil
}

// report prints one run.
func report(out io.Writer, r stepResult, o load.Options) {
	p, s := r.plan, r.sum
	capped := ""
	if p.capped {
		capped = fmt.Sprintf(" (capped by --max-conns %d: %v instead of %v)", o.MaxConns, p.duration.Round(time.Millisecond), o.Duration)
	}
	fmt.Fprintf(out, "%d joins at %.0f/s over %v%s into %d rooms of %d, each with a watcher; connections opened in %v\n",
		p.joins, p.rate, p.duration.Round(time.Millisecond), capped, (p.joins+p.perRoom-1)/p.perRoom, p.perRoom, r.openTook.Round(time.Millisecond))
	fmt.Fprintf(out, "sent %d (achieved %.0f/s, max send lag %v); answered %d, refused for good %d, refused then served %d, never answered %d; refusal codes: %s\n",
		r.sent, r.achieved, measure.FmtDur(r.maxLag), s.replied, s.refusedFinal, s.refusedThenServed, s.unanswered, measure.Codes(s.refusalCodes))
	line := func(name string, ps pathStats, resync bool) {
		fmt.Fprintf(out, "join -> %-22s p50 %-8s p90 %-8s p99 %-8s max %-8s seen %d/%d  late(>%v) %d  missing %d",
			name, measure.FmtDur(ps.q(.50)), measure.FmtDur(ps.q(.90)), measure.FmtDur(ps.q(.99)), measure.FmtDur(ps.q(1)), ps.seen, ps.expected(), o.Late, ps.late, ps.missing)
		if resync {
			fmt.Fprintf(out, "  replaced by resync %d", ps.resynced)
		}
		fmt.Fprintln(out)
	}
	line("online on NATS:", s.nats, false)
	line("online on WebSocket:", s.ws, true)
	line("own snapshot reply:", s.reply, false)
	fmt.Fprintf(out, "waited %v for stragglers (bound %v; still pending: reply %d, NATS %d, WebSocket %d); resync snapshots at watchers %d, node resyncs_total +%.0f, rejected frames +%.0f\n",
		r.straggle.Round(time.Millisecond), o.Straggle, r.pendingReply, r.pendingNATS, r.pendingWS, s.resyncSnapshots, r.resyncs, r.rejected)
	if s.watchersLost+s.joinersLost+s.badFrames+s.wsDuplicates+s.natsDuplicates+r.natsDropped > 0 || r.natsBad > 0 || len(s.errorFrames) > 0 {
		fmt.Fprintf(out, "anomalies: watchers lost %d (%s), joiners lost %d, bad frames %d, WebSocket duplicates %d, NATS duplicates %d, NATS dropped %d, NATS bad %d, other error frames: %s\n",
			s.watchersLost, measure.Codes(s.watcherLoss), s.joinersLost, s.badFrames, s.wsDuplicates, s.natsDuplicates, r.natsDropped, r.natsBad, measure.Codes(s.errorFrames))
	}
	if l := stagesLine(r.stages); l != "" {
		fmt.Fprintln(out, l)
	}
	if len(r.cpu) > 0 {
		fmt.Fprintf(out, "CPU over the joins and the wait (%v), %% of one core: %s\n", r.window.Round(time.Millisecond), measure.FmtCPU(r.cpu, r.window))
	}
	if pct, ok := measure.OtherCPU(r.cpu, r.window); ok && pct > disturbedCPU {
		fmt.Fprintf(out, "warning: other processes used %.0f%% of a core during the run; these figures are disturbed\n", pct)
	}
}

// Sweep runs the latency measurement at increasing rates against the same
// node, with fresh users, rooms and connections per step; each step's
// connections are closed, and the node quiet again, before the next.
// Sweep is the sweep mode: latency at each of --rates (default
// 250,500,1000,1500,2000).
func Sweep(ctx context.Context, o load.Options, out io.Writer) error {
	if o.Sweep == "" {
		o.Sweep = "250,500,1000,1500,2000"
	}
	return Run(ctx, o, out)
}

func sweep(ctx context.Context, o load.Options, out io.Writer) error {
	rates, err := ParseRates(o.Sweep)
	if err != nil {
		return err
	}
	env, done, err := newLatencyEnv(ctx, o)
	if err != nil {
		return err
	}
	defer done()
	if env.o.Quiesce == 0 {
		env.o.Quiesce = 90 * time.Second
	}
	var results []stepResult
	dirty := false
	for i, rate := range rates {
		fmt.Fprintf(out, "--- step %d: %.0f joins/s\n", i+1, rate)
		res, err := env.runStep(ctx, env.plan(i, rate))
		res.afterNotQuiet = dirty
		report(out, res, env.o)
		if f := res.failures(); len(f) > 0 {
			fmt.Fprintf(out, "step FAIL: %s\n", strings.Join(f, "; "))
		}
		// The next step still runs if the node was not quiet, marked: its
		// figures include the tail of this one.
		reportQuiet(out, res)
		dirty = res.notQuiet != ""
		results = append(results, res)
		if err != nil {
			fmt.Fprintf(out, "sweep stopped: %v\n", err)
			break
		}
	}
	fmt.Fprintln(out, sweepTable(results, o.OkP99, o.BadP99))
	var failed []string
	for _, r := range results {
		if len(r.failures()) > 0 {
			failed = append(failed, fmt.Sprintf("%.0f/s", r.plan.rate))
		}
	}
	if len(results) < len(rates) {
		return fmt.Errorf("FAIL: sweep stopped after %d of %d steps", len(results), len(rates))
	}
	if len(failed) > 0 {
		return fmt.Errorf("FAIL: events missing, replaced by resync or refused at %s", strings.Join(failed, ", "))
	}
	return nil
}

// disturbedCPU is the CPU of other processes (% of one core) above which a
// run's figures are flagged as disturbed.
const disturbedCPU = 25.0

// sweepTable formats the steps and the two thresholds: the highest rate
// up to which the WebSocket p99 stayed within okP99 with every online
// delivered, and
// the first rate whose WebSocket p99 passed badP99 (a join never seen
// counts as infinitely late).
func sweepTable(results []stepResult, okP99, badP99 time.Duration) string {
	var b strings.Builder
	widths := []int{-8, 6, 9, 8, 8, 8, 8, 7, 6, 7, 9, 7, 7, 7, 9} // negative: left-aligned
	row := func(cols ...string) {
		var line strings.Builder
		for i, c := range cols {
			fmt.Fprintf(&line, "%*s ", widths[i], c)
		}
		b.WriteString(strings.TrimRight(line.String(), " ") + "\n")
	}
	b.WriteString("\n")
	row("rate", "joins", "achieved", "ws p50", "ws p99", "nats p50", "nats p99", "ws seen", "late", "ws miss", "nats miss", "resync", "refused", "retried", "other cpu")
	disturbed := 0
	best, worst := "none", "none"
	broken := false
	var passAbove []string
	for _, r := range results {
		s := r.sum
		other := "?"
		if pct, ok := measure.OtherCPU(r.cpu, r.window); ok {
			other = fmt.Sprintf("%.0f%%", pct)
			if pct > disturbedCPU {
				disturbed++
				other += "!"
			}
		}
		row(rateLabel(r), strconv.Itoa(r.plan.joins), fmt.Sprintf("%.0f/s", r.achieved),
			measure.FmtDur(s.ws.q(.5)), measure.FmtDur(s.ws.q(.99)), measure.FmtDur(s.nats.q(.5)), measure.FmtDur(s.nats.q(.99)),
			strconv.Itoa(s.ws.seen), strconv.Itoa(s.ws.late), strconv.Itoa(s.ws.missing), strconv.Itoa(s.nats.missing),
			strconv.Itoa(s.ws.resynced), strconv.Itoa(s.refusedFinal), strconv.Itoa(s.refusedThenServed), other)
		// "Stayed" within the target: the best rate is the last of the
		// passing steps counted from the lowest rate; a pass above a
		// failed step is listed apart.
		if len(r.failures()) == 0 && s.ws.expected() > 0 && s.ws.q(.99) <= okP99 {
			if !broken {
				best = fmt.Sprintf("%.0f/s", r.plan.rate)
			} else {
				passAbove = append(passAbove, fmt.Sprintf("%.0f/s", r.plan.rate))
			}
		} else {
			broken = true
		}
		if worst == "none" && s.ws.q(.99) > badP99 {
			worst = fmt.Sprintf("%.0f/s", r.plan.rate)
		}
	}
	fmt.Fprintf(&b, "highest rate with WebSocket p99 <= %v and every online delivered (at it and every rate below): %s", okP99, best)
	if len(passAbove) > 0 {
		fmt.Fprintf(&b, " (above a failed step, also within it: %s)", strings.Join(passAbove, ", "))
	}
	b.WriteString("\n")
	fmt.Fprintf(&b, "first rate with WebSocket p99 > %v: %s", badP99, worst)
	if disturbed > 0 {
		fmt.Fprintf(&b, "\n! %d steps ran beside more than %.0f%% of a core of other processes (other cpu: the machine's CPU minus the node, Redis, NATS, this tool and its hog): their figures are disturbed", disturbed, disturbedCPU)
	}
	for _, r := range results {
		if r.afterNotQuiet {
			b.WriteString("\n* began before the node was quiet after the step before")
			break
		}
	}
	return b.String()
}

func rateLabel(r stepResult) string {
	l := fmt.Sprintf("%.0f/s", r.plan.rate)
	if r.afterNotQuiet {
		l += "*"
	}
	return l
}

// ParseRates reads a comma-separated list of join rates.
func ParseRates(s string) ([]float64, error) {
	var rates []float64
	for _, f := range strings.Split(s, ",") {
		r, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || r <= 0 {
			return nil, fmt.Errorf("--rates: %q is not a positive rate", f)
		}
		rates = append(rates, r)
	}
	return rates, nil
}

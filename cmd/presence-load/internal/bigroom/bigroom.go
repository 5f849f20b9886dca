// Package bigroom is the bigroom mode (docs/PROTOCOL.md "Big rooms",
// docs/BENCHMARKS.md): one room of thousands of members, each a real
// WebSocket client in a bigroom-worker child process; fill, churn, storm,
// count-only watchers and watch lists, every view checked against the
// truth.
package bigroom

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
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
	"github.com/presence-dev/presence/cmd/presence-load/internal/worker"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
)

// The bigroom mode: one room of thousands of members on one node, every
// member a real WebSocket client reading its frames (docs/PROTOCOL.md "Big
// rooms" and docs/BENCHMARKS.md). Scenarios:
//
//   - members: fill the room with --room-size members joined with
//     "batch":true on the measured node (--addr), time it; churn it at
//     --churn-rate joins/s and as many leaves/s for --churn-for; time
//     join -> online at sampled members, count frames per member per
//     tick, check that sampled members' folded views equal a fresh read of
//     the room; then a storm of --storm joins at once: join -> snapshot.
//   - count: --watchers count-only watchers ("view":"count",
//     "present":false) on the measured node of a room of --room-size under
//     the same churn: frames per watcher per tick, and every watcher's last
//     count equal to the room's.
//   - watch: --watchers clients on the measured node each watching
//     --watch-users users of the room under the same churn: frames per
//     client against the churn among its users, and every watcher's view
//     of its users equal to the truth.
//
// The room's population (count and watch) and the churners (all three)
// connect to a second node of the same region (--pop-addr), so that the
// measured node holds only what is measured and stays under its
// connection limit; the population joins with "view":"count" there, so
// that node's own fan-out stays one frame per tick per member. The
// connections live in `bigroom-worker` child processes of at most
// --per-process each (the open-files limit is per process).

// Options are the big-room flags (docs/BENCHMARKS.md, "Big rooms"), which
// the centrifugo mode shares.
type Options struct {
	Scenario      string        `flag:"scenario" default:"members" help:"bigroom: members (fill, churn, storm), count (count-only watchers) or watch (watch lists)"`
	PopAddr       string        `flag:"pop-addr" help:"bigroom: the second node (host:port) for the population and the churners (default: --addr)"`
	RoomSize      int           `flag:"room-size" default:"15000" help:"bigroom: members in the room before the churn"`
	Watchers      int           `flag:"watchers" default:"15000" help:"bigroom count and watch: watchers on the measured node"`
	WatchUsers    int           `flag:"watch-users" default:"50" help:"bigroom watch: users per watch list"`
	WatchChurners int           `flag:"watch-churners" default:"10" help:"bigroom watch: how many of each list are churners (the rest are population members)"`
	ChurnRate     float64       `flag:"churn-rate" default:"500" help:"bigroom: joins per second, and as many leaves per second (0: no churn)"`
	ChurnFor      time.Duration `flag:"churn-for" default:"60s" help:"bigroom: how long to churn"`
	ChurnHold     time.Duration `flag:"churn-hold" default:"2s" help:"bigroom: how long a churner stays before its leave (its offline follows after the node's offline grace)"`
	ChurnView     string        `flag:"churn-view" default:"count" help:"bigroom: how churners join: \"count\" (an O(1) reply) or \"members\" (a snapshot of the big room each)"`
	Samples       int           `flag:"samples" default:"20" help:"bigroom members: members that fold their view and time the churners' events"`
	PerProcess    int           `flag:"per-process" default:"8000" help:"bigroom: WebSockets per worker process (under its open-files limit)"`
	Inflight      int           `flag:"inflight" default:"64" help:"bigroom: joins in flight per worker while filling"`
	Storm         int           `flag:"storm" default:"1000" help:"bigroom members: joins at once into the room after the churn (0: none)"`
	Grace         time.Duration `flag:"grace" help:"bigroom: the nodes' offline grace (a leave's offline comes this much later)"`
	NodePID       int           `flag:"node-pid" help:"bigroom: the measured node's pid: CPU and RSS from /proc (default: CPU from /metrics, no RSS)"`
	PopPID        int           `flag:"pop-pid" help:"bigroom: the second node's pid (its CPU)"`
	ReadBuffer    int           `flag:"read-buffer" default:"16384" help:"bigroom and centrifugo: each WebSocket's read buffer in bytes; a frame that fits in it is read off the socket in one read (at the 512 bytes of the other scenarios, an events frame took two)"`
	Lowat         int           `flag:"lowat" default:"16384" help:"bigroom: connections that only count their frames (all but the sampled members) are woken to read them once this many bytes have gathered, or once a second (SO_RCVLOWAT; 0: at every frame), so that their wakeups do not take the cores the node is measured on"`
	Settle        time.Duration `flag:"settle" default:"2s" help:"bigroom: quiet time with no event on NATS before the room counts as quiescent"`
}

// DefaultOptions are the bigroom flags' defaults: the tags', and the
// offline grace of the nodes'.
func DefaultOptions() Options { return Options{Grace: presence.DefaultOfflineGrace} }

// bigRun is one bigroom run.
type bigRun struct {
	o       load.Options
	b       Options
	out     io.Writer
	run     uint32
	room    string
	baseUS  int64
	tick    time.Duration
	dA, dB  *load.Dialer // measured node, population node
	nc      *nats.Conn
	truth   *natsTruth
	workers []*worker.Proc
	meters  []measure.Meter
	fails   []string
	misses  []string // targets missed (reported, not failures)
	rss     *measure.RSSWatch
}

func (r *bigRun) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.fails = append(r.fails, msg)
	fmt.Fprintln(r.out, "FAIL:", msg)
}

func (r *bigRun) target(ok bool, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if ok {
		fmt.Fprintln(r.out, "target met:", msg)
	} else {
		r.misses = append(r.misses, msg)
		fmt.Fprintln(r.out, "target MISSED:", msg)
	}
}

// Run is the bigroom mode: the scenario of --scenario against the node of
// --addr, its population and churners on --pop-addr.
func Run(ctx context.Context, o load.Options, b Options, out io.Writer) error {
	if err := b.check(); err != nil {
		return err
	}
	if b.PopAddr == "" {
		b.PopAddr = o.Addr
	}
	r := &bigRun{o: o, b: b, out: out, run: rand.Uint32(), baseUS: time.Now().UnixMicro()}
	r.room = fmt.Sprintf("big%d", r.run)
	var err error
	if r.dA, err = load.NewDialer(o); err != nil {
		return err
	}
	ob := o
	ob.Addr = b.PopAddr
	if r.dB, err = load.NewDialer(ob); err != nil {
		return err
	}
	sub, err := r.followTruth()
	if err != nil {
		return err
	}
	defer r.nc.Close()
	if err := r.startMeters(); err != nil {
		return err
	}
	if r.rss != nil {
		defer r.rss.Stop()
	}
	defer func() {
		for _, w := range r.workers {
			w.Stop()
		}
	}()
	fmt.Fprintf(out, "bigroom %s: room %s on %s; population and churners on %s; %d per worker process\n", b.Scenario, r.room, o.Addr, b.PopAddr, b.PerProcess)
	switch b.Scenario {
	case "members":
		err = r.members(ctx)
	case "count":
		err = r.countScenario(ctx)
	case "watch":
		err = r.watchScenario(ctx)
	}
	if err != nil {
		r.fail("%v", err)
	}
	if n, _ := sub.Dropped(); n > 0 {
		r.fail("the NATS subscriber dropped %d messages", n)
	}
	if len(r.misses) > 0 {
		fmt.Fprintf(out, "targets missed: %s\n", strings.Join(r.misses, "; "))
	}
	if len(r.fails) > 0 {
		return fmt.Errorf("FAIL: %s", strings.Join(r.fails, "; "))
	}
	fmt.Fprintln(out, "result: OK (nothing missing, repeated, refused or resynced; every view checked equals the truth)")
	return nil
}

// check refuses flags that name no scenario or view, and more
// connections per worker than its open files.
func (b Options) check() error {
	switch b.Scenario {
	case "members", "count", "watch":
	default:
		return fmt.Errorf("--scenario %q: members, count or watch", b.Scenario)
	}
	if b.ChurnView != "count" && b.ChurnView != "members" {
		return fmt.Errorf("--churn-view %q: count or members", b.ChurnView)
	}
	if b.PerProcess < 1 || b.PerProcess > 19000 {
		return errors.New("--per-process must be 1..19000 (the open-files limit per process is 20,000)")
	}
	return nil
}

// followTruth subscribes to the room's transitions on NATS: the truth the
// views are checked against.
func (r *bigRun) followTruth() (*nats.Subscription, error) {
	var err error
	if r.nc, err = nats.Connect(r.o.NatsURL); err != nil {
		return nil, fmt.Errorf("NATS (the truth of the room's transitions): %w", err)
	}
	r.truth = &natsTruth{room: r.room, on: map[string]int64{}, off: map[string]int64{}, onSeq: map[string]uint64{}, offSeq: map[string]uint64{}, seen: map[uint64]bool{}, base: r.baseUS}
	sub, err := r.nc.Subscribe(bus.RoomFilter(r.o.Region, r.room), r.truth.handle)
	if err != nil {
		r.nc.Close()
		return nil, err
	}
	_ = sub.SetPendingLimits(-1, -1)
	if err := r.nc.Flush(); err != nil {
		r.nc.Close()
		return nil, err
	}
	return sub, nil
}

// startMeters sets up the CPU meters (the nodes' from /proc with their
// pids) and the measured node's RSS watch.
func (r *bigRun) startMeters() error {
	var err error
	if r.meters, err = load.NewMeters(r.o, true); err != nil {
		return err
	}
	if r.b.NodePID > 0 {
		r.meters[0] = measure.ProcMeter("node", r.b.NodePID)
		r.rss = measure.WatchRSS(r.b.NodePID)
	}
	if r.b.PopPID > 0 {
		r.meters = append(r.meters, measure.ProcMeter("node B", r.b.PopPID))
	}
	return nil
}

// group is a set of connections spread over worker processes.
type group struct {
	name    string
	spec    openSpec
	workers []*worker.Proc
	counts  []int // connections per worker, in order
}

// openGroup opens n connections of spec over new workers of at most
// perProcess each, all workers at once, and reports how long it took.
func (r *bigRun) openGroup(ctx context.Context, name string, spec openSpec, n int, users [][]string) (*group, openResp, error) {
	g := &group{name: name, spec: spec}
	per := r.b.PerProcess
	nw := (n + per - 1) / per
	var total openResp
	total.Codes = map[string]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	var firstErr error
	for k := range nw {
		w, err := worker.Start("bigroom-worker")
		if err != nil {
			return nil, total, err
		}
		r.workers = append(r.workers, w)
		r.meters = append(r.meters, measure.ProcMeter(fmt.Sprintf("worker %d", len(r.workers)), w.Pid()))
		g.workers = append(g.workers, w)
		from, to := k*n/nw, (k+1)*n/nw
		g.counts = append(g.counts, to-from)
	}
	start := time.Now()
	for k, w := range g.workers {
		s := spec
		s.From = k * n / nw
		s.To = (k + 1) * n / nw
		s.Sample = nil
		for _, i := range spec.Sample {
			if i >= s.From && i < s.To {
				s.Sample = append(s.Sample, i)
			}
		}
		if users != nil {
			s.Users = users[s.From:s.To]
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var res openResp
			err := w.Call("open", &s, &res)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			total.Opened += res.Opened
			total.Failed += res.Failed
			total.Retried += res.Retried
			if total.FirstErr == "" {
				total.FirstErr = res.FirstErr
			}
			if total.Reply == "" {
				total.Reply = res.Reply
			}
			for c, v := range res.Codes {
				total.Codes[c] += v
			}
			for _, t := range res.TickMS {
				if !slices.Contains(total.TickMS, t) {
					total.TickMS = append(total.TickMS, t)
				}
			}
		}()
	}
	wg.Wait()
	total.Took = time.Since(start)
	if firstErr != nil {
		return g, total, firstErr
	}
	_ = ctx
	return g, total, nil
}

func (r *bigRun) reportOpen(what string, n int, res openResp) {
	fmt.Fprintf(r.out, "%s: %d of %d in %v (%.0f/s); failed %d", what, res.Opened, n, res.Took.Round(time.Millisecond), float64(res.Opened)/res.Took.Seconds(), res.Failed)
	if res.Failed > 0 {
		fmt.Fprintf(r.out, " (refusals: %s; first error: %s)", measure.Codes(res.Codes), res.FirstErr)
	}
	fmt.Fprintf(r.out, "; sent again after unavailable %d; reply %q; tick_ms in hello %v\n", res.Retried, res.Reply, res.TickMS)
	if res.Failed > 0 {
		r.fail("%s: %d of %d connections failed (%s)", what, res.Failed, n, res.FirstErr)
	}
	if r.tick == 0 {
		for _, t := range res.TickMS {
			if t > 0 {
				r.tick = time.Duration(t) * time.Millisecond
			}
		}
	}
}

func (g *group) each(f func(w *worker.Proc) error) error {
	return worker.Each(g.workers, func(_ int, w *worker.Proc) error { return f(w) })
}

func (g *group) mark() error {
	return g.each(func(w *worker.Proc) error { return w.Call("mark", nil, nil) })
}

func (g *group) stats() (statsResp, error) {
	var s statsResp
	s.Types, s.Errors, s.Closed = map[string]int64{}, map[string]int{}, map[string]int{}
	s.MinSeq = ^uint64(0)
	var mu sync.Mutex
	err := g.each(func(w *worker.Proc) error {
		var x statsResp
		if err := w.Call("stats", nil, &x); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		mergeStats(&s, x)
		return nil
	})
	if s.MinSeq == ^uint64(0) {
		s.MinSeq = 0
	}
	return s, err
}

// mergeStats adds x into s (frames appended; MinSeq 0 in x means none).
func mergeStats(s *statsResp, x statsResp) {
	s.Frames = append(s.Frames, x.Frames...)
	for k, v := range x.Types {
		s.Types[k] += v
	}
	for k, v := range x.Errors {
		s.Errors[k] += v
	}
	for k, v := range x.Closed {
		s.Closed[k] += v
	}
	s.Resyncs += x.Resyncs
	s.Anom.add(x.Anom)
	if x.MaxSeq > 0 {
		s.MinSeq = min(s.MinSeq, x.MinSeq)
		s.MaxSeq = max(s.MaxSeq, x.MaxSeq)
	}
}

func (g *group) report(req churn.Sent) (churn.Arrivals, error) {
	var out churn.Arrivals
	var mu sync.Mutex
	err := g.each(func(w *worker.Proc) error {
		var x churn.Arrivals
		if err := w.Call("report", &req, &x); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		out.Add(x)
		return nil
	})
	return out, err
}

func (g *group) check(req checkReq) (checkResp, error) {
	var out checkResp
	// In worker order, so Expected lines up with the frames of stats.
	res := make([]checkResp, len(g.workers))
	err := worker.Each(g.workers, func(i int, w *worker.Proc) error { return w.Call("check", &req, &res[i]) })
	for _, x := range res {
		out.Checked += x.Checked
		out.Wrong += x.Wrong
		out.Behind += x.Behind
		out.Lost += x.Lost
		out.Expected = append(out.Expected, x.Expected...)
		for _, e := range x.Examples {
			if len(out.Examples) < 8 {
				out.Examples = append(out.Examples, e)
			}
		}
	}
	return out, err
}

// natsTruth records every transition of the room as NATS carries it.
type natsTruth struct {
	mu     sync.Mutex
	room   string
	base   int64
	trans  []trans
	atUS   []int64
	on     map[string]int64 // user -> µs since base of its first online
	off    map[string]int64
	onSeq  map[string]uint64 // user -> room seq of its first online
	offSeq map[string]uint64
	seen   map[uint64]bool
	maxSeq uint64
	epoch  int64
	last   time.Time
	dups   int
	bad    int
	// transitions that arrived after one of a higher seq
	inversions  int
	invExamples []string
}

func (t *natsTruth) handle(m *nats.Msg) {
	at := time.Now()
	ev, err := bus.DecodeEvent(m.Data)
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil || ev.Room != t.room {
		t.bad++
		return
	}
	t.last = at
	if ev.Epoch != t.epoch {
		t.epoch = ev.Epoch
		clear(t.seen)
	}
	if t.seen[ev.Seq] {
		t.dups++
		return
	}
	t.seen[ev.Seq] = true
	if ev.Seq < t.maxSeq {
		// Arrived after a later seq of the room: NATS carries the room's
		// transitions out of seq order.
		t.inversions++
		if len(t.invExamples) < 3 {
			t.invExamples = append(t.invExamples, fmt.Sprintf("%d %s %s after %d", ev.Seq, ev.Kind, ev.User, t.maxSeq))
		}
	}
	us := at.UnixMicro() - t.base
	t.trans = append(t.trans, trans{User: ev.User, Kind: string(ev.Kind), Seq: ev.Seq})
	t.atUS = append(t.atUS, us)
	t.maxSeq = max(t.maxSeq, ev.Seq)
	switch ev.Kind {
	case presence.Online:
		if _, ok := t.on[ev.User]; !ok {
			t.on[ev.User] = us
			t.onSeq[ev.User] = ev.Seq
		}
	case presence.Offline:
		if _, ok := t.off[ev.User]; !ok {
			t.off[ev.User] = us
			t.offSeq[ev.User] = ev.Seq
		}
	}
}

func (t *natsTruth) state() (maxSeq uint64, last time.Time, n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.maxSeq, t.last, len(t.trans)
}

// waitQuiet waits until cond holds (checked under the truth's lock) and
// no transition came for settle, at most bound.
func (r *bigRun) waitQuiet(ctx context.Context, what string, bound time.Duration, cond func(t *natsTruth) bool) {
	t0 := time.Now()
	for ctx.Err() == nil && time.Since(t0) < bound {
		r.truth.mu.Lock()
		ok := (cond == nil || cond(r.truth)) && time.Since(r.truth.last) >= r.b.Settle
		r.truth.mu.Unlock()
		if ok {
			fmt.Fprintf(r.out, "%s: quiet after %v\n", what, time.Since(t0).Round(100*time.Millisecond))
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	r.fail("%s: not quiet within %v", what, bound)
}

// waitFolded waits until the folding connections of g have applied every
// transition NATS has carried (at most bound).
func (r *bigRun) waitFolded(ctx context.Context, g *group, bound time.Duration) {
	want, _, _ := r.truth.state()
	t0 := time.Now()
	for ctx.Err() == nil {
		s, err := g.stats()
		if err == nil && (s.MaxSeq == 0 || s.MinSeq >= want) {
			return
		}
		if time.Since(t0) > bound {
			fmt.Fprintf(r.out, "after %v the sampled views reach room_seq %d..%d of %d\n", bound, s.MinSeq, s.MaxSeq, want)
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// truthRead reads the room afresh on the measured node: a follower that
// is not present (token with "observe") joins it, reads the snapshot and
// every page. The room must be quiet: a read that saw an event meanwhile
// is taken again.
func (r *bigRun) truthRead(ctx context.Context) (view, *presence.Snapshot, error) {
	for attempt := 1; ; attempt++ {
		v, s, moved, err := r.truthOnce(ctx, attempt)
		if err != nil || !moved || attempt == 3 {
			if moved {
				fmt.Fprintln(r.out, "warning: the room changed during all three truth reads")
			}
			return v, s, err
		}
	}
}

func (r *bigRun) truthOnce(ctx context.Context, attempt int) (view, *presence.Snapshot, bool, error) {
	user := fmt.Sprintf("o%d-%d", r.run, attempt)
	ws, err := r.dA.DialToken(ctx, user, "s", true)
	if err != nil {
		return nil, nil, false, err
	}
	defer ws.Close()
	_ = ws.SetReadDeadline(time.Now().Add(60 * time.Second))
	join := protocol.Request{Type: protocol.TypeJoin, Room: r.room, Present: load.Ptr(false), Ref: "j"}
	if err := ws.WriteMessage(websocket.TextMessage, load.Encode(join)); err != nil {
		return nil, nil, false, err
	}
	f := newFolder()
	var first *presence.Snapshot
	moved := false
	for {
		_, data, err := ws.ReadMessage()
		if err != nil {
			return nil, nil, false, err
		}
		var p pframe
		if err := json.Unmarshal(data, &p); err != nil {
			return nil, nil, false, err
		}
		more := false
		switch p.Type {
		case "hello", "pong":
			continue
		case "event", "events":
			moved = true
			continue
		case "error":
			if p.Code == protocol.CodeRateLimited {
				time.Sleep(time.Second)
				more = true
				break
			}
			return nil, nil, false, fmt.Errorf("truth read: %s", data)
		case "snapshot":
			if p.Ref != "j" {
				moved = true
			}
			first = p.Snapshot
			more = f.snapshot(p.Snapshot, false)
		case "members":
			if p.Snapshot.RoomSeq != first.RoomSeq {
				moved = true
			}
			more = f.page(f.gen, p.Snapshot)
		default:
			continue
		}
		if !more {
			if _, listed := f.v[user]; listed {
				fmt.Fprintf(r.out, "warning: the truth reader %s, joined with \"present\":false, is listed in the room: the node does not support observers; views are compared with it included\n", user)
			}
			_ = ws.WriteMessage(websocket.TextMessage, load.Encode(protocol.Request{Type: protocol.TypeLeave, Room: r.room}))
			return f.v, first, moved, nil
		}
		time.Sleep(120 * time.Millisecond) // under the frame rate
		req := protocol.Request{Type: protocol.TypeMembers, Room: r.room, Offset: load.Ptr(f.nextOff), Limit: load.Ptr(pageLimit), Ref: "p"}
		if err := ws.WriteMessage(websocket.TextMessage, load.Encode(req)); err != nil {
			return nil, nil, false, err
		}
	}
}

// churn is a run of churners: join at rate on an absolute schedule, leave
// hold later, close. Each churner is a new user on its own connection to
// the population node, opened just before its turn.
type churners struct {
	r                 *bigRun
	prefix            string
	n                 int
	sendUS, replyUS   []int64
	leaveUS           []int64
	answered          []bool
	mu                sync.Mutex
	codes             map[string]int
	dialFailed        int
	firstErr          string
	unanswered        int
	leaveUnanswered   int
	maxLag            time.Duration
	closedByNode      map[string]int
	leaveRefused      map[string]int
	retried           int
	peak, live        atomic.Int64
	refusedFinalCount int
}

func (r *bigRun) newChurn() *churners {
	n := int(r.b.ChurnRate * r.b.ChurnFor.Seconds())
	return &churners{r: r, prefix: fmt.Sprintf("c%d-", r.run), n: n,
		sendUS: make([]int64, n), replyUS: make([]int64, n), leaveUS: make([]int64, n), answered: make([]bool, n),
		codes: map[string]int{}, closedByNode: map[string]int{}, leaveRefused: map[string]int{}}
}

func (c *churners) run(ctx context.Context) {
	if c.n == 0 {
		return
	}
	// Each churner dials and connects in the second before its join.
	churn.Pacer{Rate: c.r.b.ChurnRate, Lead: time.Second}.Go(ctx, c.n, func(i int, at time.Time) { c.one(ctx, i, at) })
}

func (c *churners) note(f func()) {
	c.mu.Lock()
	f()
	c.mu.Unlock()
}

// one is churner i: connect, join at `at`, leave hold later, close.
func (c *churners) one(ctx context.Context, i int, at time.Time) {
	r := c.r
	c.peak.Store(max(c.peak.Load(), c.live.Add(1)))
	defer c.live.Add(-1)
	ws, err := r.dB.Dial(ctx, c.prefix+strconv.Itoa(i), "s")
	if err != nil {
		c.note(func() {
			c.dialFailed++
			if c.firstErr == "" {
				c.firstErr = err.Error()
			}
		})
		return
	}
	var ending atomic.Bool
	defer func() { ending.Store(true); ws.Close() }()
	frames := make(chan pframe, 16)
	go c.readReplies(ws, &ending, frames)
	join := protocol.Request{Type: protocol.TypeJoin, Room: r.room, View: protocol.ViewCount, Ref: "j"}
	if r.b.ChurnView == protocol.ViewMembers {
		join = protocol.Request{Type: protocol.TypeJoin, Room: r.room, Batch: true, Ref: "j"}
	}
	if d := time.Until(at); d > 0 {
		time.Sleep(d)
	}
	now := time.Now()
	c.note(func() { c.maxLag = max(c.maxLag, now.Sub(at)) })
	c.sendUS[i] = now.UnixMicro() - r.baseUS
	answered, lastCode, ok := c.joinWithRetries(ctx, ws, frames, load.Encode(join), i)
	if !ok {
		return
	}
	if !answered {
		c.note(func() {
			if lastCode == "" {
				c.unanswered++
			} else {
				c.refusedFinalCount++
			}
		})
		return
	}
	c.answered[i] = true
	if d := time.Until(at.Add(r.b.ChurnHold)); d > 0 {
		time.Sleep(d)
	}
	c.leaveUS[i] = time.Now().UnixMicro() - r.baseUS
	leave := load.Encode(protocol.Request{Type: protocol.TypeLeave, Room: r.room, Ref: "l"})
	for attempt := 1; attempt <= 5; attempt++ {
		if ws.WriteMessage(websocket.TextMessage, leave) != nil {
			break
		}
		retry, done := c.awaitLeft(frames)
		if done {
			ending.Store(true)
			return
		}
		if retry == 0 {
			break
		}
		time.Sleep(retry)
	}
	// Unanswered or refused: closing the connection releases the session
	// too (its offline then follows the close, not the leave).
	c.note(func() { c.leaveUnanswered++ })
}

// readReplies passes the churner connection's replies on to frames
// (dropping them when nobody waits), and counts a close by the node.
func (c *churners) readReplies(ws *websocket.Conn, ending *atomic.Bool, frames chan<- pframe) {
	defer close(frames)
	for {
		_, data, err := ws.ReadMessage()
		if err != nil {
			if !ending.Load() {
				why := load.CloseReason(err)
				c.note(func() { c.closedByNode[why]++ })
			}
			return
		}
		k := frameKind(data)
		if k == "count" && !strings.Contains(string(data[:min(len(data), 40)]), `"ref"`) || k == "events" || k == "event" {
			continue
		}
		var p pframe
		if json.Unmarshal(data, &p) == nil {
			select {
			case frames <- p:
			default:
			}
		}
	}
}

// joinWithRetries sends churner i's join, again after each refusal's
// retry_after_ms (five tries): answered, the last refusal's code, and ok
// false when ctx ended.
func (c *churners) joinWithRetries(ctx context.Context, ws *websocket.Conn, frames <-chan pframe, join []byte, i int) (answered bool, lastCode string, ok bool) {
	r := c.r
	for attempt := 1; attempt <= 5 && !answered; attempt++ {
		if ws.WriteMessage(websocket.TextMessage, join) != nil {
			break
		}
		retry := time.Duration(0)
		timeout := time.After(30 * time.Second)
	wait:
		for {
			select {
			case p, ok := <-frames:
				if !ok {
					break wait
				}
				if p.Ref != "j" {
					continue
				}
				if p.Type == "error" {
					lastCode = string(p.Code)
					c.note(func() { c.codes[string(p.Code)]++ })
					retry = time.Duration(p.RetryAfterMS) * time.Millisecond
					break wait
				}
				c.replyUS[i] = time.Now().UnixMicro() - r.baseUS
				answered = true
				break wait
			case <-timeout:
				break wait
			case <-ctx.Done():
				return answered, lastCode, false
			}
		}
		if answered || retry == 0 {
			break
		}
		c.note(func() { c.retried++ })
		time.Sleep(retry)
	}
	return answered, lastCode, true
}

// awaitLeft reads frames until the leave's reply: done on `left`; a
// refusal's retry_after_ms (0: none, or no reply in 30 s).
func (c *churners) awaitLeft(frames <-chan pframe) (retry time.Duration, done bool) {
	timeout := time.After(30 * time.Second)
	for {
		select {
		case p, ok := <-frames:
			if !ok {
				return 0, false
			}
			if p.Type == "left" {
				return 0, true
			}
			if p.Type == "error" && p.Ref == "l" {
				c.note(func() { c.leaveRefused[string(p.Code)]++ })
				return time.Duration(p.RetryAfterMS) * time.Millisecond, false
			}
		case <-timeout:
			return 0, false
		}
	}
}

// expected is SendUS and LeaveUS for the churners whose join was answered.
func (c *churners) expected() churn.Sent {
	var q churn.Sent
	q.SendUS = make([]int64, c.n)
	q.LeaveUS = make([]int64, c.n)
	q.OnSeq = make([]uint64, c.n)
	q.OffSeq = make([]uint64, c.n)
	t := c.r.truth
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range c.n {
		if c.answered[i] {
			q.SendUS[i] = c.sendUS[i]
			q.LeaveUS[i] = c.leaveUS[i]
		}
		u := c.prefix + strconv.Itoa(i)
		q.OnSeq[i], q.OffSeq[i] = t.onSeq[u], t.offSeq[u]
	}
	return q
}

// fromNATS is expected() with each online timed from its arrival on
// NATS at this tool instead of the join's send: what the measured node
// and the member add to it. Offlines are left out.
func (c *churners) fromNATS() churn.Sent {
	q := c.expected()
	q.LeaveUS = nil
	t := c.r.truth
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range q.SendUS {
		if q.SendUS[i] != 0 {
			q.SendUS[i] = t.on[c.prefix+strconv.Itoa(i)] // 0 (skipped) if it never came
		}
	}
	return q
}

func (c *churners) answeredCount() int {
	n := 0
	for _, a := range c.answered {
		if a {
			n++
		}
	}
	return n
}

// allOffline reports whether NATS carried the offline of every answered
// churner (the truth's lock held).
func (c *churners) allOffline(t *natsTruth) bool {
	for i, a := range c.answered {
		if a {
			if _, ok := t.off[c.prefix+strconv.Itoa(i)]; !ok {
				return false
			}
		}
	}
	return true
}

func (c *churners) report(out io.Writer) {
	r := c.r
	ans := c.answeredCount()
	fmt.Fprintf(out, "churn: %d joins at %.0f/s over %v (each leaving %v later) on %s, as %s; answered %d, refused for good %d, unanswered %d, dial failed %d, retried %d (codes: %s); leaves refused %s, leaves never answered (closed instead) %d; max send lag %v; peak churner connections %d\n",
		c.n, r.b.ChurnRate, r.b.ChurnFor, r.b.ChurnHold, r.b.PopAddr, r.b.ChurnView, ans, c.refusedFinalCount, c.unanswered, c.dialFailed, c.retried, measure.Codes(c.codes),
		measure.Codes(c.leaveRefused), c.leaveUnanswered, measure.FmtDur(c.maxLag), c.peak.Load())
	var reply []time.Duration
	for i := range c.n {
		if c.answered[i] {
			reply = append(reply, time.Duration(c.replyUS[i]-c.sendUS[i])*time.Microsecond)
		}
	}
	slices.Sort(reply)
	fmt.Fprintf(out, "churner join -> its own reply: %s\n", measure.LatencyLine(reply, 0))
	var nat []time.Duration
	missing := 0
	r.truth.mu.Lock()
	for i := range c.n {
		if !c.answered[i] {
			continue
		}
		if a, ok := r.truth.on[c.prefix+strconv.Itoa(i)]; ok {
			nat = append(nat, time.Duration(a-c.sendUS[i])*time.Microsecond)
		} else {
			missing++
		}
	}
	r.truth.mu.Unlock()
	slices.Sort(nat)
	fmt.Fprintf(out, "churner join -> online on NATS: %s\n", measure.LatencyLine(nat, missing))
	r.truth.mu.Lock()
	fmt.Fprintf(out, "NATS carried %d transitions of the room; %d arrived after one with a higher seq (e.g. %s); %d repeated\n",
		len(r.truth.trans), r.truth.inversions, strings.Join(r.truth.invExamples, "; "), r.truth.dups)
	r.truth.mu.Unlock()
	if missing > 0 {
		r.fail("%d churners' onlines never reached NATS", missing)
	}
	if bad := c.n - ans; bad > 0 {
		r.fail("%d of %d churn joins not served (refused %d, unanswered %d, dial failed %d; %s; first error %s)", bad, c.n, c.refusedFinalCount, c.unanswered, c.dialFailed, measure.Codes(c.codes), c.firstErr)
	}
	if len(c.closedByNode) > 0 {
		r.fail("churner connections closed by the node: %s", measure.Codes(c.closedByNode))
	}
}

func (r *bigRun) rssLine(when string) {
	if r.rss == nil {
		return
	}
	cur, peak := r.rss.Now()
	fmt.Fprintf(r.out, "node RSS %s: %.0f MiB (peak since the last figure %.0f MiB)\n", when, float64(cur)/(1<<20), float64(peak)/(1<<20))
}

// nodeDelta prints how the measured node's presence_node_* counters moved.
func nodeDelta(out io.Writer, m0, m1 map[string]float64) {
	var parts []string
	for k, v := range m1 {
		if !strings.HasPrefix(k, "presence_node_") || strings.HasSuffix(k, "_bucket") {
			continue
		}
		if d := v - m0[k]; d != 0 {
			parts = append(parts, fmt.Sprintf("%s %+.0f", strings.TrimPrefix(k, "presence_node_"), d))
		}
	}
	slices.Sort(parts)
	fmt.Fprintf(out, "measured node's counters over the window: %s\n", strings.Join(parts, ", "))
}

// churnPhase runs the churn with g's frames counted over it, then waits
// for the room to go quiet (every churner's offline on NATS), and prints
// the frames per connection per tick, CPU and node counters.
func (r *bigRun) churnPhase(ctx context.Context, g *group, what string) (*churners, statsResp, time.Duration, error) {
	c := r.newChurn()
	if err := g.mark(); err != nil {
		return c, statsResp{}, 0, err
	}
	m0, _ := measure.Scrape(r.o.Metrics)
	cpu0 := measure.ReadMeters(r.meters)
	t0 := time.Now()
	c.run(ctx)
	fmt.Fprintf(r.out, "churn sent in %v; waiting for every churner's offline (grace %v)\n", time.Since(t0).Round(time.Millisecond), r.b.Grace)
	r.waitQuiet(ctx, "after the churn", r.b.Grace+r.b.ChurnHold+60*time.Second, c.allOffline)
	r.waitFolded(ctx, g, 30*time.Second)
	window := time.Since(t0)
	cpu := measure.Delta(cpu0, measure.ReadMeters(r.meters))
	m1, _ := measure.Scrape(r.o.Metrics)
	s, err := g.stats()
	if err != nil {
		return c, s, window, err
	}
	c.report(r.out)
	tick := r.tick
	if tick == 0 {
		tick = 100 * time.Millisecond
		fmt.Fprintln(r.out, "warning: no tick_ms in hello (the node does not batch): frames per tick use 100ms")
	}
	pt := measure.FramesPerTick(s.Frames, window, tick)
	fmt.Fprintf(r.out, "frames per %s per tick (%v) over %v: %s\n", what, tick, window.Round(time.Millisecond), pt)
	fmt.Fprintf(r.out, "frame types at %ss over the window: %s\n", what, measure.Codes64(s.Types))
	if r.b.Scenario != "watch" {
		r.target(pt.Max <= 1, "frames per %s <= 1 per tick (max %.3f)", what, pt.Max)
	}
	fmt.Fprintf(r.out, "CPU over the churn and the wait (%v), %% of one core: %s\n", window.Round(time.Millisecond), measure.FmtCPU(cpu, window))
	r.rssLine("after the churn")
	if m0 != nil && m1 != nil {
		nodeDelta(r.out, m0, m1)
	}
	r.judgeStats(what, s)
	return c, s, window, nil
}

// judgeStats fails the run on what no connection should have seen.
func (r *bigRun) judgeStats(what string, s statsResp) {
	fmt.Fprintf(r.out, "%ss: resyncs %d; error frames: %s; closed by the node: %s; anomalies: %s\n", what, s.Resyncs, measure.Codes(s.Errors), measure.Codes(s.Closed), s.Anom)
	if s.Resyncs > 0 {
		r.fail("%d unexpected resyncs at %ss (every one reads all its frames)", s.Resyncs, what)
	}
	if len(s.Closed) > 0 {
		r.fail("%s connections closed: %s", what, measure.Codes(s.Closed))
	}
	for code, n := range s.Errors {
		if code != string(protocol.CodeRateLimited) {
			r.fail("%d error frames %s at %ss", n, code, what)
		}
	}
	if s.Anom.protocolBroken() || s.Anom.Missing > 0 {
		r.fail("protocol violations at %ss: %s", what, s.Anom)
	}
}

// checkConvergence reads the truth and compares every parsing connection
// of g with it. want names what is compared, for the report.
func (r *bigRun) checkConvergence(ctx context.Context, g *group, what string, withTrans bool, window [2]time.Time) (checkResp, *presence.Snapshot) {
	v, snap, err := r.truthRead(ctx)
	if err != nil {
		r.fail("%s: truth read: %v", what, err)
		return checkResp{}, nil
	}
	maxSeq, _, _ := r.truth.state()
	fmt.Fprintf(r.out, "%s: truth read: %d members (total %d) at room_seq %d (NATS carried up to %d)\n", what, len(v), snap.Total, snap.RoomSeq, maxSeq)
	if len(v) != snap.Total {
		r.fail("%s: the truth read listed %d members, its total is %d", what, len(v), snap.Total)
	}
	req := checkReq{View: v, Total: snap.Total, Seq: snap.RoomSeq, Epoch: snap.Epoch}
	if withTrans {
		r.truth.mu.Lock()
		from, to := window[0].UnixMicro()-r.baseUS, window[1].UnixMicro()-r.baseUS
		for i, t := range r.truth.trans {
			t.InWindow = r.truth.atUS[i] >= from && r.truth.atUS[i] <= to
			req.Trans = append(req.Trans, t)
		}
		r.truth.mu.Unlock()
	}
	res, err := g.check(req)
	if err != nil {
		r.fail("%s: %v", what, err)
	}
	fmt.Fprintf(r.out, "%s: %d checked, %d differ from the truth, %d behind its room_seq; %d not compared (the node dropped them)\n", what, res.Checked, res.Wrong, res.Behind, res.Lost)
	for _, e := range res.Examples {
		fmt.Fprintf(r.out, "  %s\n", e)
	}
	if res.Wrong > 0 || res.Checked == 0 {
		r.fail("%s: CONVERGENCE FAILED: %d of %d differ from a fresh read of the room", what, res.Wrong, res.Checked)
	}
	return res, snap
}

func (r *bigRun) members(ctx context.Context) error {
	b := r.b
	spec := openSpec{Role: roleMember, Addr: r.o.Addr, Secret: r.o.Secret, Sources: r.o.Sources, Deflate: r.o.Deflate, ReadBuffer: r.b.ReadBuffer, Lowat: r.b.Lowat, Room: r.room,
		Prefix: fmt.Sprintf("m%d-", r.run), Sample: measure.Samples(b.RoomSize, b.Samples), Inflight: b.Inflight,
		ChurnPrefix: fmt.Sprintf("c%d-", r.run), ChurnN: int(b.ChurnRate * b.ChurnFor.Seconds()), BaseUS: r.baseUS}
	r.rssLine("before the fill")
	cpu0 := measure.ReadMeters(r.meters)
	g, res, err := r.openGroup(ctx, "members", spec, b.RoomSize, nil)
	if err != nil {
		return err
	}
	r.reportOpen(fmt.Sprintf("fill: members joined %s with batch", r.o.Addr), b.RoomSize, res)
	fmt.Fprintf(r.out, "CPU over the fill, %% of one core: %s\n", measure.FmtCPU(measure.Delta(cpu0, measure.ReadMeters(r.meters)), res.Took))
	r.target(res.Took <= 20*time.Second, "fill of %d <= 20s (%v)", b.RoomSize, res.Took.Round(time.Millisecond))
	r.rssLine("after the fill")
	r.waitQuiet(ctx, "after the fill", 60*time.Second, nil)
	r.waitFolded(ctx, g, 30*time.Second)
	if s, err := g.stats(); err == nil {
		r.judgeStats("member", s)
	}
	r.checkConvergence(ctx, g, "convergence after the fill", false, [2]time.Time{})

	if b.ChurnRate > 0 {
		c, _, _, err := r.churnPhase(ctx, g, "member")
		if err != nil {
			return err
		}
		rep, err := g.report(c.expected())
		if err != nil {
			return err
		}
		r.reportArrivals("sampled members", rep, b.Grace)
		r.reportWorst(rep.Worst)
		// The part of it after NATS: the measured node and the member.
		if rep, err := g.report(c.fromNATS()); err == nil {
			fmt.Fprintf(r.out, "online on NATS (at this tool) -> online at sampled members: %s\n", measure.LatencyLine(measure.ToDurations(rep.On), 0))
		}
		r.checkConvergence(ctx, g, "convergence after the churn", false, [2]time.Time{})
	}
	if b.Storm > 0 {
		if err := r.stormPhase(ctx); err != nil {
			return err
		}
		r.waitQuiet(ctx, "after the storm", 60*time.Second, nil)
		r.waitFolded(ctx, g, 30*time.Second)
		if s, err := g.stats(); err == nil {
			r.judgeStats("member", s)
		}
		r.checkConvergence(ctx, g, "convergence after the storm", false, [2]time.Time{})
	}
	return nil
}

// reportArrivals prints join -> online and leave -> offline at the
// connections that time them, and fails on onlines never seen or replaced
// by a resync.
func (r *bigRun) reportArrivals(who string, rep churn.Arrivals, grace time.Duration) {
	on := measure.ToDurations(rep.On)
	fmt.Fprintf(r.out, "join -> online at %s (%d connections, %d expected): %s; inside a resync %d, at connections the node dropped %d\n",
		who, rep.Conns, rep.Expects, measure.LatencyLine(on, rep.OnNever+rep.OnResynced+rep.LostConn), rep.OnResynced, rep.LostConn)
	off := measure.ToDurations(rep.Off)
	for i := range off {
		off[i] -= grace
	}
	fmt.Fprintf(r.out, "leave -> offline at %s, minus the %v grace (the reaper announces it): %s; inside a resync %d\n", who, grace, measure.LatencyLine(off, rep.OffNever+rep.OffResync), rep.OffResync)
	if rep.OnNever > 0 || rep.OffNever > 0 {
		r.fail("at %s: %d onlines and %d offlines MISSING (not inside a resync, connection not dropped)", who, rep.OnNever, rep.OffNever)
	}
	if rep.OnResynced+rep.OffResync > 0 {
		r.fail("at %s: %d onlines and %d offlines came only inside resync snapshots", who, rep.OnResynced, rep.OffResync)
	}
	if len(on) > 0 {
		all := append(slices.Clone(on), make([]time.Duration, rep.OnNever+rep.OnResynced+rep.LostConn)...)
		for i := len(on); i < len(all); i++ {
			all[i] = measure.Never
		}
		p99 := measure.Percentile(all, .99)
		r.target(p99 <= 500*time.Millisecond, "join -> visible at %s p99 <= 500ms (%s)", who, measure.FmtDur(p99))
	}
}

// reportWorst prints, for each 5 s of the churn (by join), how many
// churners some sampled member saw more than 500 ms after the join, and
// the slowest: whether the slow ones are spread out or come together.
func (r *bigRun) reportWorst(worst []int64) {
	per := max(1, int(5*r.b.ChurnRate))
	var parts []string
	for from := 0; from < len(worst); from += per {
		slow, top := 0, int64(0)
		for _, v := range worst[from:min(from+per, len(worst))] {
			if v > 500_000 {
				slow++
			}
			top = max(top, v)
		}
		parts = append(parts, fmt.Sprintf("%d/%s", slow, measure.FmtDur(time.Duration(top)*time.Microsecond)))
	}
	fmt.Fprintf(r.out, "churners seen later than 500ms by a sampled member / the slowest, per 5s of the churn: %s\n", strings.Join(parts, " "))
}

// stormJoin sends one storm joiner's join and waits for its snapshot,
// sending it again after an unavailable's retry_after_ms, as a client
// does (the time counts from the first try). It returns the join ->
// snapshot time, or the refusal's code ("lost": the connection failed).
func stormJoin(c *websocket.Conn, join []byte, i int, retried *atomic.Int64) (time.Duration, string) {
	t0 := time.Now()
	if c.WriteMessage(websocket.TextMessage, join) != nil {
		return 0, "lost"
	}
	_ = c.SetReadDeadline(time.Now().Add(60 * time.Second))
	for {
		_, data, err := c.ReadMessage()
		if err != nil {
			return 0, "lost"
		}
		at := time.Now() // its arrival: decoding it is the client's time
		k := frameKind(data)
		if k == "snapshot" {
			if headField(data, "ref") != "j" {
				continue
			}
			_ = c.SetReadDeadline(time.Time{})
			load.Drain(i, c)
			return at.Sub(t0), ""
		}
		if k != "error" {
			continue
		}
		var p pframe
		if json.Unmarshal(data, &p) != nil || p.Ref != "j" {
			continue
		}
		if k == "error" && p.Code == protocol.CodeUnavailable && p.RetryAfterMS > 0 && time.Since(t0) < 30*time.Second {
			retried.Add(1)
			time.Sleep(load.Jitter(time.Duration(p.RetryAfterMS) * time.Millisecond))
			if c.WriteMessage(websocket.TextMessage, join) != nil {
				return 0, "lost"
			}
			continue
		}
		return 0, string(p.Code)
	}
}

// stormPhase opens --storm connections to the measured node and has them
// all join the room at once: join -> snapshot per joiner.
func (r *bigRun) stormPhase(ctx context.Context) error {
	n := r.b.Storm
	prefix := fmt.Sprintf("s%d-", r.run)
	conns, failed, firstErr := load.OpenAll(ctx, r.dA, n, func(i int) (string, string, string) {
		return prefix + strconv.Itoa(i), "s", ""
	}, nil)
	defer load.CloseAll(conns)
	for _, c := range conns {
		if c != nil {
			_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
			_, _, _ = c.ReadMessage() // the hello
		}
	}
	before, _ := measure.Scrape(r.o.Metrics)
	lat := make([]time.Duration, n)
	var refused, lost, retried atomic.Int64
	var codeMu sync.Mutex
	codeCount := map[string]int{}
	var wg sync.WaitGroup
	gate := make(chan struct{})
	join := load.Encode(protocol.Request{Type: protocol.TypeJoin, Room: r.room, Batch: true, Ref: "j"})
	for i, c := range conns {
		if c == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			if d, code := stormJoin(c, join, i, &retried); code != "" {
				if code == "lost" {
					lost.Add(1)
					return
				}
				refused.Add(1)
				codeMu.Lock()
				codeCount[code]++
				codeMu.Unlock()
			} else {
				lat[i] = d
			}
		}()
	}
	t0 := time.Now()
	close(gate)
	wg.Wait()
	took := time.Since(t0)
	after, _ := measure.Scrape(r.o.Metrics)
	var ok []time.Duration
	for _, d := range lat {
		if d > 0 {
			ok = append(ok, d)
		}
	}
	slices.Sort(ok)
	notServed := n - len(ok)
	fmt.Fprintf(r.out, "storm: %d joins at once into the room on %s in %v; connections failed %d, retried after unavailable %d, refused %d (%s), lost %d; snapshot reads %+.0f\n",
		n, r.o.Addr, took.Round(time.Millisecond), failed, retried.Load(), refused.Load(), measure.Codes(codeCount), lost.Load(),
		after["presence_node_join_snapshot_reads_total"]-before["presence_node_join_snapshot_reads_total"])
	fmt.Fprintf(r.out, "storm join -> snapshot: %s\n", measure.LatencyLine(ok, notServed))
	if notServed > 0 {
		r.fail("storm: %d of %d joins not served (first connection error: %v)", notServed, n, firstErr)
	}
	p99 := measure.Never
	if notServed == 0 && len(ok) > 0 {
		p99 = measure.Percentile(ok, .99)
	}
	r.target(p99 <= time.Second, "storm join -> snapshot p99 <= 1s (%s)", measure.FmtDur(p99))
	r.rssLine("after the storm")
	return nil
}

// population fills the room on the second node with members joined with
// "view":"count".
func (r *bigRun) population(ctx context.Context) (*group, error) {
	spec := openSpec{Role: rolePop, Addr: r.b.PopAddr, Secret: r.o.Secret, Sources: r.o.Sources, Deflate: r.o.Deflate, ReadBuffer: r.b.ReadBuffer, Lowat: r.b.Lowat, Room: r.room,
		Prefix: fmt.Sprintf("p%d-", r.run), Inflight: r.b.Inflight}
	g, res, err := r.openGroup(ctx, "population", spec, r.b.RoomSize, nil)
	if err != nil {
		return g, err
	}
	r.reportOpen(fmt.Sprintf("population: members joined %s with view count", r.b.PopAddr), r.b.RoomSize, res)
	r.waitQuiet(ctx, "after the population", 60*time.Second, nil)
	return g, nil
}

func (r *bigRun) countScenario(ctx context.Context) error {
	b := r.b
	if _, err := r.population(ctx); err != nil {
		return err
	}
	spec := openSpec{Role: roleCount, Addr: r.o.Addr, Secret: r.o.Secret, Sources: r.o.Sources, Deflate: r.o.Deflate, ReadBuffer: r.b.ReadBuffer, Lowat: r.b.Lowat, Room: r.room,
		Prefix: fmt.Sprintf("w%d-", r.run), Inflight: b.Inflight}
	r.rssLine("before the watchers")
	g, res, err := r.openGroup(ctx, "count watchers", spec, b.Watchers, nil)
	if err != nil {
		return err
	}
	r.reportOpen(fmt.Sprintf("count watchers joined %s with view count, present false", r.o.Addr), b.Watchers, res)
	r.rssLine("with the watchers")
	if b.ChurnRate > 0 {
		if _, _, _, err := r.churnPhase(ctx, g, "count watcher"); err != nil {
			return err
		}
	}
	r.checkConvergence(ctx, g, "last count at every watcher", false, [2]time.Time{})
	return nil
}

func (r *bigRun) watchScenario(ctx context.Context) error {
	b := r.b
	if b.WatchUsers > 100 || b.WatchChurners > b.WatchUsers || b.WatchUsers-b.WatchChurners > b.RoomSize {
		return errors.New("--watch-users at most 100, --watch-churners at most --watch-users, the rest at most --room-size")
	}
	if _, err := r.population(ctx); err != nil {
		return err
	}
	nChurn := int(b.ChurnRate * b.ChurnFor.Seconds())
	rng := rand.New(rand.NewPCG(uint64(r.run), 11))
	users := make([][]string, b.Watchers)
	for i := range users {
		pick := map[string]bool{}
		for len(pick) < b.WatchUsers-b.WatchChurners {
			pick[fmt.Sprintf("p%d-%d", r.run, rng.IntN(b.RoomSize))] = true
		}
		for k := 0; k < b.WatchChurners && nChurn > 0 && k < nChurn; {
			u := fmt.Sprintf("c%d-%d", r.run, rng.IntN(nChurn))
			if !pick[u] {
				pick[u] = true
				k++
			}
		}
		for u := range pick {
			users[i] = append(users[i], u)
		}
		slices.Sort(users[i])
	}
	spec := openSpec{Role: roleWatch, Addr: r.o.Addr, Secret: r.o.Secret, Sources: r.o.Sources, Deflate: r.o.Deflate, ReadBuffer: r.b.ReadBuffer, Lowat: r.b.Lowat, Room: r.room,
		Prefix: fmt.Sprintf("w%d-", r.run), Inflight: b.Inflight,
		ChurnPrefix: fmt.Sprintf("c%d-", r.run), ChurnN: nChurn, BaseUS: r.baseUS}
	r.rssLine("before the watchers")
	g, res, err := r.openGroup(ctx, "watchers", spec, b.Watchers, users)
	if err != nil {
		return err
	}
	r.reportOpen(fmt.Sprintf("watchers of %d users each on %s", b.WatchUsers, r.o.Addr), b.Watchers, res)
	r.rssLine("with the watchers")
	var frames []int64
	var window [2]time.Time
	if b.ChurnRate > 0 {
		window[0] = time.Now()
		c, s, _, err := r.churnPhase(ctx, g, "watcher")
		if err != nil {
			return err
		}
		window[1] = time.Now()
		frames = s.Frames
		rep, err := g.report(c.expected())
		if err != nil {
			return err
		}
		r.reportArrivals("watchers (their churning users)", rep, b.Grace)
	}
	res2, _ := r.checkConvergence(ctx, g, "watchers' views of their users", true, window)
	if frames != nil {
		r.watchRatio(frames, res2.Expected)
	}
	return nil
}

// watchRatio prints frames per watcher against the transitions of its
// users over the same window.
func (r *bigRun) watchRatio(frames, expected []int64) {
	var opened []int64
	for _, f := range frames {
		if f >= 0 {
			opened = append(opened, f)
		}
	}
	if len(opened) != len(expected) {
		fmt.Fprintf(r.out, "watch ratio: %d watchers' frames against %d expectations: not comparable\n", len(opened), len(expected))
		return
	}
	var sf, se int64
	minR, maxR := -1.0, 0.0
	var exps []int64
	for i := range opened {
		sf += opened[i]
		se += expected[i]
		exps = append(exps, expected[i])
		if expected[i] > 0 {
			x := measure.Ratio(float64(opened[i]), float64(expected[i]))
			maxR = max(maxR, x)
			if minR < 0 || x < minR {
				minR = x
			}
		}
	}
	slices.Sort(exps)
	fmt.Fprintf(r.out, "watch: frames per watcher mean %.2f; transitions of its users in the window mean %.2f (median %d, max %d); frames / transitions %.3f overall, per watcher %.3f..%.3f\n",
		float64(sf)/float64(len(opened)), float64(se)/float64(len(opened)), exps[len(exps)/2], exps[len(exps)-1], measure.Ratio(float64(sf), float64(se)), max(minR, 0), maxR)
}

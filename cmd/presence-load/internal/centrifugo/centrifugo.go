// Package centrifugo is the side by side with Centrifugo v6: the
// centrifugo mode (a big channel churned until it breaks, its
// subscribers in centrifugo-worker child processes), cf-idle and
// cf-latency (Centrifugo measured as idle and latency measure a node) and
// versus (the four runs as one table). It speaks Centrifugo's JSON
// protocol itself (cfproto.go).
package centrifugo

import (
	"bytes"
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

	"github.com/presence-dev/presence/cmd/presence-load/internal/bigroom"
	"github.com/presence-dev/presence/cmd/presence-load/internal/churn"
	"github.com/presence-dev/presence/cmd/presence-load/internal/latency"
	"github.com/presence-dev/presence/cmd/presence-load/internal/load"
	"github.com/presence-dev/presence/cmd/presence-load/internal/measure"
	"github.com/presence-dev/presence/cmd/presence-load/internal/worker"
)

// The centrifugo mode: the side by side with Centrifugo v6 where it
// applies, join/leave events in a channel of 15,000 subscribers. It
// mirrors the bigroom members scenario as far as Centrifugo's model goes:
//
//   - fill: --room-size subscribers, each its own connection (HS256 token,
//     user m<run>-i) subscribed to one channel with "join_leave":true, in
//     centrifugo-worker child processes of at most --per-process each;
//     the fill time, then the time until every join push of the fill has
//     reached its subscribers (each join is one push to every subscriber
//     already there: about n²/2 pushes);
//   - churn, at each rate of --rates in turn: extra connections (users
//     c<run>-<step>-i, connected beforehand) subscribe on an absolute
//     schedule, stay --churn-hold and unsubscribe; the join and leave push
//     of each is timed at --samples subscribers (missing ones rank as
//     never seen), frames and pushes per subscriber per second are counted
//     at every subscriber, and Centrifugo's CPU and RSS read from /proc of
//     --node-pid. A step breaks when a subscriber's connection is closed,
//     a sampled push is missing or the join p99 passes 500 ms (the bigroom
//     target); the steps stop there.
//
// Centrifugo has no batching of join/leave: every join and every leave is
// one push to every subscriber (several may share a WebSocket frame when a
// connection's queue holds more than one). Its leave is pushed at the
// unsubscribe; presence's offline follows the offline grace.

// cfOpen asks a centrifugo-worker to open subscribers From..To-1.
type cfOpen struct {
	Addr     string `json:"addr"`
	Secret   string `json:"secret"`
	Sources  string `json:"sources"`
	Channel  string `json:"channel"`
	Prefix   string `json:"prefix"`
	From     int    `json:"from"`
	To       int    `json:"to"`
	Sample   []int  `json:"sample,omitempty"`
	Inflight int    `json:"inflight"`
	BaseUS   int64  `json:"base_us"`
	// ReadBuffer is each WebSocket's read buffer (0: the dialer's 512).
	ReadBuffer int `json:"read_buffer,omitempty"`
}

// cfStep starts a churn step at the worker: counters marked, churners
// Prefix+i (i < N) timed at the sampled subscribers.
type cfStep struct {
	Prefix string `json:"prefix"`
	N      int    `json:"n"`
}

type cfOpenResp struct {
	load.Tally
	Version string `json:"version,omitempty"`
}

// cfStatsResp is what a worker's subscribers read since the last step
// mark (all of it before the first).
type cfStatsResp struct {
	Frames []int64          `json:"frames"` // per subscriber (-1: never opened)
	Msgs   []int64          `json:"msgs"`   // messages per subscriber
	Kinds  map[string]int64 `json:"kinds"`  // messages by kind, all subscribers
	Closed map[string]int   `json:"closed"` // subscribers' connections that ended, by reason
	Pongs  int64            `json:"pongs"`
	Bad    []string         `json:"bad,omitempty"`
	// Sampled subscribers: join/leave pushes since the mark, and when the
	// last one came (µs since the base).
	SampleJoins  int64 `json:"sample_joins"`
	SampleLeaves int64 `json:"sample_leaves"`
	LastUS       int64 `json:"last_us"`
}

// cfConn is one subscriber of a worker.
type cfConn struct {
	w    *cfWorker
	user string
	load.Conn
	replies chan cfMsg
	frames  atomic.Int64
	// Messages by kind, cumulative.
	msgs, joins, leaves, pings, other atomic.Int64
	markF, markM                      int64

	sampled bool       // times the churners' pushes (track set)
	mu      sync.Mutex // guards track and lost
	track   *cfTrack
	lost    bool
}

type cfWorker struct {
	mu      sync.Mutex
	conns   []*cfConn
	sample  map[int]bool
	spec    *cfOpen
	closed  map[string]int
	bad     []string
	pongs   atomic.Int64
	kinds0  map[string]int64
	markSet bool
}

var cfBufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// readLoop reads every frame until the connection ends: each message is
// counted by kind, pings answered, replies handed to the opener and, at a
// sampled subscriber, join and leave pushes timed.
func (c *cfConn) readLoop() {
	for {
		_, r, err := c.WS.NextReader()
		if err != nil {
			if !c.Ending() {
				c.w.gone(load.CloseReason(err))
				c.mu.Lock()
				c.lost = true
				c.mu.Unlock()
			}
			return
		}
		at := time.Now()
		buf := cfBufPool.Get().(*bytes.Buffer)
		buf.Reset()
		if _, err := buf.ReadFrom(r); err != nil {
			cfBufPool.Put(buf)
			continue
		}
		c.frames.Add(1)
		c.frame(buf.Bytes(), at)
		if buf.Cap() <= 1<<20 {
			cfBufPool.Put(buf)
		}
	}
}

func (c *cfConn) frame(data []byte, at time.Time) {
	var joins, leaves, pings, other int64
	n := cfLines(data, func(line []byte) {
		kind := cfClassify(line)
		switch kind {
		case cfPing:
			pings++
			// Answered at once, as a client does (else Centrifugo closes
			// the connection after the pong timeout).
			if c.Send([]byte("{}")) == nil {
				c.w.pongs.Add(1)
			}
		case cfJoin, cfLeave:
			if kind == cfJoin {
				joins++
			} else {
				leaves++
			}
			if c.sampled {
				k, ch, user, err := cfJoinLeave(line)
				c.mu.Lock()
				if err != nil {
					c.w.badf("%s: %v: %.120s", c.user, err, line)
				} else {
					c.track.see(k, ch, user, at.UnixMicro()-c.w.spec.BaseUS)
				}
				c.mu.Unlock()
			}
		case cfReply, cfErrReply:
			other++
			var m cfMsg
			if err := json.Unmarshal(line, &m); err != nil {
				c.w.badf("%s: reply: %v", c.user, err)
				return
			}
			select {
			case c.replies <- m:
			default:
			}
		case cfBad:
			other++
			c.w.badf("%s: unreadable message %.120s", c.user, line)
		default:
			other++
		}
	})
	c.msgs.Add(int64(n))
	c.joins.Add(joins)
	c.leaves.Add(leaves)
	c.pings.Add(pings)
	c.other.Add(other)
}

func (w *cfWorker) badf(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.bad) < 5 {
		w.bad = append(w.bad, fmt.Sprintf(format, args...))
	}
}

func (w *cfWorker) gone(why string) {
	w.mu.Lock()
	w.closed[why]++
	w.mu.Unlock()
}

// cfDial opens a WebSocket to Centrifugo's /connection/websocket from the
// next source address.
func cfDial(ctx context.Context, d *load.Dialer) (*websocket.Conn, error) {
	wd := d.WebSocket()
	wd.EnableCompression = false
	ws, _, err := wd.DialContext(ctx, "ws://"+d.Addr()+"/connection/websocket", nil)
	return ws, err
}

// cfAwait waits for the reply with id on replies.
func cfAwait(replies <-chan cfMsg, id uint32, d time.Duration) (cfMsg, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case m, ok := <-replies:
			if !ok {
				return m, errors.New("connection closed")
			}
			if m.ID != id {
				continue
			}
			if e := m.errText(); e != "" {
				return m, &load.Refusal{Code: strconv.Itoa(int(m.Error.Code)), Msg: m.Error.Message}
			}
			return m, nil
		case <-t.C:
			return cfMsg{}, fmt.Errorf("no reply to command %d in %v", id, d)
		}
	}
}

func cfConnectCmd(id int, token string) []byte {
	t, _ := json.Marshal(token)
	return []byte(`{"id":` + strconv.Itoa(id) + `,"connect":{"token":` + string(t) + `,"name":"presence-load"}}`)
}

func cfSubscribeCmd(id int, channel string, joinLeave bool) []byte {
	ch, _ := json.Marshal(channel)
	jl := ""
	if joinLeave {
		jl = `,"join_leave":true`
	}
	return []byte(`{"id":` + strconv.Itoa(id) + `,"subscribe":{"channel":` + string(ch) + jl + `}}`)
}

// cfPresenceCmd asks for a channel's presence (the client must be
// subscribed to it).
func cfPresenceCmd(id int, channel string) []byte {
	ch, _ := json.Marshal(channel)
	return []byte(`{"id":` + strconv.Itoa(id) + `,"presence":{"channel":` + string(ch) + `}}`)
}

func cfUnsubscribeCmd(id int, channel string) []byte {
	ch, _ := json.Marshal(channel)
	return []byte(`{"id":` + strconv.Itoa(id) + `,"unsubscribe":{"channel":` + string(ch) + `}}`)
}

func (w *cfWorker) open(ctx context.Context, spec *cfOpen) (cfOpenResp, error) {
	if spec == nil || spec.To < spec.From {
		return cfOpenResp{}, errors.New("open: bad spec")
	}
	d, err := load.NewDialer(load.Options{Addr: spec.Addr, Secret: spec.Secret, Sources: spec.Sources, ReadBuffer: spec.ReadBuffer})
	if err != nil {
		return cfOpenResp{}, err
	}
	w.mu.Lock()
	w.spec = spec
	w.sample = map[int]bool{}
	for _, i := range spec.Sample {
		w.sample[i] = true
	}
	w.mu.Unlock()
	n := spec.To - spec.From
	conns := make([]*cfConn, n)
	var resp cfOpenResp
	var mu sync.Mutex // guards resp.Version
	resp.Tally = load.OpenEach(ctx, n, spec.Inflight, func(k int) error {
		i := spec.From + k
		c := &cfConn{w: w, user: spec.Prefix + strconv.Itoa(i), replies: make(chan cfMsg, 4)}
		if w.sample[i] {
			c.sampled, c.track = true, newCfTrack(spec.Channel, "", 0)
		}
		version, err := c.open(ctx, d, spec)
		if err != nil {
			return err
		}
		mu.Lock()
		resp.Version = version
		mu.Unlock()
		conns[k] = c
		return nil
	})
	w.mu.Lock()
	w.conns = append(w.conns, conns...)
	w.mu.Unlock()
	return resp, ctx.Err()
}

// open connects with the user's token and subscribes with join_leave.
func (c *cfConn) open(ctx context.Context, d *load.Dialer, spec *cfOpen) (string, error) {
	ws, err := cfDial(ctx, d)
	if err != nil {
		return "", err
	}
	c.WS = ws
	go c.readLoop()
	fail := func(err error) (string, error) { c.End(); return "", err }
	tok, err := load.SignToken(spec.Secret, c.user, false)
	if err != nil {
		return fail(err)
	}
	if err := c.Send(cfConnectCmd(1, tok)); err != nil {
		return fail(err)
	}
	m, err := cfAwait(c.replies, 1, 60*time.Second)
	if err != nil {
		return fail(fmt.Errorf("connect: %w", err))
	}
	version := ""
	if m.Connect != nil {
		version = m.Connect.Version
	}
	if err := c.Send(cfSubscribeCmd(2, spec.Channel, true)); err != nil {
		return fail(err)
	}
	if _, err := cfAwait(c.replies, 2, 60*time.Second); err != nil {
		return fail(fmt.Errorf("subscribe: %w", err))
	}
	return version, nil
}

func (w *cfWorker) each(f func(c *cfConn)) {
	w.mu.Lock()
	conns := slices.Clone(w.conns)
	w.mu.Unlock()
	for _, c := range conns {
		if c != nil {
			f(c)
		}
	}
}

func (w *cfWorker) kinds() map[string]int64 {
	m := map[string]int64{}
	w.each(func(c *cfConn) {
		m[cfJoin] += c.joins.Load()
		m[cfLeave] += c.leaves.Load()
		m[cfPing] += c.pings.Load()
		m["other"] += c.other.Load()
	})
	return m
}

func (w *cfWorker) step(s *cfStep) {
	w.each(func(c *cfConn) {
		c.markF, c.markM = c.frames.Load(), c.msgs.Load()
		if c.sampled {
			c.mu.Lock()
			c.track = newCfTrack(w.spec.Channel, s.Prefix, s.N)
			c.mu.Unlock()
		}
	})
	k := w.kinds()
	w.mu.Lock()
	w.kinds0, w.markSet = k, true
	w.mu.Unlock()
}

func (w *cfWorker) stats() cfStatsResp {
	s := cfStatsResp{Kinds: map[string]int64{}, Closed: map[string]int{}}
	k := w.kinds()
	w.mu.Lock()
	for key, v := range k {
		s.Kinds[key] = v - w.kinds0[key]
	}
	for key, v := range w.closed {
		s.Closed[key] = v
	}
	s.Bad = slices.Clone(w.bad)
	conns := slices.Clone(w.conns)
	w.mu.Unlock()
	s.Pongs = w.pongs.Load()
	for _, c := range conns {
		if c == nil {
			s.Frames = append(s.Frames, -1)
			s.Msgs = append(s.Msgs, -1)
			continue
		}
		s.Frames = append(s.Frames, c.frames.Load()-c.markF)
		s.Msgs = append(s.Msgs, c.msgs.Load()-c.markM)
		if c.sampled {
			c.mu.Lock()
			s.SampleJoins += c.track.joins
			s.SampleLeaves += c.track.leaves
			s.LastUS = max(s.LastUS, c.track.lastAnyUS)
			c.mu.Unlock()
		}
	}
	return s
}

func (w *cfWorker) report(req *churn.Sent) cfReport {
	var out cfReport
	w.each(func(c *cfConn) {
		if !c.sampled {
			return
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		c.track.report(req, c.lost, &out)
	})
	return out
}

func (w *cfWorker) closeAll() {
	w.each(func(c *cfConn) {
		c.End()
	})
}

// WorkerMain is a centrifugo-worker: it serves its parent's requests on
// in and out (package worker) until closed.
func WorkerMain(ctx context.Context, in io.Reader, out io.Writer) error {
	w := &cfWorker{closed: map[string]int{}, kinds0: map[string]int64{}, spec: &cfOpen{}}
	defer w.closeAll()
	return worker.Serve(ctx, in, out, map[string]worker.Op{
		"open":         worker.Handle(func(ctx context.Context, spec cfOpen) (any, error) { return w.open(ctx, &spec) }),
		"step":         worker.Handle(func(_ context.Context, st cfStep) (any, error) { w.step(&st); return struct{}{}, nil }),
		"stats":        func(context.Context, json.RawMessage) (any, error) { return w.stats(), nil },
		"report":       worker.Handle(func(_ context.Context, req churn.Sent) (any, error) { return w.report(&req), nil }),
		worker.OpClose: worker.Do(w.closeAll),
	})
}

// cfRun is one centrifugo run.
type cfRun struct {
	o       load.Options
	b       bigroom.Options
	out     io.Writer
	run     uint32
	channel string
	baseUS  int64
	d       *load.Dialer
	workers []*worker.Proc
	meters  []measure.Meter
	rss     *measure.RSSWatch
	fails   []string
}

func (r *cfRun) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.fails = append(r.fails, msg)
	fmt.Fprintln(r.out, "FAIL:", msg)
}

func (r *cfRun) each(f func(i int, w *worker.Proc) error) error { return worker.Each(r.workers, f) }

func (r *cfRun) stats() (cfStatsResp, error) {
	all := cfStatsResp{Kinds: map[string]int64{}, Closed: map[string]int{}}
	res := make([]cfStatsResp, len(r.workers))
	err := r.each(func(i int, w *worker.Proc) error { return w.Call("stats", nil, &res[i]) })
	for _, x := range res {
		all.Frames = append(all.Frames, x.Frames...)
		all.Msgs = append(all.Msgs, x.Msgs...)
		for k, v := range x.Kinds {
			all.Kinds[k] += v
		}
		for k, v := range x.Closed {
			all.Closed[k] += v
		}
		all.Pongs += x.Pongs
		all.Bad = append(all.Bad, x.Bad...)
		all.SampleJoins += x.SampleJoins
		all.SampleLeaves += x.SampleLeaves
		all.LastUS = max(all.LastUS, x.LastUS)
	}
	return all, err
}

// Run is the centrifugo mode: the channel filled, then churned at each
// rate of --rates until Centrifugo breaks.
func Run(ctx context.Context, o load.Options, b bigroom.Options, out io.Writer) error {
	if o.Sweep == "" {
		o.Sweep = "10,25,50,100"
	}
	if !o.Given["churn-for"] {
		b.ChurnFor = 20 * time.Second
	}
	rates, err := latency.ParseRates(o.Sweep)
	if err != nil {
		return err
	}
	if b.PerProcess < 1 || b.PerProcess > 19000 {
		return errors.New("--per-process must be 1..19000 (the open-files limit per process is 20,000)")
	}
	if o.Secret == "" {
		return errors.New("--jwt-secret: Centrifugo's client.token.hmac_secret_key is needed")
	}
	r := &cfRun{o: o, b: b, out: out, run: rand.Uint32(), baseUS: time.Now().UnixMicro()}
	r.channel = fmt.Sprintf("big%d", r.run)
	if r.d, err = load.NewDialer(o); err != nil {
		return err
	}
	r.meters = []measure.Meter{measure.MachineMeter()}
	if b.NodePID > 0 {
		r.meters = append([]measure.Meter{measure.ProcMeter("centrifugo", b.NodePID)}, r.meters...)
		r.rss = measure.WatchRSS(b.NodePID)
		defer r.rss.Stop()
	} else {
		fmt.Fprintln(out, "warning: no --node-pid: Centrifugo's CPU and RSS are not read")
	}
	r.meters = append(r.meters, measure.SelfMeter())
	defer func() {
		for _, w := range r.workers {
			w.Stop()
		}
	}()
	fmt.Fprintf(out, "centrifugo: channel %s on %s; %d subscribers with join_leave, %d per worker process; churn rates %v joins/s (as many leaves/s) for %v each, each churner unsubscribing %v after its subscribe\n",
		r.channel, o.Addr, b.RoomSize, b.PerProcess, rates, b.ChurnFor, b.ChurnHold)
	if err := r.fill(ctx); err != nil {
		r.fail("%v", err)
	} else {
		r.steps(ctx, rates)
		r.presenceStats(ctx)
	}
	if len(r.fails) > 0 {
		return fmt.Errorf("FAIL: %s", strings.Join(r.fails, "; "))
	}
	fmt.Fprintln(out, "result: OK (the run completed; see the steps for where Centrifugo broke)")
	return nil
}

// steps churns at each rate in turn until one breaks Centrifugo, and says
// which held.
func (r *cfRun) steps(ctx context.Context, rates []float64) {
	held, broke := 0.0, 0.0
	for k, rate := range rates {
		ok, err := r.step(ctx, k, rate)
		if err != nil {
			r.fail("step %v/s: %v", rate, err)
			break
		}
		if !ok {
			broke = rate
			break
		}
		held = rate
	}
	switch {
	case broke > 0 && held > 0:
		fmt.Fprintf(r.out, "centrifugo: held %.0f joins/s + %.0f leaves/s; broke at %.0f/s\n", held, held, broke)
	case broke > 0:
		fmt.Fprintf(r.out, "centrifugo: broke at the first rate, %.0f/s\n", broke)
	case held > 0:
		fmt.Fprintf(r.out, "centrifugo: held every rate up to %.0f joins/s + %.0f leaves/s\n", held, held)
	}
}

func (r *cfRun) rssLine(when string) {
	if r.rss == nil {
		return
	}
	cur, peak := r.rss.Now()
	fmt.Fprintf(r.out, "centrifugo RSS %s: %.0f MiB (peak since the last figure %.0f MiB)\n", when, float64(cur)/(1<<20), float64(peak)/(1<<20))
}

func (r *cfRun) fill(ctx context.Context) error {
	b := r.b
	n := b.RoomSize
	nw := (n + b.PerProcess - 1) / b.PerProcess
	sample := measure.Samples(n, b.Samples)
	for range nw {
		w, err := worker.Start("centrifugo-worker")
		if err != nil {
			return err
		}
		r.workers = append(r.workers, w)
		r.meters = append(r.meters, measure.ProcMeter(fmt.Sprintf("worker %d", len(r.workers)), w.Pid()))
	}
	r.rssLine("before the fill")
	cpu0 := measure.ReadMeters(r.meters)
	t0 := time.Now()
	res := make([]cfOpenResp, nw)
	err := r.each(func(k int, w *worker.Proc) error {
		spec := cfOpen{Addr: r.o.Addr, Secret: r.o.Secret, Sources: r.o.Sources, Channel: r.channel,
			Prefix: fmt.Sprintf("m%d-", r.run), From: k * n / nw, To: (k + 1) * n / nw, Inflight: b.Inflight, BaseUS: r.baseUS, ReadBuffer: b.ReadBuffer}
		for _, i := range sample {
			if i >= spec.From && i < spec.To {
				spec.Sample = append(spec.Sample, i)
			}
		}
		return w.Call("open", &spec, &res[k])
	})
	took := time.Since(t0)
	opened, failed, version, firstErr := 0, 0, "", ""
	codesAll := map[string]int{}
	for _, x := range res {
		opened += x.Opened
		failed += x.Failed
		if x.Version != "" {
			version = x.Version
		}
		if firstErr == "" {
			firstErr = x.FirstErr
		}
		for c, v := range x.Codes {
			codesAll[c] += v
		}
	}
	fmt.Fprintf(r.out, "centrifugo version (connect reply): %s\n", version)
	fmt.Fprintf(r.out, "fill: %d of %d subscribed with join_leave in %v (%.0f/s); failed %d (%s; first error: %s)\n",
		opened, n, took.Round(time.Millisecond), float64(opened)/took.Seconds(), failed, measure.Codes(codesAll), firstErr)
	if err != nil {
		return err
	}
	if failed > 0 {
		// Centrifugo breaking is a result, not a failure of the tool.
		fmt.Fprintf(r.out, "fill: BROKE: %d of %d subscribes failed (%s)\n", failed, n, firstErr)
	}
	// The fill's join pushes are still on their way: wait until no
	// subscriber reads anything for the settle time.
	drained := r.waitQuiet(ctx, 10*time.Minute)
	total := time.Since(t0)
	s, err := r.stats()
	if err != nil {
		return err
	}
	cpu := measure.Delta(cpu0, measure.ReadMeters(r.meters))
	frames, msgs := sum64(s.Frames), sum64(s.Msgs)
	fmt.Fprintf(r.out, "fill pushes: %d join pushes delivered (n(n-1)/2 = %d) in %v after the first subscribe (drained %v after the last), %.0f pushes/s; %d frames (%.1f messages per frame)\n",
		s.Kinds[cfJoin], cfFillPushes(n), total.Round(time.Millisecond), drained.Round(time.Millisecond), float64(s.Kinds[cfJoin])/total.Seconds(), frames, measure.Ratio(float64(msgs), float64(frames)))
	fmt.Fprintf(r.out, "CPU over the fill and its pushes (%v), %% of one core: %s\n", total.Round(time.Millisecond), measure.FmtCPU(cpu, total))
	r.rssLine("after the fill")
	if len(s.Closed) > 0 {
		fmt.Fprintf(r.out, "fill: BROKE: subscribers' connections closed by Centrifugo: %s (3012: no pong in time; 3008: slow)\n", measure.Codes(s.Closed))
	}
	if len(s.Bad) > 0 {
		fmt.Fprintf(r.out, "unreadable messages: %s\n", strings.Join(s.Bad, " | "))
	}
	return nil
}

func sum64(v []int64) int64 {
	var s int64
	for _, x := range v {
		if x > 0 {
			s += x
		}
	}
	return s
}

// waitQuiet waits until the subscribers' message count stops moving for
// the settle time (at most bound) and returns how long it took.
func (r *cfRun) waitQuiet(ctx context.Context, bound time.Duration) time.Duration {
	t0 := time.Now()
	last, lastMove := int64(-1), time.Now()
	for ctx.Err() == nil && time.Since(t0) < bound {
		s, err := r.stats()
		if err != nil {
			r.fail("stats: %v", err)
			return time.Since(t0)
		}
		m := sum64(s.Msgs) - s.Kinds[cfPing] // pings come every 25 s whatever happens
		if m != last {
			last, lastMove = m, time.Now()
		} else if time.Since(lastMove) >= r.b.Settle {
			return lastMove.Sub(t0)
		}
		time.Sleep(250 * time.Millisecond)
	}
	r.fail("not quiet within %v", bound)
	return time.Since(t0)
}

// cfChurn is one step's churners.
type cfChurn struct {
	r                         *cfRun
	prefix                    string
	n                         int
	rate                      float64
	sendUS, replyUS, leaveUS  []int64
	mu                        sync.Mutex
	codes                     map[string]int
	dialFailed, unanswered    int
	leaveUnanswered           int
	firstErr                  string
	maxLag                    time.Duration
	peak, live                atomic.Int64
	closedByServer            map[string]int
	connectFailed, subRefused int
}

func (c *cfChurn) note(f func()) { c.mu.Lock(); f(); c.mu.Unlock() }

func (c *cfChurn) run(ctx context.Context) {
	// As bigroom's churners: each connects in the second before its
	// subscribe.
	churn.Pacer{Rate: c.rate, Lead: time.Second}.Go(ctx, c.n, func(i int, at time.Time) { c.one(ctx, i, at) })
}

// one is churner i: connect, subscribe at `at` (without join_leave: it
// reads no pushes, as bigroom's churners join with the count view),
// unsubscribe --churn-hold later, close.
func (c *cfChurn) one(ctx context.Context, i int, at time.Time) {
	r := c.r
	c.peak.Store(max(c.peak.Load(), c.live.Add(1)))
	defer c.live.Add(-1)
	ws, err := cfDial(ctx, r.d)
	if err != nil {
		c.note(func() {
			c.dialFailed++
			if c.firstErr == "" {
				c.firstErr = err.Error()
			}
		})
		return
	}
	conn := &cfConn{Conn: load.Conn{WS: ws}, replies: make(chan cfMsg, 4), w: &cfWorker{closed: map[string]int{}, spec: &cfOpen{}}}
	defer conn.End()
	go func() {
		conn.readLoop()
		close(conn.replies)
	}()
	user := c.prefix + strconv.Itoa(i)
	tok, err := load.SignToken(r.o.Secret, user, false)
	if err == nil {
		err = conn.Send(cfConnectCmd(1, tok))
	}
	if err == nil {
		_, err = cfAwait(conn.replies, 1, 30*time.Second)
	}
	if err != nil {
		c.note(func() {
			c.connectFailed++
			if c.firstErr == "" {
				c.firstErr = "connect: " + err.Error()
			}
		})
		return
	}
	if d := time.Until(at); d > 0 {
		time.Sleep(d)
	}
	now := time.Now()
	c.note(func() { c.maxLag = max(c.maxLag, now.Sub(at)) })
	send := now.UnixMicro() - r.baseUS
	if conn.Send(cfSubscribeCmd(2, r.channel, false)) != nil {
		c.note(func() { c.unanswered++ })
		return
	}
	if _, err := cfAwait(conn.replies, 2, 30*time.Second); err != nil {
		var re *load.Refusal
		c.note(func() {
			if errors.As(err, &re) {
				c.subRefused++
				c.codes[re.Code]++
			} else {
				c.unanswered++
			}
			if c.firstErr == "" {
				c.firstErr = "subscribe: " + err.Error()
			}
		})
		return
	}
	c.sendUS[i] = send
	c.replyUS[i] = time.Now().UnixMicro() - r.baseUS
	if d := time.Until(at.Add(r.b.ChurnHold)); d > 0 {
		time.Sleep(d)
	}
	c.leaveUS[i] = time.Now().UnixMicro() - r.baseUS
	if conn.Send(cfUnsubscribeCmd(3, r.channel)) == nil {
		if _, err := cfAwait(conn.replies, 3, 30*time.Second); err == nil {
			return
		}
	}
	// Closing the connection unsubscribes too (its leave follows the close).
	c.note(func() { c.leaveUnanswered++ })
}

// closedSince counts, by reason, the closes in now that were not in then.
func closedSince(then, now map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range now {
		if d := v - then[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// cfBroken says why a churn step broke Centrifugo (none: it held):
// subscribers closed, pushes never seen, subscribes not served, or a join
// push p99 over 500 ms.
func cfBroken(newClosed map[string]int, rep cfReport, answered, n int, on []time.Duration) []string {
	var why []string
	if len(newClosed) > 0 {
		why = append(why, "subscribers closed: "+measure.Codes(newClosed))
	}
	if rep.OnNever+rep.OffNever+rep.LostConn > 0 {
		why = append(why, fmt.Sprintf("%d joins and %d leaves never pushed to a sampled subscriber (%d at closed ones)", rep.OnNever+rep.LostConn, rep.OffNever, rep.LostConn))
	}
	if answered < n {
		why = append(why, fmt.Sprintf("%d of %d churn subscribes not served", n-answered, n))
	}
	if len(on) > 0 {
		all := append(slices.Clone(on), make([]time.Duration, rep.OnNever+rep.LostConn)...)
		for i := len(on); i < len(all); i++ {
			all[i] = measure.Never
		}
		if p99 := measure.Percentile(all, .99); p99 > 500*time.Millisecond {
			why = append(why, "join -> push p99 "+measure.FmtDur(p99)+" > 500ms")
		}
	}
	return why
}

// arrivals asks every worker when the churners' pushes came to its
// sampled subscribers, and sums their answers.
func (r *cfRun) arrivals(c *cfChurn) (cfReport, error) {
	var rep cfReport
	req := churn.Sent{SendUS: c.sendUS, LeaveUS: c.leaveUS}
	res := make([]cfReport, len(r.workers))
	err := r.each(func(i int, w *worker.Proc) error { return w.Call("report", &req, &res[i]) })
	for _, x := range res {
		rep.add(x)
	}
	return rep, err
}

// replies counts the churners' subscribes that were answered, with their
// subscribe -> reply times, sorted.
func (c *cfChurn) replies() (int, []time.Duration) {
	var reply []time.Duration
	for i := range c.n {
		if c.sendUS[i] > 0 {
			reply = append(reply, time.Duration(c.replyUS[i]-c.sendUS[i])*time.Microsecond)
		}
	}
	slices.Sort(reply)
	return len(reply), reply
}

// step runs one churn step; false when Centrifugo broke in it.
func (r *cfRun) step(ctx context.Context, k int, rate float64) (bool, error) {
	b := r.b
	n := int(rate * b.ChurnFor.Seconds())
	c := &cfChurn{r: r, prefix: fmt.Sprintf("c%d-%d-", r.run, k), n: n, rate: rate,
		sendUS: make([]int64, n), replyUS: make([]int64, n), leaveUS: make([]int64, n),
		codes: map[string]int{}, closedByServer: map[string]int{}}
	s0, err := r.stats()
	if err != nil {
		return false, err
	}
	if err := r.each(func(_ int, w *worker.Proc) error {
		return w.Call("step", &cfStep{Prefix: c.prefix, N: n}, nil)
	}); err != nil {
		return false, err
	}
	fmt.Fprintf(r.out, "\n== step %d: %.0f joins/s + %.0f leaves/s for %v (%d churners)\n", k+1, rate, rate, b.ChurnFor, n)
	cpu0 := measure.ReadMeters(r.meters)
	t0 := time.Now()
	c.run(ctx)
	sent := time.Since(t0)
	r.waitQuiet(ctx, 2*time.Minute)
	window := time.Since(t0)
	cpu := measure.Delta(cpu0, measure.ReadMeters(r.meters))
	s, err := r.stats()
	if err != nil {
		return false, err
	}
	rep, err := r.arrivals(c)
	if err != nil {
		return false, err
	}
	answered, reply := c.replies()
	fmt.Fprintf(r.out, "churn: sent in %v; %d subscribes answered of %d (refused %d: %s; unanswered %d; connect failed %d; dial failed %d; first error %s); unsubscribes unanswered %d; max send lag %v; peak churner connections %d\n",
		sent.Round(time.Millisecond), answered, n, c.subRefused, measure.Codes(c.codes), c.unanswered, c.connectFailed, c.dialFailed, c.firstErr, c.leaveUnanswered, measure.FmtDur(c.maxLag), c.peak.Load())
	fmt.Fprintf(r.out, "churner subscribe -> its reply: %s\n", measure.LatencyLine(reply, 0))
	on, off := measure.ToDurations(rep.On), measure.ToDurations(rep.Off)
	fmt.Fprintf(r.out, "subscribe -> join push at %d sampled subscribers (%d expected): %s; at connections Centrifugo closed %d\n",
		rep.Conns, rep.Expects, measure.LatencyLine(on, rep.OnNever+rep.LostConn), rep.LostConn)
	fmt.Fprintf(r.out, "unsubscribe -> leave push at the sampled subscribers: %s\n", measure.LatencyLine(off, rep.OffNever))
	fmt.Fprintf(r.out, "pushes repeated %d; of another channel or unknown churners %d\n", rep.Dups, rep.Foreign)
	// The workers count frames and messages from the step's mark.
	fpt := measure.FramesPerTick(s.Frames, window, time.Second)
	mpt := measure.FramesPerTick(s.Msgs, window, time.Second)
	fmt.Fprintf(r.out, "frames per subscriber per second over %v: mean %.1f, max %.1f (%d frames); messages per subscriber per second: mean %.1f, max %.1f (%d messages: join %d, leave %d, ping %d, other %d; %.1f per frame)\n",
		window.Round(time.Millisecond), fpt.Mean, fpt.Max, fpt.Total, mpt.Mean, mpt.Max, mpt.Total, s.Kinds[cfJoin], s.Kinds[cfLeave], s.Kinds[cfPing], s.Kinds["other"], measure.Ratio(float64(mpt.Total), float64(fpt.Total)))
	expectPush := int64(answered) * int64(b.RoomSize)
	fmt.Fprintf(r.out, "join pushes delivered %d, expected about %d (answered subscribes x subscribers); leave pushes %d\n", s.Kinds[cfJoin], expectPush, s.Kinds[cfLeave])
	fmt.Fprintf(r.out, "CPU over the churn and the drain (%v), %% of one core: %s\n", window.Round(time.Millisecond), measure.FmtCPU(cpu, window))
	r.rssLine("after the step")
	newClosed := closedSince(s0.Closed, s.Closed)
	fmt.Fprintf(r.out, "subscribers closed by Centrifugo in the step: %s (all so far: %s); pongs sent %d\n", measure.Codes(newClosed), measure.Codes(s.Closed), s.Pongs)
	if len(s.Bad) > 0 {
		fmt.Fprintf(r.out, "unreadable messages: %s\n", strings.Join(s.Bad, " | "))
	}
	why := cfBroken(newClosed, rep, answered, n, on)
	ok := len(why) == 0
	if ok {
		fmt.Fprintf(r.out, "step %d: held %.0f/s\n", k+1, rate)
	} else {
		fmt.Fprintf(r.out, "step %d: BROKE at %.0f/s: %s\n", k+1, rate, strings.Join(why, "; "))
	}
	return ok, nil
}

// presenceStats reads the channel's presence_stats from a fresh
// connection (subscribed without join_leave): Centrifugo's own count of
// the channel's clients.
func (r *cfRun) presenceStats(ctx context.Context) {
	ws, err := cfDial(ctx, r.d)
	if err != nil {
		fmt.Fprintf(r.out, "presence_stats: %v\n", err)
		return
	}
	conn := &cfConn{Conn: load.Conn{WS: ws}, replies: make(chan cfMsg, 4), w: &cfWorker{closed: map[string]int{}, spec: &cfOpen{}}}
	defer conn.End()
	go conn.readLoop()
	tok, _ := load.SignToken(r.o.Secret, fmt.Sprintf("o%d", r.run), false)
	_ = conn.Send(cfConnectCmd(1, tok))
	if _, err := cfAwait(conn.replies, 1, 30*time.Second); err != nil {
		fmt.Fprintf(r.out, "presence_stats: connect: %v\n", err)
		return
	}
	_ = conn.Send(cfSubscribeCmd(2, r.channel, false))
	if _, err := cfAwait(conn.replies, 2, 30*time.Second); err != nil {
		fmt.Fprintf(r.out, "presence_stats: subscribe: %v\n", err)
		return
	}
	ch, _ := json.Marshal(r.channel)
	_ = conn.Send([]byte(`{"id":3,"presence_stats":{"channel":` + string(ch) + `}}`))
	m, err := cfAwait(conn.replies, 3, 30*time.Second)
	if err != nil || m.PresenceStats == nil {
		fmt.Fprintf(r.out, "presence_stats: %v\n", err)
		return
	}
	s, _ := r.stats()
	closed := 0
	for _, v := range s.Closed {
		closed += v
	}
	fmt.Fprintf(r.out, "presence_stats of the channel: %d clients, %d users (the subscribers still open: %d, plus this reader)\n",
		m.PresenceStats.NumClients, m.PresenceStats.NumUsers, r.b.RoomSize-closed)
}

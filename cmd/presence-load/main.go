// Command presence-load measures an edge node under load from a separate
// process, talking to it only as clients and operators do: WebSocket,
// NATS, the node's /metrics, Redis's INFO and nats-server's CPU.
//
// Modes:
//
//   - idle: many idle sessions; the node's RSS per session, and the CPU of
//     the node, Redis and nats-server over the same window, per 10k
//     sessions.
//   - latency: joins at a fixed rate on an absolute schedule. Every join is
//     a user's first session in its room, so it produces exactly one
//     online event, which is awaited on two paths: a NATS subscriber on
//     presence.<region>.> and a watcher WebSocket joined to the room
//     beforehand. Every join is accounted for: seen (late ones with their
//     real latency), missing, replaced by a resync snapshot (WebSocket
//     path), or refused by the node. A join never seen on a path ranks as
//     infinitely late in that path's percentiles, and anything missing,
//     replaced or refused fails the run.
//   - sweep: the latency run at increasing rates against the same node,
//     with fresh users, rooms and connections per step, the node left to
//     go quiet between steps; then the highest rate within the p99 target
//     and the first rate past the collapse bound.
//   - storm: joins at once into a large room; join -> snapshot times.
//   - bigroom: docs/PROTOCOL.md "Big rooms" at 15,000 members: fill,
//     churn, storm (members taking `events`), count-only watchers, watch
//     lists; frames per member per tick, join -> visible, and views checked
//     against a fresh read of the room (bigroom.go). Its connections live
//     in bigroom-worker child processes.
//   - centrifugo: the side by side with Centrifugo v6: a
//     channel of 15,000 subscribers with join_leave, filled, then churned
//     at increasing rates until Centrifugo breaks (centrifugo.go). Its
//     connections live in centrifugo-worker child processes.
//   - reconnect: the reconnect storm, 200,000 sessions back within
//     a minute on one Redis, driven on the store by stand-ins for nodes
//     that use the node's own join limiter and extender (reconnect.go).
//   - hog: busy-loops goroutines (a CPU tenant beside the node; latency
//     --hog N starts one as a child process).
//
// Requests are bounded in count and time and go only to the addresses
// given (loopback). Connections per run stay under --max-conns, itself
// under this process's open-files limit.
package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/gorilla/websocket"

	"github.com/presence-dev/presence/protocol"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "presence-load:", err)
		os.Exit(1)
	}
}

type options struct {
	addr, metrics, natsURL, region string
	secret, sources                string
	sessions, perRoom              int
	members, joiners               int
	rate                           float64
	hold, duration                 time.Duration
	insecure                       bool
	deflate                        bool
	readBuffer                     int // a WebSocket's read buffer; 0: 512 bytes

	// latency and sweep
	sweep          string
	late, straggle time.Duration
	quiesce        time.Duration
	maxConns       int
	okP99, badP99  time.Duration
	hog, threads   int
	baseConns      float64 // the node's connections before this tool opened any
	redis          string
	natsPID        int
	natsMonitor    string
}

const usage = "usage: presence-load idle|latency|sweep|storm|bigroom|centrifugo|cf-idle|cf-latency|versus|reconnect|hog|region [flags] (-h for the flags of a mode)"

// runRegion runs the region mode, which has its own flags, or its child
// (region-driver: a node's sessions on the store).
func runRegion(ctx context.Context, args []string, out io.Writer) error {
	if args[0] == "region-driver" {
		return regionDriverMain(ctx, args[1:], os.Stdin, out)
	}
	if args[0] == "region" {
		return regionMode(ctx, args[1:], out)
	}
	return errors.New(usage)
}

// runOwn runs the modes that parse their own flags, and the child
// processes of the others; ok false for the rest.
func runOwn(ctx context.Context, args []string, out io.Writer) (ok bool, err error) {
	switch {
	case len(args) == 0:
		return false, nil
	case args[0] == "bigroom-worker":
		// A child of the bigroom mode: requests on stdin, replies on stdout.
		raiseFileLimit()
		return true, bigWorkerMain(ctx, os.Stdin, out)
	case strings.HasPrefix(args[0], "region"):
		return true, runRegion(ctx, args, out)
	case args[0] == "reconnect":
		raiseFileLimit()
		return true, reconnect(ctx, args[1:], out)
	case args[0] == "versus":
		return true, versus(args[1:], out)
	case args[0] == "centrifugo-worker":
		raiseFileLimit()
		return true, cfWorkerMain(ctx, os.Stdin, out)
	}
	return false, nil
}

func run(ctx context.Context, args []string, out io.Writer) error {
	if ok, err := runOwn(ctx, args, out); ok {
		return err
	}
	modes := []string{"idle", "latency", "sweep", "storm", "bigroom", "centrifugo", "cf-idle", "cf-latency", "hog"}
	if len(args) == 0 || !slices.Contains(modes, args[0]) {
		return errors.New(usage)
	}
	mode := args[0]
	fs := flag.NewFlagSet("presence-load "+mode, flag.ContinueOnError)
	var o options
	registerFlags(fs, &o)
	var big bigOpts
	registerBigFlags(fs, &big)
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q; %s", fs.Args(), usage)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if o.metrics == "" {
		o.metrics = "http://" + o.addr + "/metrics"
	}
	o.insecure = o.secret == ""
	if o.perRoom == 0 {
		o.perRoom = 50
		if mode == "idle" || mode == "cf-idle" {
			o.perRoom = 100
		}
	}
	if mode == "hog" {
		if !set["duration"] {
			o.duration = 0
		}
		return hog(ctx, o, out)
	}
	limit := raiseFileLimit()
	switch mode {
	case "idle":
		return idle(ctx, o, out)
	case "cf-idle":
		return cfIdle(ctx, o, big.nodePID, out)
	case "cf-latency":
		return cfLatency(ctx, o, out)
	case "storm":
		return storm(ctx, o, out)
	case "bigroom":
		return bigroom(ctx, o, big, out)
	case "centrifugo":
		if o.sweep == "" {
			o.sweep = "10,25,50,100"
		}
		if !set["churn-for"] {
			big.churnFor = 20 * time.Second
		}
		return centrifugo(ctx, o, big, out)
	case "sweep":
		if o.sweep == "" {
			o.sweep = "250,500,1000,1500,2000"
		}
	}
	if o.rate <= 0 || o.perRoom < 1 || o.maxConns < o.perRoom+1 {
		return errors.New("--rate must be positive, --per-room at least 1 and --max-conns above --per-room")
	}
	// Keep headroom under the open-files limit for NATS, HTTP and the
	// runtime's own descriptors.
	if uint64(o.maxConns)+256 > limit {
		fmt.Fprintf(out, "--max-conns %d lowered to %d: this process may open %d files\n", o.maxConns, limit-256, limit)
		o.maxConns = int(limit - 256)
	}
	return latency(ctx, o, out)
}

// registerFlags registers the flags of every mode but bigroom's.
func registerFlags(fs *flag.FlagSet, o *options) {
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8080", "node address (host:port)")
	fs.StringVar(&o.metrics, "metrics", "", "node metrics URL (default http://ADDR/metrics)")
	fs.StringVar(&o.natsURL, "nats", "nats://127.0.0.1:4222", "NATS URL (latency, sweep)")
	fs.StringVar(&o.region, "region", "local", "the node's region")
	fs.StringVar(&o.secret, "jwt-secret", "", "HS256 secret of the node (empty: --insecure-dev node)")
	fs.BoolVar(&o.deflate, "deflate", false, "offer permessage-deflate, as browsers do: a batched room's events frames then come compressed (connections that do not fold their view read them off the socket without inflating them)")
	fs.StringVar(&o.sources, "sources", "127.0.0.1,127.0.0.2,127.0.0.3,127.0.0.4", "loopback source addresses to spread connections over")
	fs.IntVar(&o.sessions, "sessions", 15000, "idle: connections to open (each one session in one room)")
	fs.IntVar(&o.perRoom, "per-room", 0, "sessions per room (default: idle 100; latency and sweep 50 joins per room, plus its watcher)")
	fs.DurationVar(&o.hold, "hold", 60*time.Second, "idle: how long to hold them and measure CPU")
	fs.Float64Var(&o.rate, "rate", 1000, "latency: joins per second")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "latency, sweep: how long to join at each rate (cut by --max-conns); hog: how long to run (0: until stopped)")
	fs.StringVar(&o.sweep, "rates", "", "sweep: comma-separated join rates, lowest first (default 250,500,1000,1500,2000)")
	fs.StringVar(&o.sweep, "sweep", "", "latency: run a sweep over these comma-separated rates (same as the sweep mode's --rates)")
	fs.DurationVar(&o.late, "late", time.Second, "latency, sweep: an event seen later than this after its join counts as late (it still enters the percentiles)")
	fs.DurationVar(&o.straggle, "straggle", 30*time.Second, "latency, sweep: how long after the last join to wait for events still due")
	fs.DurationVar(&o.quiesce, "quiesce", 0, "latency, sweep: after a run, wait up to this long for its users' offline events and the node's connections to drop (default: sweep 90s, latency none)")
	fs.IntVar(&o.maxConns, "max-conns", 12000, "latency, sweep: at most this many WebSockets per run (joiners + watchers); longer runs are cut")
	fs.DurationVar(&o.okP99, "ok-p99", 25*time.Millisecond, "sweep: the p99 target")
	fs.DurationVar(&o.badP99, "bad-p99", 100*time.Millisecond, "sweep: the p99 that marks a collapse")
	fs.IntVar(&o.hog, "hog", 0, "latency, sweep: run a presence-load hog child process with this many busy goroutines during the runs")
	fs.IntVar(&o.threads, "threads", 2, "hog: busy goroutines")
	fs.StringVar(&o.redis, "redis", "", "idle, latency, sweep: Redis host:port (or redis:// URL) whose INFO cpu to read")
	fs.IntVar(&o.natsPID, "nats-pid", 0, "idle, latency, sweep: nats-server's pid: its CPU from /proc/PID/stat (exact; preferred)")
	fs.StringVar(&o.natsMonitor, "nats-monitor", "", "idle, latency, sweep: nats-server's monitoring URL (http://host:port): its CPU from /varz, sampled each second (when --nats-pid is not given)")
	fs.IntVar(&o.members, "members", 10000, "storm: members in the room before the storm")
	fs.IntVar(&o.joiners, "joiners", 1000, "storm: connections that join the room at once")
}

// raiseFileLimit lifts the soft open-files limit to the hard one and
// returns the soft limit in force.
func raiseFileLimit() uint64 {
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) != nil {
		return 1024
	}
	if l.Cur < l.Max {
		l.Cur = l.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
		_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l)
	}
	return l.Cur
}

type dialer struct {
	o       options
	sources []*net.TCPAddr
	n       atomic.Int64
}

func newDialer(o options) (*dialer, error) {
	d := &dialer{o: o}
	for _, s := range strings.Split(o.sources, ",") {
		ip := net.ParseIP(strings.TrimSpace(s))
		if ip == nil || !ip.IsLoopback() {
			return nil, fmt.Errorf("--sources: %q is not a loopback address", s)
		}
		d.sources = append(d.sources, &net.TCPAddr{IP: ip})
	}
	return d, nil
}

// readBuffer is a WebSocket's read buffer: small (the client side of the
// test must fit in RAM too) unless the scenario asks for more.
func (d *dialer) readBuffer() int { return cmp.Or(d.o.readBuffer, 512) }

// dial opens one WebSocket for user/session, from the next source address,
// with small buffers (the client side of the test must fit in RAM too).
func (d *dialer) dial(ctx context.Context, user, session string) (*websocket.Conn, error) {
	return d.dialToken(ctx, user, session, false)
}

// dialToken is dial with a token that carries "observe":true when observe
// is set (a client that may follow a room without being in it).
func (d *dialer) dialToken(ctx context.Context, user, session string, observe bool) (*websocket.Conn, error) {
	src := d.sources[int(d.n.Add(1))%len(d.sources)]
	wd := websocket.Dialer{
		ReadBufferSize: d.readBuffer(), WriteBufferSize: 512, HandshakeTimeout: 10 * time.Second, EnableCompression: d.o.deflate,
		NetDialContext: (&net.Dialer{LocalAddr: src, Timeout: 10 * time.Second}).DialContext,
	}
	u := fmt.Sprintf("ws://%s/v1/ws?session=%s", d.o.addr, session)
	if d.o.insecure {
		u += "&user=" + user
	} else {
		tok, err := signToken(d.o.secret, user, observe)
		if err != nil {
			return nil, err
		}
		u += "&access_token=" + tok
	}
	ws, _, err := wd.DialContext(ctx, u, nil)
	return ws, err
}

// signToken mints a client token for user, granting every room for an
// hour.
func signToken(secret, user string, observe bool) (string, error) {
	claims := jwt.MapClaims{"sub": user, "rooms": []string{"*"}, "exp": time.Now().Add(time.Hour).Unix()}
	if observe {
		claims["observe"] = true
	}
	return jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString([]byte(secret))
}

// joinRoom sends a join and reads until its snapshot (or an error) comes.
func joinRoom(ws *websocket.Conn, room string) error {
	join := []byte(`{"type":"join","ref":"j","room":"` + room + `"}`)
	if err := ws.WriteMessage(websocket.TextMessage, join); err != nil {
		return err
	}
	_ = ws.SetReadDeadline(time.Now().Add(30 * time.Second))
	defer func() { _ = ws.SetReadDeadline(time.Time{}) }()
	for {
		_, data, err := ws.ReadMessage()
		if err != nil {
			return err
		}
		s := string(data)
		if strings.HasPrefix(s, `{"type":"snapshot"`) && strings.Contains(s, `"ref":"j"`) {
			return nil
		}
		if !strings.HasPrefix(s, `{"type":"error"`) {
			continue
		}
		// unavailable: sent again after retry_after_ms with the client's
		// own jitter, as the JS client does, within the read deadline.
		var p pframe
		if json.Unmarshal(data, &p) != nil || p.Code != protocol.CodeUnavailable || p.RetryAfterMS <= 0 {
			return errors.New(s)
		}
		time.Sleep(jitter(time.Duration(p.RetryAfterMS) * time.Millisecond))
		if err := ws.WriteMessage(websocket.TextMessage, join); err != nil {
			return err
		}
	}
}

// metric reads one sample of a Prometheus text-format metric.
func metric(url, name string) (float64, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, name+" ") {
			return strconv.ParseFloat(strings.TrimSpace(line[len(name)+1:]), 64)
		}
	}
	return 0, fmt.Errorf("%s not in %s", name, url)
}

func idle(ctx context.Context, o options, out io.Writer) error {
	d, err := newDialer(o)
	if err != nil {
		return err
	}
	meters, err := newMeters(o, true)
	if err != nil {
		return err
	}
	rss0, err := metric(o.metrics, "process_resident_memory_bytes")
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "node RSS before: %.1f MiB\n", rss0/(1<<20))
	run := rand.Uint32()
	start := time.Now()
	conns, failed, firstErr := openAll(ctx, d, o.sessions, func(i int) (string, string, string) {
		return fmt.Sprintf("u%d-%d", run, i), fmt.Sprintf("s%d", i), fmt.Sprintf("load%d-%d", run, i/o.perRoom)
	}, drain)
	defer closeAll(conns)
	open := o.sessions - failed
	fmt.Fprintf(out, "opened %d sessions in %v (%d failed", open, time.Since(start).Round(time.Millisecond), failed)
	if firstErr != nil {
		fmt.Fprintf(out, "; first error: %v", firstErr)
	}
	fmt.Fprintln(out, ")")
	// Let the node settle (GC, first heartbeat round) before measuring.
	settle := min(o.hold/3, 20*time.Second)
	select {
	case <-time.After(settle):
	case <-ctx.Done():
		return ctx.Err()
	}
	cpu0 := readMeters(meters)
	t0 := time.Now()
	select {
	case <-time.After(o.hold - settle):
	case <-ctx.Done():
		return ctx.Err()
	}
	cpu := cpuDelta(cpu0, readMeters(meters))
	window := time.Since(t0)
	rss1, err := metric(o.metrics, "process_resident_memory_bytes")
	if err != nil {
		return err
	}
	if open == 0 {
		return errors.New("no session opened")
	}
	perSession := (rss1 - rss0) / float64(open)
	fmt.Fprintf(out, "node RSS with %d sessions: %.1f MiB; per session: %.1f KiB\n", open, rss1/(1<<20), perSession/1024)
	if err := reportIdleCPU(out, cpu, window, open); err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("FAIL: %d of %d sessions failed to open", failed, o.sessions)
	}
	return nil
}

// reportIdleCPU prints the CPU of each process over the window, as % of
// one core, and the same per 10k of the open sessions; the sum is node +
// Redis + NATS.
func reportIdleCPU(out io.Writer, cpu []cpuReading, window time.Duration, open int) error {
	var sum float64
	var per []string
	for _, r := range cpu {
		if r.err != nil {
			return fmt.Errorf("%s CPU (%s): %w", r.name, r.source, r.err)
		}
		pct := r.secs / window.Seconds() * 100
		if r.name == "machine" || r.name == "load tool" {
			// Context, not a cost of the sessions.
			continue
		}
		sum += pct
		fmt.Fprintf(out, "%s idle CPU over %.0fs: %.2f%% of one core (%s)\n", r.name, window.Seconds(), pct, r.source)
		per = append(per, fmt.Sprintf("%s %.2f%%", r.name, pct*10000/float64(open)))
	}
	fmt.Fprintf(out, "CPU per 10k sessions, %% of one core: %s; sum %.2f%%\n", strings.Join(per, ", "), sum*10000/float64(open))
	if len(cpu) < 5 {
		fmt.Fprintln(out, "(the sum covers only the processes above: give --redis and --nats-pid or --nats-monitor for the rest)")
	}
	fmt.Fprintf(out, "context, %% of one core: %s\n", fmtCPU(cpu, window))
	if pct, ok := otherCPU(cpu, window); ok && pct > disturbedCPU {
		fmt.Fprintf(out, "warning: other processes used %.0f%% of a core during the window; the CPU figures may be disturbed\n", pct)
	}
	return nil
}

// openAll opens n connections, 64 at a time; name gives connection i's
// user, session and room ("" joins none). onOpen, if not nil, is called
// with each open (and joined) connection; it must start reading it, as a
// client does: one that does not read is closed as a slow consumer, and
// gorilla answers pings inside ReadMessage. drain is the onOpen that reads
// and drops every frame. It returns the connections (nil where one
// failed), the failures and the first error.
func openAll(ctx context.Context, d *dialer, n int, name func(i int) (user, session, room string), onOpen func(i int, ws *websocket.Conn)) ([]*websocket.Conn, int, error) {
	conns := make([]*websocket.Conn, n)
	var wg sync.WaitGroup
	var failed atomic.Int64
	var firstErr atomic.Pointer[error]
	sem := make(chan struct{}, 64)
	for i := range n {
		if ctx.Err() != nil {
			failed.Add(int64(n - i))
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			user, session, room := name(i)
			ws, err := d.dial(ctx, user, session)
			if err == nil && room != "" {
				if err = joinRoom(ws, room); err != nil {
					ws.Close()
				}
			}
			if err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, &err)
				return
			}
			conns[i] = ws
			if onOpen != nil {
				onOpen(i, ws)
			}
		}()
	}
	wg.Wait()
	var first error
	if e := firstErr.Load(); e != nil {
		first = *e
	}
	return conns, int(failed.Load()), first
}

// storm fills a room with members, then has joiners join it all at once,
// and reports each joiner's join -> snapshot time and how many snapshot
// reads the node made for the storm (joiners of one room share reads).
func storm(ctx context.Context, o options, out io.Writer) error {
	d, err := newDialer(o)
	if err != nil {
		return err
	}
	run := rand.Uint32()
	room := fmt.Sprintf("storm%d", run)
	start := time.Now()
	members, failedMembers, _ := openAll(ctx, d, o.members, func(i int) (string, string, string) {
		return fmt.Sprintf("m%d-%d", run, i), "s", room
	}, drain)
	defer closeAll(members)
	ok := o.members - failedMembers
	fmt.Fprintf(out, "room of %d members filled in %v (%d failed)\n", ok, time.Since(start).Round(time.Millisecond), failedMembers)
	joiners, _, _ := openAll(ctx, d, o.joiners, func(i int) (string, string, string) {
		return fmt.Sprintf("j%d-%d", run, i), "s", ""
	}, nil)
	defer closeAll(joiners)
	for _, c := range joiners {
		// Drain the hello, so the join's reply is what joinRoom reads.
		if c != nil {
			_, _, _ = c.ReadMessage()
		}
	}
	before, err := metric(o.metrics, "presence_node_join_snapshot_reads_total")
	if err != nil {
		return err
	}
	lat := make([]time.Duration, len(joiners))
	failed := atomic.Int64{}
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i, c := range joiners {
		if c == nil {
			failed.Add(1)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			t0 := time.Now()
			if joinRoom(c, room) != nil {
				failed.Add(1)
				return
			}
			lat[i] = time.Since(t0)
		}()
	}
	t0 := time.Now()
	close(gate)
	wg.Wait()
	elapsed := time.Since(t0)
	after, err := metric(o.metrics, "presence_node_join_snapshot_reads_total")
	if err != nil {
		return err
	}
	lat = slices.DeleteFunc(lat, func(d time.Duration) bool { return d == 0 })
	if len(lat) == 0 {
		return errors.New("no joiner got its snapshot")
	}
	slices.Sort(lat)
	q := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	fmt.Fprintf(out, "%d joins at once into a room of %d in %v (%d failed); %.0f snapshot reads\n",
		len(lat), ok, elapsed.Round(time.Millisecond), failed.Load(), after-before)
	fmt.Fprintf(out, "join -> snapshot: p50 %v  p90 %v  p99 %v  max %v\n",
		q(0.50).Round(10*time.Microsecond), q(0.90).Round(10*time.Microsecond), q(0.99).Round(10*time.Microsecond), lat[len(lat)-1].Round(10*time.Microsecond))
	return nil
}

// drain reads and drops every frame of ws until it ends.
func drain(_ int, ws *websocket.Conn) {
	go func() {
		// NextReader reads the previous message's rest off the socket
		// without copying (or inflating) it.
		for {
			if _, _, err := ws.NextReader(); err != nil {
				return
			}
		}
	}()
}

func closeAll(conns []*websocket.Conn) {
	for _, c := range conns {
		if c != nil {
			c.Close()
		}
	}
}

// startPiped starts cmd, one of this tool's child processes, with pipes to
// its stdin and stdout and its stderr on ours. The kernel kills it when
// this process dies, however it dies.
func startPiped(cmd *exec.Cmd) (io.WriteCloser, io.ReadCloser, error) {
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	return in, out, cmd.Start()
}

// Command presence-load measures an edge node under load from a separate
// process: memory and CPU with many idle sessions (idle), and the time
// from a join to the online event on NATS (latency). Requests are bounded
// in count and time and go only to the addresses given (loopback).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
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
	"github.com/nats-io/nats.go"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/presence"
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
}

func run(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 || (args[0] != "idle" && args[0] != "latency" && args[0] != "storm") {
		return errors.New("usage: presence-load idle|latency|storm [flags]")
	}
	mode := args[0]
	fs := flag.NewFlagSet("presence-load "+mode, flag.ContinueOnError)
	var o options
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8080", "node address (host:port)")
	fs.StringVar(&o.metrics, "metrics", "", "node metrics URL (default http://ADDR/metrics)")
	fs.StringVar(&o.natsURL, "nats", "nats://127.0.0.1:4222", "NATS URL (latency mode)")
	fs.StringVar(&o.region, "region", "local", "the node's region")
	fs.StringVar(&o.secret, "jwt-secret", "", "HS256 secret of the node (empty: --insecure-dev node)")
	fs.StringVar(&o.sources, "sources", "127.0.0.1,127.0.0.2,127.0.0.3,127.0.0.4", "loopback source addresses to spread connections over")
	fs.IntVar(&o.sessions, "sessions", 15000, "idle: connections to open (each one session in one room)")
	fs.IntVar(&o.perRoom, "per-room", 100, "sessions per room")
	fs.DurationVar(&o.hold, "hold", 60*time.Second, "idle: how long to hold them and measure CPU")
	fs.Float64Var(&o.rate, "rate", 1000, "latency: joins per second")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "latency: how long to join at that rate")
	fs.IntVar(&o.members, "members", 10000, "storm: members in the room before the storm")
	fs.IntVar(&o.joiners, "joiners", 1000, "storm: connections that join the room at once")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if o.metrics == "" {
		o.metrics = "http://" + o.addr + "/metrics"
	}
	o.insecure = o.secret == ""
	raiseFileLimit()
	switch mode {
	case "idle":
		return idle(ctx, o, out)
	case "storm":
		return storm(ctx, o, out)
	}
	return latency(ctx, o, out)
}

// raiseFileLimit lifts the soft open-files limit to the hard one.
func raiseFileLimit() {
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) == nil && l.Cur < l.Max {
		l.Cur = l.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
	}
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

// dial opens one WebSocket for user/session, from the next source address,
// with small buffers (the client side of the test must fit in RAM too).
func (d *dialer) dial(ctx context.Context, user, session string) (*websocket.Conn, error) {
	src := d.sources[int(d.n.Add(1))%len(d.sources)]
	wd := websocket.Dialer{
		ReadBufferSize: 512, WriteBufferSize: 512, HandshakeTimeout: 10 * time.Second,
		NetDialContext: (&net.Dialer{LocalAddr: src, Timeout: 10 * time.Second}).DialContext,
	}
	u := fmt.Sprintf("ws://%s/v1/ws?session=%s", d.o.addr, session)
	if d.o.insecure {
		u += "&user=" + user
	} else {
		tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
			"sub": user, "rooms": []string{"*"}, "exp": time.Now().Add(time.Hour).Unix(),
		}).SignedString([]byte(d.o.secret))
		if err != nil {
			return nil, err
		}
		u += "&access_token=" + tok
	}
	ws, _, err := wd.DialContext(ctx, u, nil)
	return ws, err
}

// joinRoom sends a join and reads until its snapshot (or an error) comes.
func joinRoom(ws *websocket.Conn, room string) error {
	if err := ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"join","ref":"j","room":"`+room+`"}`)); err != nil {
		return err
	}
	_ = ws.SetReadDeadline(time.Now().Add(30 * time.Second))
	defer ws.SetReadDeadline(time.Time{})
	for {
		_, data, err := ws.ReadMessage()
		if err != nil {
			return err
		}
		s := string(data)
		if strings.HasPrefix(s, `{"type":"snapshot"`) && strings.Contains(s, `"ref":"j"`) {
			return nil
		}
		if strings.HasPrefix(s, `{"type":"error"`) {
			return errors.New(s)
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
	rss0, err := metric(o.metrics, "process_resident_memory_bytes")
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "node RSS before: %.1f MiB\n", rss0/(1<<20))
	run := rand.Uint32()
	start := time.Now()
	conns, failed, firstErr := openAll(ctx, d, o.sessions, func(i int) (string, string, string) {
		return fmt.Sprintf("u%d-%d", run, i), fmt.Sprintf("s%d", i), fmt.Sprintf("load%d-%d", run, i/o.perRoom)
	}, true)
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
	cpu0, err := metric(o.metrics, "process_cpu_seconds_total")
	if err != nil {
		return err
	}
	t0 := time.Now()
	select {
	case <-time.After(o.hold - settle):
	case <-ctx.Done():
		return ctx.Err()
	}
	cpu1, _ := metric(o.metrics, "process_cpu_seconds_total")
	window := time.Since(t0).Seconds()
	rss1, _ := metric(o.metrics, "process_resident_memory_bytes")
	perSession := (rss1 - rss0) / float64(open)
	cpuPct := (cpu1 - cpu0) / window * 100
	fmt.Fprintf(out, "node RSS with %d sessions: %.1f MiB; per session: %.1f KiB\n", open, rss1/(1<<20), perSession/1024)
	fmt.Fprintf(out, "node idle CPU over %.0fs: %.2f%% of one core; per 10k sessions: %.2f%%\n", window, cpuPct, cpuPct*10000/float64(open))
	return nil
}

func latency(ctx context.Context, o options, out io.Writer) error {
	d, err := newDialer(o)
	if err != nil {
		return err
	}
	nc, err := nats.Connect(o.natsURL)
	if err != nil {
		return err
	}
	defer nc.Close()
	run := rand.Uint32()
	prefix := fmt.Sprintf("l%d-", run)
	var mu sync.Mutex
	sent := map[string]time.Time{}
	var lat []time.Duration
	sub, err := nc.Subscribe(bus.RegionFilter(o.region), func(m *nats.Msg) {
		now := time.Now()
		t, err := bus.DecodeEvent(m.Data)
		if err != nil || t.Kind != presence.Online || !strings.HasPrefix(t.User, prefix) {
			return
		}
		mu.Lock()
		if at, ok := sent[t.User]; ok {
			lat = append(lat, now.Sub(at))
			delete(sent, t.User)
		}
		mu.Unlock()
	})
	if err != nil {
		return err
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		return err
	}
	total := int(o.rate * o.duration.Seconds())
	// Connect first, so the measurement is the join alone.
	conns, _, _ := openAll(ctx, d, total, func(i int) (string, string, string) {
		return fmt.Sprintf("%s%d", prefix, i), "s", ""
	}, true)
	defer closeAll(conns)
	// Join i is sent at start + i/rate (an absolute schedule: a late send
	// does not push the later ones back).
	interval := time.Duration(float64(time.Second) / o.rate)
	start := time.Now()
	for i, ws := range conns {
		if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
			time.Sleep(wait)
		}
		if ws == nil || ctx.Err() != nil {
			continue
		}
		user := fmt.Sprintf("%s%d", prefix, i)
		mu.Lock()
		sent[user] = time.Now()
		mu.Unlock()
		// Rooms of 50; each join is a user's first session: one online.
		_ = ws.WriteMessage(websocket.TextMessage, []byte(fmt.Sprintf(`{"type":"join","room":"%sr%d"}`, prefix, i/50)))
	}
	elapsed := time.Since(start)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		mu.Lock()
		left := len(sent)
		mu.Unlock()
		if left == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(lat)
	if len(lat) == 0 {
		return errors.New("no online events seen")
	}
	q := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	fmt.Fprintf(out, "%d joins at %.0f/s over %v (achieved %.0f/s); %d online events seen, %d missing\n",
		total, o.rate, o.duration, float64(total)/elapsed.Seconds(), len(lat), len(sent))
	fmt.Fprintf(out, "join -> online on NATS: p50 %v  p90 %v  p99 %v  max %v\n",
		q(0.50).Round(10*time.Microsecond), q(0.90).Round(10*time.Microsecond), q(0.99).Round(10*time.Microsecond), lat[len(lat)-1].Round(10*time.Microsecond))
	return nil
}

// openAll opens n connections, 64 at a time; name gives connection i's
// user, session and room ("" joins none). With drain, each connection's
// frames are read (and dropped) from then on, as a client does: one that
// does not read is closed as a slow consumer, and gorilla answers pings
// inside ReadMessage. It returns the connections (nil where one failed),
// the failures and the first error.
func openAll(ctx context.Context, d *dialer, n int, name func(i int) (user, session, room string), drain bool) ([]*websocket.Conn, int, error) {
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
			if drain {
				go func() {
					for {
						if _, _, err := ws.ReadMessage(); err != nil {
							return
						}
					}
				}()
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
	}, true)
	defer closeAll(members)
	ok := o.members - failedMembers
	fmt.Fprintf(out, "room of %d members filled in %v (%d failed)\n", ok, time.Since(start).Round(time.Millisecond), failedMembers)
	joiners, _, _ := openAll(ctx, d, o.joiners, func(i int) (string, string, string) {
		return fmt.Sprintf("j%d-%d", run, i), "s", ""
	}, false)
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

func closeAll(conns []*websocket.Conn) {
	for _, c := range conns {
		if c != nil {
			c.Close()
		}
	}
}

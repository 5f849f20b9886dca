package main

// An opt-in soak of the webhook dispatcher (PRESENCE_WEBHOOK_SOAK=20m):
// two real nodes on one redis-server and a nats-server process
// (JetStream) restarted now and then, two `presenced webhooks` processes
// sharing four lanes, handed over gracefully (SIGTERM, then a new one)
// and sometimes SIGKILLed, four receivers (healthy, flapping 200/503,
// slow, cut mid-request), and a steady churn of WebSocket joins, leaves
// and dropped connections. It logs each lane's timeline and checks, once
// the churn stopped and the lanes caught up: no loss, no reorder, no
// stall past the watchdog bound of docs/WEBHOOKS.md, no duplicate from a
// graceful handover.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/webhook"
)

// The soak's lane settings. stallBound is docs/WEBHOOKS.md's watchdog
// bound for them: max_backoff + timeout + 2 gap_timeout + max_wait +
// lease TTL + 1 s.
const (
	soakTimeout    = 5 * time.Second
	soakMaxBackoff = 2 * time.Second
	soakGap        = 3 * time.Second
	soakMaxWait    = 100 * time.Millisecond
	soakLeaseTTL   = 10 * time.Second
	soakStallBound = soakMaxBackoff + soakTimeout + 2*soakGap + soakMaxWait + soakLeaseTTL + time.Second
)

var soakEndpoints = []string{"healthy", "flappy", "slow", "cutter"}

// soakReq is one request a receiver got.
type soakReq struct {
	arrive, end time.Time
	by          string // the dispatcher process that sent it
	hookID      string
	items       []hookItem
	outcome     string // ok, 503, cut, lost (answered 2xx, the answer did not reach the sender)
}

// soakSink is one receiver; mode says how it answers.
type soakSink struct {
	name string
	srv  *httptest.Server
	s    *soak
	mu   sync.Mutex
	reqs []*soakReq
	rnd  *rand.Rand
}

// soak is the run: its processes, its faults, its receivers.
type soak struct {
	t     *testing.T
	e     *env
	start time.Time
	nats  *natsProc
	cfg   string

	mu      sync.Mutex
	procs   map[int]*soakDispatcher // live dispatchers by pid
	all     []*soakDispatcher
	faults  []soakFault
	serial  int
	sinks   []*soakSink
	natsOff []interval
}

type soakDispatcher struct {
	label   string
	p       *proc
	started time.Time
	killed  time.Time // SIGKILL sent
	termed  time.Time // SIGTERM sent
	exited  time.Time
	slot    string // A or B
}

type soakFault struct {
	what       string
	start, end time.Time
}

type interval struct{ a, b time.Time }

func TestWebhookSoak(t *testing.T) {
	raw := os.Getenv("PRESENCE_WEBHOOK_SOAK")
	if raw == "" {
		t.Skip("the webhook soak runs with PRESENCE_WEBHOOK_SOAK=<duration>, e.g. 20m")
	}
	skipIfShort(t, "the webhook soak")
	dur, err := time.ParseDuration(raw)
	if err != nil || dur <= 0 {
		t.Fatalf("PRESENCE_WEBHOOK_SOAK=%q: want a duration such as 20m", raw)
	}
	s := &soak{t: t, procs: map[int]*soakDispatcher{}, start: time.Now()}
	s.nats = startNATSProc(t)
	s.e = &env{t: t, redis: testredis.Start(t).Addr, nats: s.nats.url}
	nc, err := nats.Connect(s.nats.url, nats.MaxReconnects(-1), nats.ReconnectWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	nodes := []*proc{s.e.startNode(), s.e.startNode()}
	for _, name := range soakEndpoints {
		s.sinks = append(s.sinks, s.newSink(name))
	}
	s.writeConfig()
	s.startDispatcher("A")
	s.startDispatcher("B")
	for _, name := range soakEndpoints {
		testkit.CheckFor(t, 60*time.Second, 50*time.Millisecond, func() error {
			_, err := js.Consumer(t.Context(), bus.StreamName("eu"), webhook.ConsumerName(name))
			return err
		})
	}
	base := streamLast(t, js)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	churned := &soakChurn{}
	wg.Add(2)
	go func() { defer wg.Done(); churned.run(t, nodes, stop) }()
	go func() { defer wg.Done(); s.faultLoop(stop) }()
	time.Sleep(dur) // the soak's length is the point: nothing to poll for
	close(stop)
	wg.Wait()
	t.Logf("churn: %d joins (%d failed), %d leaves, %d drops", churned.joins, churned.joinFails, churned.leaves, churned.drops)
	s.settle(t, js, base)
}

// settle waits for the stream to stop growing and every endpoint to
// accept every event, then checks and reports.
func (s *soak) settle(t *testing.T, js jetstream.JetStream, base uint64) {
	last, since := streamLast(t, js), time.Now()
	testkit.CheckFor(t, 2*time.Minute, 50*time.Millisecond, func() error {
		if l := streamLast(t, js); l != last {
			last, since = l, time.Now()
		}
		if q := time.Since(since); q <= 3*(e2eGrace+e2eTTL) {
			return fmt.Errorf("the stream grew to %d %v ago, want it quiet for %v", last, q.Round(time.Millisecond), 3*(e2eGrace+e2eTTL))
		}
		return nil
	})
	events := readStream(t, js, base, last)
	if err := testkit.Poll(5*time.Minute, time.Second, func() error {
		for _, k := range s.sinks {
			if m := len(k.missing(events)); m > 0 {
				return fmt.Errorf("endpoint %s misses %d of %d events", k.name, m, len(events))
			}
		}
		return nil
	}); err != nil {
		t.Errorf("not every endpoint accepted every event within 5 minutes of the quiet period: %v", err)
	}
	s.report(t, events)
}

// soakEvent is one stream message.
type soakEvent struct {
	id, room string
	seq      uint64
	epoch    int64
	stored   time.Time
}

func streamLast(t *testing.T, js jetstream.JetStream) uint64 {
	var last uint64
	testkit.CheckFor(t, time.Minute, 200*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		st, err := js.Stream(ctx, bus.StreamName("eu"))
		if err != nil {
			return err
		}
		last = st.CachedInfo().State.LastSeq
		return nil
	})
	return last
}

// readStream reads the events stored after base up to last, with their
// stored time.
func readStream(t *testing.T, js jetstream.JetStream, base, last uint64) []soakEvent {
	t.Helper()
	var out []soakEvent
	if last <= base {
		return out
	}
	ctx := t.Context()
	st, err := js.Stream(ctx, bus.StreamName("eu"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: base + 1})
	if err != nil {
		t.Fatal(err)
	}
	for seq := base; seq < last; {
		b, err := c.Fetch(500, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range b.Messages() {
			n++
			md, _ := m.Metadata()
			seq = md.Sequence.Stream
			if seq > last {
				break
			}
			ev, err := bus.DecodeEvent(m.Data())
			if err != nil {
				continue // not an event: no endpoint gets it
			}
			out = append(out, soakEvent{id: ev.ID, room: ev.Room, seq: ev.Seq, epoch: ev.Epoch, stored: md.Timestamp})
		}
		if n == 0 {
			t.Fatalf("the stream read stopped at %d of %d", seq, last)
		}
	}
	return out
}

// natsProc is a nats-server process (JetStream) that can be stopped and
// started again on its port and store.
type natsProc struct {
	t    *testing.T
	bin  string
	dir  string
	port int
	url  string
	cmd  *exec.Cmd
}

func startNATSProc(t *testing.T) *natsProc {
	bin, err := natsBinary()
	if err != nil {
		t.Fatal(err)
	}
	n := &natsProc{t: t, bin: bin, dir: t.TempDir()}
	n.run("-1")
	t.Cleanup(func() { n.stop() })
	return n
}

func (n *natsProc) run(port string) {
	n.cmd = exec.Command(n.bin, "-a", "127.0.0.1", "-p", port, "-js", "-sd", filepath.Join(n.dir, "store"), "--ports_file_dir", n.dir)
	if err := n.cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	pf := filepath.Join(n.dir, fmt.Sprintf("nats-server_%d.ports", n.cmd.Process.Pid))
	// Polled without Fatal: the fault loop restarts NATS off the test's
	// goroutine.
	if err := testkit.Poll(30*time.Second, 50*time.Millisecond, func() error {
		u := readPortsFile(pf)
		if u == "" {
			return errors.New("no ports file yet")
		}
		nc, err := nats.Connect(u)
		if err != nil {
			return err
		}
		defer nc.Close()
		if _, err := nc.Request("$JS.API.INFO", nil, 2*time.Second); err != nil {
			return err
		}
		n.url = u
		return nil
	}); err != nil {
		n.t.Errorf("nats-server (port %s) not serving JetStream within 30 s: %v", port, err)
	}
	if n.port == 0 {
		_, p, _ := net.SplitHostPort(strings.TrimPrefix(n.url, "nats://"))
		n.port, _ = strconv.Atoi(p)
	}
}

func (n *natsProc) stop() {
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = n.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = n.cmd.Process.Kill()
		<-done
	}
	n.cmd = nil
}

func (n *natsProc) restart() { n.run(strconv.Itoa(n.port)) }

// writeConfig writes the one endpoints file both dispatchers read.
func (s *soak) writeConfig() {
	var b strings.Builder
	b.WriteString("sources: [eu]\nendpoints:\n")
	for _, k := range s.sinks {
		fmt.Fprintf(&b, "  - name: %s\n    url: %s\n    secrets: [%s]\n    batch_size: 20\n    max_wait: %s\n    timeout: %s\n"+
			"    min_backoff: 100ms\n    max_backoff: %s\n    gap_timeout: %s\n    allow_networks: [127.0.0.0/8]\n",
			k.name, k.srv.URL, hookSecret, soakMaxWait, soakTimeout, soakMaxBackoff, soakGap)
	}
	s.cfg = filepath.Join(s.t.TempDir(), "webhooks.yaml")
	if err := os.WriteFile(s.cfg, []byte(b.String()), 0o600); err != nil {
		s.t.Fatal(err)
	}
}

// startDispatcher runs a new dispatcher process in slot and waits for
// its /healthz.
func (s *soak) startDispatcher(slot string) *soakDispatcher {
	s.mu.Lock()
	s.serial++
	label := fmt.Sprintf("%s%d", slot, s.serial)
	s.mu.Unlock()
	p := s.e.start([]string{"webhooks", "--nats", s.nats.url, "--config", s.cfg, "--listen", "127.0.0.1:0",
		"--lease-ttl", soakLeaseTTL.String(), "--instance", label}, false)
	d := &soakDispatcher{label: label, p: p, started: time.Now(), slot: slot}
	s.mu.Lock()
	s.procs[p.cmd.Process.Pid] = d
	s.all = append(s.all, d)
	s.mu.Unlock()
	if err := testkit.Poll(60*time.Second, 100*time.Millisecond, func() error {
		if p.addr == "" {
			m := hooksListening.FindStringSubmatch(p.out.String())
			if m == nil {
				return errors.New("not listening yet")
			}
			p.addr = m[1]
		}
		return testkit.Want("health", health(p), http.StatusOK)
	}); err != nil {
		s.t.Errorf("dispatcher %s not healthy within a minute: %v", label, err)
	}
	return d
}

// ended waits for a process to exit (off the test's goroutine: no Fatal).
func (s *soak) ended(d *soakDispatcher, within time.Duration) {
	select {
	case <-d.p.done:
	case <-time.After(within):
		s.t.Errorf("dispatcher %s did not exit within %v; killed", d.label, within)
		_ = d.p.cmd.Process.Kill()
		<-d.p.done
	}
	d.exited = time.Now()
	s.gone(d)
}

func (s *soak) fault(what string, start time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, soakFault{what, start, time.Now()})
}

// faultLoop makes one fault at a time, every 15 to 35 s: NATS restarted
// (down 2 to 9 s, past a lease's refresh margin sometimes), a graceful
// handover (SIGTERM, then a new dispatcher), a SIGKILL then a new one.
func (s *soak) faultLoop(stop chan struct{}) {
	rnd := rand.New(rand.NewPCG(uint64(s.start.UnixNano()), 11))
	for {
		select {
		case <-stop:
			return
		case <-time.After(15*time.Second + rand.N(20*time.Second)):
		}
		slot := []string{"A", "B"}[rnd.IntN(2)]
		d := s.live(slot)
		if d == nil {
			s.t.Errorf("no dispatcher in slot %s", slot)
			return
		}
		switch r := rnd.IntN(6); {
		case r == 0:
			at := time.Now()
			s.nats.stop()
			time.Sleep(2*time.Second + rand.N(7*time.Second)) // an outage's length, not a wait for a condition
			s.nats.restart()
			s.mu.Lock()
			s.natsOff = append(s.natsOff, interval{at, time.Now()})
			s.mu.Unlock()
			s.fault("nats restart", at)
		case r <= 3:
			at := time.Now()
			d.termed = at
			d.p.signal(syscall.SIGTERM)
			s.ended(d, 60*time.Second)
			s.startDispatcher(slot)
			s.fault("graceful "+d.label, at)
		default:
			at := time.Now()
			d.killed = at
			d.p.signal(syscall.SIGKILL)
			s.ended(d, 10*time.Second)
			time.Sleep(rand.N(5 * time.Second)) // how long the process stays dead
			s.startDispatcher(slot)
			s.fault("sigkill "+d.label, at)
		}
	}
}

func (s *soak) live(slot string) *soakDispatcher {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range s.procs {
		if d.slot == slot {
			return d
		}
	}
	return nil
}

func (s *soak) gone(d *soakDispatcher) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.procs, d.p.cmd.Process.Pid)
}

// newSink starts a receiver. Each connection is attributed to the
// dispatcher process that opened it.
func (s *soak) newSink(name string) *soakSink {
	k := &soakSink{name: name, s: s, rnd: rand.New(rand.NewPCG(uint64(len(name)), 3))}
	sec, err := webhook.ParseSecret(hookSecret)
	if err != nil {
		s.t.Fatal(err)
	}
	k.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rq := &soakReq{arrive: time.Now(), by: connOwner(r.Context()), hookID: r.Header.Get(webhook.HeaderID)}
		body, _ := io.ReadAll(r.Body)
		if err := webhook.Verify(sec, rq.hookID, r.Header.Get(webhook.HeaderTimestamp),
			r.Header.Get(webhook.HeaderSignature), body, time.Now(), time.Minute); err != nil {
			s.t.Errorf("%s: %v", name, err)
		}
		var b struct{ Events []hookItem }
		if err := json.Unmarshal(body, &b); err != nil {
			s.t.Errorf("%s: %v", name, err)
		}
		rq.items = b.Events
		k.answer(w, r, rq)
		rq.end = time.Now()
		k.mu.Lock()
		k.reqs = append(k.reqs, rq)
		k.mu.Unlock()
	}))
	k.srv.Config.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		return context.WithValue(ctx, ownerKey{}, s.owner(c.RemoteAddr().String(), c.LocalAddr().String()))
	}
	k.srv.Start()
	s.t.Cleanup(k.srv.Close)
	return k
}

// answer answers as the receiver's mode says: flappy 503s for 6 s of
// every 20, slow takes 1 to 3 s, cutter cuts one request in 8 (half of
// them after it took the events in: the answer is lost).
func (k *soakSink) answer(w http.ResponseWriter, r *http.Request, rq *soakReq) {
	k.mu.Lock()
	roll := k.rnd.IntN(8)
	wait := time.Second + time.Duration(k.rnd.Int64N(int64(2*time.Second)))
	k.mu.Unlock()
	switch k.name {
	case "flappy":
		if time.Since(k.s.start)%(20*time.Second) < 6*time.Second {
			if roll%2 == 0 {
				w.Header().Set("Retry-After", "1")
			}
			w.WriteHeader(http.StatusServiceUnavailable)
			rq.outcome = "503"
			return
		}
	case "slow":
		time.Sleep(wait) // the receiver's slowness is what it tests
	case "cutter":
		if roll == 0 {
			cut(w)
			rq.outcome = "cut"
			return
		}
	}
	if r.Context().Err() != nil {
		rq.outcome = "gone"
		return
	}
	if k.name == "cutter" && roll == 1 {
		cut(w)
		rq.outcome = "lost"
		return
	}
	w.WriteHeader(http.StatusOK)
	rq.outcome = "ok"
	if err := http.NewResponseController(w).Flush(); err != nil || r.Context().Err() != nil {
		rq.outcome = "lost"
	}
}

func cut(w http.ResponseWriter) {
	c, _, err := http.NewResponseController(w).Hijack()
	if err == nil {
		_ = c.Close()
	}
}

type ownerKey struct{}

func connOwner(ctx context.Context) string {
	if v, ok := ctx.Value(ownerKey{}).(string); ok {
		return v
	}
	return "?"
}

// owner finds the dispatcher process holding the other end of a
// connection to a receiver: the socket whose local address is remote
// (/proc/net/tcp), then the process with that socket open.
func (s *soak) owner(remote, local string) string {
	_, rp, _ := net.SplitHostPort(remote)
	_, lp, _ := net.SplitHostPort(local)
	rport, _ := strconv.Atoi(rp)
	lport, _ := strconv.Atoi(lp)
	inode := socketInode(rport, lport)
	if inode == "" {
		return "?"
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for pid, d := range s.procs {
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		for _, fd := range fds {
			if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); l == "socket:["+inode+"]" {
				return d.label
			}
		}
	}
	return "?"
}

func socketInode(localPort, remotePort int) string {
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return ""
	}
	defer f.Close()
	want := fmt.Sprintf(":%04X", localPort)
	wantR := fmt.Sprintf(":%04X", remotePort)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) > 9 && strings.HasSuffix(fs[1], want) && strings.HasSuffix(fs[2], wantR) {
			return fs[9]
		}
	}
	return ""
}

func (k *soakSink) requests() []*soakReq {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.reqs)
}

func accepted(rq *soakReq) bool { return rq.outcome == "ok" || rq.outcome == "lost" }

func (k *soakSink) missing(events []soakEvent) []soakEvent {
	got := map[string]bool{}
	for _, rq := range k.requests() {
		if accepted(rq) {
			for _, it := range rq.items {
				got[it.ID] = true
			}
		}
	}
	var out []soakEvent
	for _, ev := range events {
		if !got[ev.id] {
			out = append(out, ev)
		}
	}
	return out
}

// soakChurn joins, leaves and drops WebSocket clients at a steady rate,
// 4 steps a second, keeping 10 to 60 connected over 6 rooms.
type soakChurn struct {
	joins, joinFails, leaves, drops int
}

func (c *soakChurn) run(t *testing.T, nodes []*proc, stop chan struct{}) {
	rnd := rand.New(rand.NewPCG(7, 7))
	var in []*member
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-stop:
			for _, m := range in {
				m.leave()
			}
			return
		case <-tick.C:
		}
		r := rnd.IntN(10)
		switch {
		case len(in) < 10 || (len(in) < 60 && r < 5):
			m, err := tryJoin(t, nodes[rnd.IntN(len(nodes))].addr, fmt.Sprintf("u%d", i), fmt.Sprintf("s%d", rnd.IntN(6)))
			if err != nil {
				c.joinFails++
				continue
			}
			c.joins++
			in = append(in, m)
		case r < 8:
			k := rnd.IntN(len(in))
			in[k].leave()
			in = slices.Delete(in, k, k+1)
			c.leaves++
		default:
			k := rnd.IntN(len(in))
			in[k].ws.Close() // dropped: no close frame, offline after the grace
			in = slices.Delete(in, k, k+1)
			c.drops++
		}
	}
}

// leaseEvents reads a dispatcher's log: per lane, when it lost the
// lease, gave the lane up, or the watchdog started it over.
var soakLogLine = regexp.MustCompile(`time=(\S+) level=\S+ msg="webhook: (lease lost|lane given up|lane taken|lane made no progress)[^"]*" lane=(\S+)`)

type laneLog struct {
	at         time.Time
	what, lane string
	by         string
}

func (s *soak) laneLogs() []laneLog {
	var out []laneLog
	for _, d := range s.all {
		for _, m := range soakLogLine.FindAllStringSubmatch(d.p.out.String(), -1) {
			at, err := time.Parse(time.RFC3339Nano, m[1])
			if err == nil {
				out = append(out, laneLog{at, m[2], m[3], d.label})
			}
		}
	}
	return out
}

// soakID is what one endpoint did with one event id.
type soakID struct {
	attempts int
	first    time.Time  // first request that carried it
	acc      []*soakReq // requests that took it in, in answer order
}

// lane folds one receiver's requests per event id.
func (k *soakSink) lane() (map[string]*soakID, []*soakReq) {
	reqs := k.requests()
	ids := map[string]*soakID{}
	for _, rq := range reqs {
		for _, it := range rq.items {
			x := ids[it.ID]
			if x == nil {
				x = &soakID{first: rq.arrive}
				ids[it.ID] = x
			}
			if rq.arrive.Before(x.first) {
				x.first = rq.arrive
			}
			x.attempts++
			if accepted(rq) {
				x.acc = append(x.acc, rq)
			}
		}
	}
	return ids, reqs
}

// report checks the run and logs its figures; the timelines go to files.
func (s *soak) report(t *testing.T, events []soakEvent) {
	out := os.Getenv("PRESENCE_WEBHOOK_SOAK_OUT")
	if out == "" {
		var err error
		if out, err = os.MkdirTemp("", "presence-webhook-soak-"); err != nil {
			t.Fatal(err)
		}
	} else if err := os.MkdirAll(out, 0o750); err != nil { //nolint:gosec // the soak's own output directory, named in its own environment
		t.Fatal(err)
	}
	s.mu.Lock()
	faults, natsOff := slices.Clone(s.faults), slices.Clone(s.natsOff)
	s.mu.Unlock()
	logs := s.laneLogs()
	var global []interval
	kinds := map[string]int{}
	for _, f := range faults {
		global = append(global, interval{f.start, f.end.Add(soakLeaseTTL + soakTimeout)})
		kinds[strings.Fields(f.what)[0]]++
	}
	t.Logf("soak: %v, %d stream events, faults %v; watchdog bound %v; files in %s", time.Since(s.start).Round(time.Second), len(events), kinds, soakStallBound, out)
	s.writeFiles(t, out, faults, logs)
	var tl strings.Builder
	tl.WriteString("endpoint\troom\tepoch\tseq\tid\tstored\tfirst_attempt\taccepted\tattempts\tby\n")
	off := func(x time.Time) string {
		if x.IsZero() {
			return "-"
		}
		return fmt.Sprintf("%.3f", x.Sub(s.start).Seconds())
	}
	for _, k := range s.sinks {
		ids, reqs := k.lane()
		sorted := slices.Clone(events)
		slices.SortStableFunc(sorted, func(a, b soakEvent) int { return strings.Compare(a.room, b.room) })
		for _, ev := range sorted {
			x := ids[ev.id]
			if x == nil {
				x = &soakID{}
			}
			acc, by := time.Time{}, "-"
			if len(x.acc) > 0 {
				acc, by = x.acc[0].end, x.acc[0].by
			}
			fmt.Fprintf(&tl, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%d\t%s\n", k.name, ev.room, ev.epoch, ev.seq, ev.id, off(ev.stored), off(x.first), off(acc), x.attempts, by)
		}
		s.checkLane(t, k, events, ids, reqs, global, natsOff, logs)
	}
	if err := os.WriteFile(filepath.Join(out, "timeline.tsv"), []byte(tl.String()), 0o600); err != nil { //nolint:gosec // the soak's own output directory, named in its own environment
		t.Error(err)
	}
}

func (s *soak) writeFiles(t *testing.T, out string, faults []soakFault, logs []laneLog) {
	var b strings.Builder
	for _, f := range faults {
		fmt.Fprintf(&b, "%.3f\t%.3f\t%s\n", f.start.Sub(s.start).Seconds(), f.end.Sub(s.start).Seconds(), f.what)
	}
	for _, l := range logs {
		fmt.Fprintf(&b, "%.3f\t-\t%s %s %s\n", l.at.Sub(s.start).Seconds(), l.by, l.what, l.lane)
	}
	_ = os.WriteFile(filepath.Join(out, "faults.tsv"), []byte(b.String()), 0o600) //nolint:gosec // the soak's own output directory, named in its own environment
	var r strings.Builder
	r.WriteString("endpoint\tarrive\tend\tby\twebhook_id\titems\toutcome\n")
	for _, k := range s.sinks {
		for _, rq := range k.requests() {
			fmt.Fprintf(&r, "%s\t%.3f\t%.3f\t%s\t%s\t%d\t%s\n", k.name, rq.arrive.Sub(s.start).Seconds(), rq.end.Sub(s.start).Seconds(), rq.by, rq.hookID, len(rq.items), rq.outcome)
		}
	}
	_ = os.WriteFile(filepath.Join(out, "requests.tsv"), []byte(r.String()), 0o600) //nolint:gosec // the soak's own output directory, named in its own environment
	for _, d := range s.all {
		_ = os.WriteFile(filepath.Join(out, d.label+".log"), []byte(d.p.out.String()), 0o600) //nolint:gosec // the soak's own output directory, named in its own environment
	}
}

// checkLane checks one endpoint: loss, order, delays, stalls, duplicates.
func (s *soak) checkLane(t *testing.T, k *soakSink, events []soakEvent, ids map[string]*soakID, reqs []*soakReq,
	global, natsOff []interval, logs []laneLog) {
	if miss := k.missing(events); len(miss) > 0 {
		t.Errorf("%s: %d of %d events never accepted, the first %+v", k.name, len(miss), len(events), miss[0])
	}
	// Order: each id's first acceptance, per room, in (epoch, seq) order.
	type pos struct {
		epoch int64
		seq   uint64
	}
	last, seen, reorders, markers := map[string]pos{}, map[string]bool{}, 0, 0
	outcomes := map[string]int{}
	var failWin []interval
	var failAt time.Time
	for _, rq := range reqs {
		outcomes[rq.outcome]++
		if !accepted(rq) || rq.outcome == "lost" {
			if failAt.IsZero() {
				failAt = rq.arrive
			}
		} else if !failAt.IsZero() {
			failWin, failAt = append(failWin, interval{failAt, rq.end}), time.Time{}
		}
		if !accepted(rq) {
			continue
		}
		for _, it := range rq.items {
			if it.Kind == webhook.KindResync {
				markers++
				continue
			}
			if seen[it.ID] {
				continue
			}
			seen[it.ID] = true
			p, was := last[it.Room]
			if was && (it.Epoch < p.epoch || (it.Epoch == p.epoch && it.Seq <= p.seq)) {
				reorders++
				t.Errorf("%s: room %s: %d/%d first accepted after %d/%d (request of %s at %.3fs)", k.name, it.Room, it.Epoch, it.Seq, p.epoch, p.seq,
					rq.by, rq.arrive.Sub(s.start).Seconds())
			}
			last[it.Room] = pos{it.Epoch, it.Seq}
		}
	}
	windows := append(slices.Clone(global), failWin...)
	var all, calm []time.Duration
	var lag []interval
	for _, ev := range events {
		x := ids[ev.id]
		if x == nil || len(x.acc) == 0 {
			lag = append(lag, interval{ev.stored, time.Now()})
			continue
		}
		acc := x.acc[0].end
		lag = append(lag, interval{ev.stored, acc})
		d := acc.Sub(ev.stored)
		all = append(all, d)
		if !overlaps(windows, interval{ev.stored, acc}) {
			calm = append(calm, d)
		}
	}
	var busy []interval
	for _, rq := range reqs {
		busy = append(busy, interval{rq.arrive, rq.end})
	}
	idle := subtract(merge(lag), merge(busy))
	longest, at := longestOf(idle)
	longestUp, atUp := longestOf(subtract(idle, merge(natsOff)))
	if limit := soakStallBound + soakLeaseTTL/4; longestUp > limit {
		t.Errorf("%s: the lane had lag and no attempt for %v from %.3fs (NATS up), past the watchdog bound %v and its tick",
			k.name, longestUp.Round(time.Millisecond), atUp.Sub(s.start).Seconds(), soakStallBound)
	}
	if longest > 5*time.Second {
		s.stallTimeline(t, k, reqs, logs, at, longest)
	}
	classes := s.duplicates(t, k, ids, natsOff, logs)
	t.Logf("%s: %d requests %v, %d markers, %d reorders; stored->accepted p99 %v max %v (all, %d), p99 %v max %v (outside faults, %d); "+
		"longest without an attempt while lagging %v at %.1fs (NATS up: %v at %.1fs); duplicates %v",
		k.name, len(reqs), outcomes, markers, reorders, pct(all, 99), pct(all, 100), len(all), pct(calm, 99), pct(calm, 100), len(calm),
		longest.Round(time.Millisecond), at.Sub(s.start).Seconds(), longestUp.Round(time.Millisecond), atUp.Sub(s.start).Seconds(), classes)
}

// stallTimeline logs what happened around a lane's longest wait: the
// requests, the faults and the lane's log lines from 10 s before it to
// 5 s after.
func (s *soak) stallTimeline(t *testing.T, k *soakSink, reqs []*soakReq, logs []laneLog, at time.Time, d time.Duration) {
	from, to := at.Add(-10*time.Second), at.Add(d+5*time.Second)
	in := func(x time.Time) bool { return x.After(from) && x.Before(to) }
	var b strings.Builder
	for _, rq := range reqs {
		if in(rq.arrive) || in(rq.end) {
			fmt.Fprintf(&b, "\n  %8.3fs-%8.3fs request of %s, %d items, %s", rq.arrive.Sub(s.start).Seconds(), rq.end.Sub(s.start).Seconds(), rq.by, len(rq.items), rq.outcome)
		}
	}
	s.mu.Lock()
	for _, f := range s.faults {
		if in(f.start) || in(f.end) || (f.start.Before(from) && f.end.After(to)) {
			fmt.Fprintf(&b, "\n  %8.3fs-%8.3fs %s", f.start.Sub(s.start).Seconds(), f.end.Sub(s.start).Seconds(), f.what)
		}
	}
	s.mu.Unlock()
	for _, l := range logs {
		if l.lane == k.name+"/eu" && in(l.at) {
			fmt.Fprintf(&b, "\n  %8.3fs %s: %s", l.at.Sub(s.start).Seconds(), l.by, l.what)
		}
	}
	t.Logf("%s: the longest wait with lag, %v from %.3fs:%s", k.name, d.Round(time.Millisecond), at.Sub(s.start).Seconds(), b.String())
}

// duplicates classifies each acceptance of an id after its first, by
// what happened between it and the one before it.
func (s *soak) duplicates(t *testing.T, k *soakSink, ids map[string]*soakID, natsOff []interval, logs []laneLog) map[string]int {
	classes := map[string]int{}
	byLabel := map[string]*soakDispatcher{}
	for _, d := range s.all {
		byLabel[d.label] = d
	}
	lane := k.name + "/eu"
	logged := func(what, by string, a, b time.Time) bool {
		for _, l := range logs {
			if l.lane == lane && l.by == by && l.what == what && !l.at.Before(a) && !l.at.After(b) {
				return true
			}
		}
		return false
	}
	reported := map[*soakReq]bool{}
	for _, x := range ids {
		for i := 1; i < len(x.acc); i++ {
			prev, cur := x.acc[i-1], x.acc[i]
			d := byLabel[prev.by]
			var c string
			switch {
			case prev == cur:
				continue // one request carried the id twice: not a delivery again
			case prev.outcome == "lost":
				c = "unacked_retry"
			case d != nil && !d.killed.IsZero() && d.killed.After(prev.arrive) && d.killed.Before(cur.arrive):
				c = "sigkill"
			case logged("lease lost", prev.by, prev.arrive, cur.arrive):
				c = "lease_loss"
			case logged("lane made no progress", prev.by, prev.arrive, cur.arrive):
				c = "stall_restart"
			case overlaps(natsOff, interval{prev.arrive, cur.arrive}):
				c = "nats_restart"
			case d == nil:
				c = "unattributed"
			case prev.by != cur.by:
				c = "graceful_handover"
			default:
				c = "unexplained"
			}
			classes[c]++
			if (c == "graceful_handover" || c == "unexplained") && !reported[cur] {
				reported[cur] = true
				t.Errorf("%s: a %s duplicate: %s accepted from %s (%s, %.3f-%.3fs, %s), again from %s (%s, %.3f-%.3fs)",
					k.name, c, cur.items[0].ID, prev.by, prev.hookID, prev.arrive.Sub(s.start).Seconds(), prev.end.Sub(s.start).Seconds(), prev.outcome,
					cur.by, cur.hookID, cur.arrive.Sub(s.start).Seconds(), cur.end.Sub(s.start).Seconds())
			}
		}
	}
	return classes
}

func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p+99)/100 - 1
	return s[max(0, min(i, len(s)-1))].Round(time.Millisecond)
}

func overlaps(ws []interval, x interval) bool {
	for _, w := range ws {
		if w.a.Before(x.b) && x.a.Before(w.b) {
			return true
		}
	}
	return false
}

// merge sorts intervals and joins those that overlap.
func merge(in []interval) []interval {
	s := slices.Clone(in)
	slices.SortFunc(s, func(a, b interval) int { return a.a.Compare(b.a) })
	var out []interval
	for _, x := range s {
		if n := len(out); n > 0 && !x.a.After(out[n-1].b) {
			if x.b.After(out[n-1].b) {
				out[n-1].b = x.b
			}
			continue
		}
		out = append(out, x)
	}
	return out
}

// subtract is a minus b, both merged.
func subtract(a, b []interval) []interval {
	var out []interval
	for _, x := range a {
		cur := x.a
		for _, y := range b {
			if !y.b.After(cur) || !y.a.Before(x.b) {
				continue
			}
			if y.a.After(cur) {
				out = append(out, interval{cur, y.a})
			}
			if y.b.After(cur) {
				cur = y.b
			}
		}
		if cur.Before(x.b) {
			out = append(out, interval{cur, x.b})
		}
	}
	return out
}

func longestOf(ivs []interval) (time.Duration, time.Time) {
	var d time.Duration
	var at time.Time
	for _, x := range ivs {
		if l := x.b.Sub(x.a); l > d {
			d, at = l, x.a
		}
	}
	return d, at
}

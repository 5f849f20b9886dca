package main

import (
	"context"
	crand "crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/presence-dev/presence/internal/oracle"
	"github.com/presence-dev/presence/internal/testkit"
)

// The oracle test: a seeded random schedule (oracle.Generate) of client
// operations and node kills over three real `presenced node` processes, a
// real redis-server and a real nats-server with JetStream. The harness
// carries the schedule out, records when every operation really happened
// and every transition the service emitted (a plain subscriber on
// presence.>, the region's stream read at the end, every client's own
// frames), and oracle.Check judges the record. docs/ORACLE.md has the
// semantics, the margin and how to run the long mode.
//
// Short mode (the default; skipped by -short): a few fixed seeds and one
// random seed, each a small scenario. Long mode: PRESENCE_ORACLE_OPS=N
// plans N operations on a larger scenario.

const (
	oracleRegion   = "eu"
	oracleObserver = "zz-observer"
)

// Short-mode seeds: each runs one small scenario; the timing alternates so
// that both configurations run on every CI run.
var oracleSeeds = []int64{1, 2, 3}

func oracleTiming(seed int64) oracle.Timing {
	tm := oracle.TimingA
	switch os.Getenv("PRESENCE_ORACLE_TIMING") {
	case "a", "A":
	case "b", "B":
		tm = oracle.TimingB
	default:
		if seed%2 == 0 {
			tm = oracle.TimingB
		}
	}
	// A slower machine may need a wider margin (the schedule widens its
	// bands with it).
	tm.Margin = envDuration("PRESENCE_ORACLE_MARGIN", tm.Margin)
	return tm
}

// shortScenario is one CI-sized run: 3 nodes, about 45 users and 90 tabs in
// 4 rooms, one kill and restart.
func shortScenario(seed int64) oracle.Scenario {
	return oracle.Scenario{
		Seed: seed, Timing: oracleTiming(seed), Nodes: 3, Users: 45, Rooms: 4, MaxTabs: 3, MaxRooms: 3,
		Duration: 7 * time.Second, OpEvery: 1500 * time.Millisecond,
		FirstKill: 2500 * time.Millisecond, RestartMin: 2 * time.Second, RestartMax: 3 * time.Second,
		JoinAllowance: 450 * time.Millisecond,
	}
}

// longScenario plans ops operations on about 300 users and 600 tabs in 10
// rooms, with a kill and restart every 40s.
func longScenario(seed int64, ops int) oracle.Scenario {
	return oracle.Scenario{
		Seed: seed, Timing: oracleTiming(seed), Nodes: 3, Users: envInt("PRESENCE_ORACLE_USERS", 300), Rooms: envInt("PRESENCE_ORACLE_ROOMS", 10),
		MaxTabs: 3, MaxRooms: 3, Duration: 1000 * time.Hour, OpEvery: envDuration("PRESENCE_ORACLE_OP_EVERY", 3*time.Second), MaxOps: ops,
		RampUp:    20 * time.Second,
		FirstKill: 20 * time.Second, KillEvery: 40 * time.Second, RestartMin: 3 * time.Second, RestartMax: 6 * time.Second,
		JoinAllowance: 450 * time.Millisecond,
	}
}

func envDuration(name string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func TestOracle(t *testing.T) {
	if testing.Short() {
		t.Skip("oracle: several seeded runs of real nodes; skipped with -short")
	}
	var scs []oracle.Scenario
	ops := envInt("PRESENCE_ORACLE_OPS", 0)
	if s := os.Getenv("PRESENCE_ORACLE_SEED"); s != "" {
		seed, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("PRESENCE_ORACLE_SEED=%q: %v", s, err)
		}
		if ops > 0 {
			scs = append(scs, longScenario(seed, ops))
		} else {
			scs = append(scs, shortScenario(seed))
		}
	} else if ops > 0 {
		scs = append(scs, longScenario(time.Now().UnixNano()%1_000_000_000, ops))
	} else {
		for _, s := range oracleSeeds {
			scs = append(scs, shortScenario(s))
		}
		scs = append(scs, shortScenario(1000+rand.Int64N(1_000_000_000)))
	}
	for _, sc := range scs {
		t.Logf("oracle seed %d", sc.Seed)
		t.Run(fmt.Sprintf("seed=%d", sc.Seed), func(t *testing.T) {
			if len(scs) > 1 {
				t.Parallel() // each seed has its own redis, nats and nodes
			}
			run, rep := runOracle(t, sc, oracleOpts{})
			t.Log("\n" + rep.String())
			if rep.Failed() {
				t.Errorf("oracle seed %d (rerun: PRESENCE_ORACLE_SEED=%d%s): violations\n%s", sc.Seed, sc.Seed, longHint(sc), rep.Details(run, 15))
			} else if len(rep.Violations) > 0 || len(rep.Ambiguous) > 0 {
				t.Log("\n" + rep.Details(run, 10))
			}
		})
	}
}

// TestOracleMixedFormats runs a schedule on nodes of two releases in one
// region of format 2: presenced as built and the test format 3
// (e2e_upgrade_test.go), started in turn, so the kill's restart brings
// the other release up in its slot. A region mid-rollout keeps every
// promise the oracle checks.
func TestOracleMixedFormats(t *testing.T) {
	if testing.Short() {
		t.Skip("oracle: a seeded run of real nodes; skipped with -short")
	}
	sc := shortScenario(int64(envInt("PRESENCE_ORACLE_SEED", 5)))
	run, rep := runOracle(t, sc, oracleOpts{bins: []string{binary, binaryFormat3(t)}})
	t.Log("\n" + rep.String())
	if rep.Failed() {
		t.Errorf("oracle seed %d, nodes of formats 2 and 3 (rerun: PRESENCE_ORACLE_SEED=%d): violations\n%s", sc.Seed, sc.Seed, rep.Details(run, 15))
	}
}

func longHint(sc oracle.Scenario) string {
	if sc.MaxOps > 0 {
		return fmt.Sprintf(" PRESENCE_ORACLE_OPS=%d", sc.MaxOps)
	}
	return ""
}

// TestOracleCatchesBrokenSetups runs the harness against setups that break
// the promise on purpose and asserts that the oracle says so: it can fail.
func TestOracleCatchesBrokenSetups(t *testing.T) {
	if testing.Short() {
		t.Skip("oracle: seeded runs of real nodes; skipped with -short")
	}
	// Seed 12 (timing A) plans a dozen returns inside the grace that a
	// 250ms grace turns into flickers, and a score of departures of killed
	// sessions.
	sc := shortScenario(12)
	sc.Timing = oracle.TimingA
	t.Run("short-grace", func(t *testing.T) {
		t.Parallel()
		// The nodes' real grace is the reap interval, the oracle assumes
		// 1.5s: returns inside the assumed grace flicker, and clean
		// departures come early.
		_, rep := runOracle(t, sc, oracleOpts{nodeArgs: []string{"--offline-grace", sc.Timing.Reap.String()}})
		t.Log("\n" + rep.String())
		if rep.Counts[oracle.C3Flicker] == 0 || rep.Counts[oracle.C4Early] == 0 {
			t.Errorf("a grace of %v instead of %v: want flickers (class 3) and early departures (class 4c), got %d and %d",
				sc.Timing.Reap, sc.Timing.Grace, rep.Counts[oracle.C3Flicker], rep.Counts[oracle.C4Early])
		}
	})
	t.Run("dropped-expired", func(t *testing.T) {
		t.Parallel()
		// Every expired offline is dropped before the oracle sees it, as
		// if the store never announced them: the killed node's departures
		// go missing.
		_, rep := runOracle(t, sc, oracleOpts{tap: func(e oracle.Event) bool { return !(e.Kind == "offline" && e.Reason == "expired") }})
		t.Log("\n" + rep.String())
		if rep.Counts[oracle.C4Missing] == 0 {
			t.Errorf("expired offlines dropped: want missing departures (class 4a), got none")
		}
	})
}

type oracleOpts struct {
	nodeArgs []string                // appended to every node's flags (they win)
	tap      func(oracle.Event) bool // false hides an event from every observer
	bins     []string                // builds of presenced the node starts take in turn (none: binary)
}

// harness carries out one plan and records it.
type harness struct {
	t      *testing.T
	e      *env
	plan   *oracle.Plan
	opts   oracleOpts
	start  time.Time
	args   []string // node flags
	secret string   // the nodes' JWT secret, this run's own
	starts int      // nodes started, on the test goroutine

	mu       sync.Mutex
	nodes    []oracle.Node
	procs    []*proc
	slotNode []int             // slot -> node id, -1 while down
	recs     []connEntry       // every connection's record, by id
	live     map[int]*wsClient // the open connections
	notes    []oracle.Note
	ops      map[string]int
	resyncs  []oracle.Resync
	empty    []oracle.Empty
	core     []oracle.Event
	lag      []time.Duration
	crashed  chan int
}

func (h *harness) now() time.Duration { return time.Since(h.start) }

func (h *harness) note(conn int, what string) {
	at := h.now()
	h.mu.Lock()
	h.notes = append(h.notes, oracle.Note{At: at, Conn: conn, What: what})
	h.mu.Unlock()
}

func (h *harness) count(kind string) {
	h.mu.Lock()
	h.ops[kind]++
	h.mu.Unlock()
}

// lagged records how late an operation planned at at starts.
func (h *harness) lagged(at time.Duration) {
	l := max(0, h.now()-at)
	h.mu.Lock()
	h.lag = append(h.lag, l)
	h.mu.Unlock()
}

func (h *harness) resync(r oracle.Resync) {
	h.mu.Lock()
	h.resyncs = append(h.resyncs, r)
	h.mu.Unlock()
}

// emptyMember records a snapshot that listed a member with no session.
func (h *harness) emptyMember(e oracle.Empty) {
	h.mu.Lock()
	h.empty = append(h.empty, e)
	h.mu.Unlock()
}

// until sleeps until the run's clock reads d: the schedule's own timing.
func (h *harness) until(d time.Duration) {
	if w := d - h.now(); w > 0 {
		time.Sleep(w)
	}
}

// startSlot starts a node process in slot and watches for its exit. Test
// goroutine only (startNodeIn may fail the test).
func (h *harness) startSlot(slot int) {
	h.register(slot, h.startProc())
}

// startProc starts a node: of presenced as built, or of each of
// opts.bins in turn. On the test goroutine only.
func (h *harness) startProc() *proc {
	if len(h.opts.bins) == 0 {
		return h.e.startNodeIn(oracleRegion, h.args...)
	}
	bin := h.opts.bins[h.starts%len(h.opts.bins)]
	h.starts++
	return h.e.startBin(bin, h.e.nodeArgs(oracleRegion, h.args...), nil, true)
}

// register records a started node process and watches for its exit.
func (h *harness) register(slot int, p *proc) {
	h.mu.Lock()
	id := len(h.nodes)
	h.nodes = append(h.nodes, oracle.Node{ID: id, Slot: slot, Started: h.now(), Died: oracle.None})
	h.procs = append(h.procs, p)
	h.slotNode[slot] = id
	h.mu.Unlock()
	go func() {
		<-p.done
		at := h.now()
		h.mu.Lock()
		n := &h.nodes[id]
		crash := n.Died == oracle.None
		if crash {
			n.Died, n.Exit = at, fmt.Sprintf("%v; last output: %s", p.err, lastLines(p.out.String(), 15))
			if h.slotNode[slot] == id {
				h.slotNode[slot] = -1
			}
		}
		h.mu.Unlock()
		if crash {
			h.crashed <- slot
		}
	}()
}

func lastLines(s string, n int) string {
	ls := strings.Split(strings.TrimSpace(s), "\n")
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return strings.Join(ls, "\n")
}

// kill SIGKILLs the node in slot; its death is recorded before the signal
// is sent, so no hold is judged to outlive it.
func (h *harness) kill(slot int) {
	h.mu.Lock()
	id := h.slotNode[slot]
	if id < 0 {
		h.mu.Unlock()
		h.note(-1, fmt.Sprintf("planned kill of slot %d: already down", slot))
		return
	}
	h.nodes[id].Died, h.nodes[id].Killed = h.now(), true
	h.slotNode[slot] = -1
	h.ops["kill"]++
	h.mu.Unlock()
	h.procs[id].signal(syscall.SIGKILL)
}

// node returns the id and address of the live node in slot, or of the next
// live slot after it.
func (h *harness) node(slot int) (int, string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := range len(h.slotNode) {
		s := (slot + i) % len(h.slotNode)
		if id := h.slotNode[s]; id >= 0 {
			return id, h.procs[id].addr, true
		}
	}
	return -1, "", false
}

func (h *harness) nodeDied(id int) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.nodes[id].Died
}

// subscribe records every message on presence.> with its arrival time, on
// a connection of its own with no pending limit: a drop would be the
// harness's fault, and is counted.
func (h *harness) subscribe() (*nats.Conn, *nats.Subscription) {
	nc, err := nats.Connect(h.e.nats)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(nc.Close)
	sub, err := nc.Subscribe("presence.>", func(m *nats.Msg) {
		at := h.now()
		e, err := h.decodeEvent(m.Data)
		if err != nil {
			h.note(-1, fmt.Sprintf("undecodable event on %s: %v", m.Subject, err))
			return
		}
		e.Arrived = at
		if h.opts.tap != nil && !h.opts.tap(e) {
			return
		}
		h.mu.Lock()
		h.core = append(h.core, e)
		h.mu.Unlock()
	})
	if err != nil {
		h.t.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	if err := nc.Flush(); err != nil {
		h.t.Fatal(err)
	}
	return nc, sub
}

func (h *harness) decodeEvent(data []byte) (oracle.Event, error) {
	var e wsEvent
	if err := json.Unmarshal(data, &e); err != nil {
		return oracle.Event{}, err
	}
	if e.V != 1 || e.ID == "" {
		return oracle.Event{}, fmt.Errorf("version %d id %q", e.V, e.ID)
	}
	return oracle.Event{ID: e.ID, Kind: e.Kind, Reason: e.Reason, Room: e.Room, User: e.User, Sessions: e.Sessions,
		Seq: e.Seq, Epoch: e.Epoch, At: e.At.Sub(h.start), Arrived: oracle.None, Stored: oracle.None, Session: e.Session, State: normState(e.State)}, nil
}

// runOracle carries out the plan of sc and judges it.
func runOracle(t *testing.T, sc oracle.Scenario, opts oracleOpts) (*oracle.Run, *oracle.Report) {
	plan := oracle.Generate(sc)
	tm := sc.Timing
	h := &harness{t: t, e: newProcessEnv(t), plan: plan, opts: opts, ops: map[string]int{}, live: map[int]*wsClient{}, slotNode: make([]int, sc.Nodes), crashed: make(chan int, 16)}
	// A secret of this run's own: its nodes listen on ports the kernel
	// picks, and a port one of them leaves (killed) may go to a node of
	// another run beside it; a client of this run redialling it must be
	// refused there, not join that run's rooms.
	h.secret = crand.Text() + crand.Text() // 52 characters: a node wants 32 bytes at least
	h.args = append([]string{
		"--session-ttl", tm.TTL.String(), "--heartbeat", tm.Heartbeat.String(),
		"--offline-grace", tm.Grace.String(), "--reap-interval", tm.Reap.String(),
		"--jwt-secret", h.secret,
	}, opts.nodeArgs...)
	t.Logf("oracle seed %d: %s; %d users, %d tabs, %d rooms, %d nodes; %d operations planned",
		sc.Seed, tm, sc.Users, len(plan.Tabs), sc.Rooms, sc.Nodes, plan.Ops)
	procs := make([]*proc, sc.Nodes)
	for s := range procs {
		procs[s] = h.startProc()
	}
	// The schedule's clock starts once every node is up; it is set before
	// any goroutine reads it.
	h.start = time.Now()
	for s, p := range procs {
		h.register(s, p)
	}
	nc, sub := h.subscribe()

	var wg sync.WaitGroup
	for i := range plan.Tabs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			(&actor{h: h, tab: &plan.Tabs[i]}).run()
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	h.runNodes(done)
	quietFrom := h.lastChange()
	t.Logf("oracle seed %d: schedule carried out at %v, last change at %v", sc.Seed, h.now().Round(time.Millisecond), quietFrom.Round(time.Millisecond))

	// Every departure the run caused is announced by quietFrom plus the
	// longest window: that wait is the oracle's own bound, not a hope.
	h.until(quietFrom + tm.Settled() + 500*time.Millisecond)
	final := h.final()
	end := h.now()
	stream := h.readStream(nc)
	// The core subscriber has seen the stream's last messages, or never
	// will: poll with a deadline.
	_ = testkit.Poll(5*time.Second, 20*time.Millisecond, func() error {
		if !h.coreHas(stream) {
			return errors.New("the core subscriber lacks the stream's last messages")
		}
		return nil
	})
	dropped, _ := sub.Dropped()
	_ = sub.Unsubscribe()

	t.Logf("oracle seed %d: final checks done at %v, %d stream events read by %v", sc.Seed, end.Round(time.Millisecond), len(stream), h.now().Round(time.Millisecond))
	run := h.record(end, stream, final, dropped)
	rep := oracle.Check(run)
	return run, rep
}

// runNodes carries out the node plan (kills, restarts) on the test
// goroutine, and restarts a node that exited on its own a second later,
// until every actor is done.
func (h *harness) runNodes(actorsDone <-chan struct{}) {
	ops := h.plan.Nodes
	type restart struct {
		at   time.Duration
		slot int
	}
	var again []restart
	for {
		next := time.Duration(-1)
		if len(ops) > 0 {
			next = ops[0].At
		}
		for _, r := range again {
			if next < 0 || r.at < next {
				next = r.at
			}
		}
		var timer <-chan time.Time
		if next >= 0 {
			timer = time.After(max(0, next-h.now()))
		} else if actorsDone == nil {
			return
		}
		select {
		case <-timer:
			now := h.now()
			for len(ops) > 0 && ops[0].At <= now {
				op := ops[0]
				ops = ops[1:]
				switch op.Kind {
				case oracle.OpKill:
					h.kill(op.Node)
				case oracle.OpRestart:
					if _, _, up := h.nodeIn(op.Node); !up {
						h.startSlot(op.Node)
						h.count("restart")
					}
				}
			}
			var keep []restart
			for _, r := range again {
				if r.at <= now {
					if _, _, up := h.nodeIn(r.slot); !up {
						h.startSlot(r.slot)
						h.count("restart after crash")
					}
				} else {
					keep = append(keep, r)
				}
			}
			again = keep
		case slot := <-h.crashed:
			h.note(-1, fmt.Sprintf("node in slot %d exited on its own", slot))
			again = append(again, restart{h.now() + time.Second, slot})
		case <-actorsDone:
			actorsDone = nil
			// No more kills; the pending restarts still run, so that every
			// slot is up for the final checks.
			var rest []oracle.Op
			for _, op := range ops {
				if op.Kind == oracle.OpRestart {
					rest = append(rest, op)
				}
			}
			ops = rest
		}
	}
}

// nodeIn returns the live node of exactly slot.
func (h *harness) nodeIn(slot int) (int, string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if id := h.slotNode[slot]; id >= 0 {
		return id, h.procs[id].addr, true
	}
	return -1, "", false
}

// lastChange is the latest moment a hold may have ended: the last
// connection end, leave or node death.
func (h *harness) lastChange() time.Duration {
	last := time.Duration(0)
	h.mu.Lock()
	recs := append([]connEntry(nil), h.recs...)
	for _, n := range h.nodes {
		last = max(last, n.Died)
	}
	h.mu.Unlock()
	for _, e := range recs {
		r := e.record()
		last = max(last, r.End)
		for _, hd := range r.Holds {
			last = max(last, hd.LeaveSent, hd.JoinAcked, hd.JoinSent)
		}
	}
	return last
}

// final reads the quiet service: an observer joins every room (its join
// snapshot is the fresh snapshot, and joining again takes a new one), the
// query service is polled until it equals the truth or a deadline passes,
// and so are the open clients' views against the fresh snapshots. A read
// that keeps failing is recorded, never fatal: the run is still judged.
func (h *harness) final() oracle.Final {
	f := oracle.Final{Observer: oracleObserver}
	var obs *wsClient
	for slot := range len(h.slotNode) {
		id, addr, ok := h.nodeIn(slot)
		if !ok {
			continue
		}
		c, err := h.dialWS(id, addr, oracleObserver, "obs")
		if err != nil {
			f.Errors = append(f.Errors, fmt.Sprintf("observer on node %d: %v", id, err))
			continue
		}
		c.joinAll(h.plan.Rooms, nil)
		obs = c
		break
	}
	if obs == nil {
		f.Errors = append(f.Errors, "no node took the observer")
	}
	fresh := func() (map[string]oracle.Members, error) {
		out := map[string]oracle.Members{}
		for _, r := range h.plan.Rooms {
			ch, err := obs.request(map[string]any{"type": "join", "room": r, "detail": "sessions"})
			if err != nil {
				return nil, err
			}
			fr, err := obs.await(ch, "snapshot")
			if err != nil {
				return nil, fmt.Errorf("observer snapshot of %s: %v", r, err)
			}
			if ms := fr.Snapshot.members(); len(ms) > 0 {
				out[r] = ms
			}
		}
		return out, nil
	}
	query := func() (map[string]oracle.Members, error) {
		out := map[string]oracle.Members{}
		for _, r := range h.plan.Rooms {
			ms := oracle.Members{}
			for offset := 0; ; offset += 1000 {
				b, _ := json.Marshal(map[string]any{"room": r, "offset": offset, "limit": 1000})
				resp, err := h.e.nc.Request("presence-api."+oracleRegion+".members", b, 5*time.Second)
				if err != nil {
					return nil, fmt.Errorf("query %s: %v", r, err)
				}
				var s wsSnapshot
				if err := json.Unmarshal(resp.Data, &s); err != nil {
					return nil, fmt.Errorf("query %s: %v: %s", r, err, resp.Data)
				}
				for u, ss := range s.members() {
					ms[u] = ss
				}
				if len(s.Members) < 1000 {
					break
				}
			}
			if len(ms) > 0 {
				out[r] = ms
			}
		}
		return out, nil
	}
	want := oracle.FinalMembers(&oracle.Run{Timing: h.plan.Scenario.Timing, Nodes: h.nodesCopy(), Conns: h.connRecords()})
	// poll reads until the read equals want or the deadline passes; the
	// last read is what is judged.
	pollRead := func(read func() (map[string]oracle.Members, error), skip string) (got map[string]oracle.Members, err error) {
		_ = testkit.Poll(5*time.Second, 100*time.Millisecond, func() error {
			if got, err = read(); err != nil {
				return err
			}
			if d := oracle.DiffMembers(want, got, skip); len(d) > 0 {
				return fmt.Errorf("the read differs: %v", d)
			}
			return nil
		})
		return got, err
	}
	var err error
	if f.Query, err = pollRead(query, ""); err != nil {
		f.Errors = append(f.Errors, err.Error())
	}
	if obs != nil {
		if f.Fresh, err = pollRead(fresh, ""); err != nil {
			f.Errors = append(f.Errors, err.Error())
		}
	}
	if f.Fresh != nil {
		_ = testkit.Poll(5*time.Second, 100*time.Millisecond, func() error {
			f.Views = h.views(obs)
			for _, v := range f.Views {
				if d := oracle.DiffMembers(map[string]oracle.Members{v.Room: f.Fresh[v.Room]}, map[string]oracle.Members{v.Room: v.Members}, oracleObserver); len(d) > 0 {
					return fmt.Errorf("%s's view differs from a fresh read: %v", v.Room, d)
				}
			}
			return nil
		})
	}
	f.At = h.now()
	return f
}

// views returns the views of every open client but the observer.
func (h *harness) views(obs *wsClient) []oracle.View {
	h.mu.Lock()
	var conns []*wsClient
	for _, c := range h.live {
		conns = append(conns, c)
	}
	h.mu.Unlock()
	sort.Slice(conns, func(i, j int) bool { return conns[i].id < conns[j].id })
	var out []oracle.View
	for _, c := range conns {
		if c == obs || !c.alive() {
			continue
		}
		for room, ms := range c.snapshotViews() {
			out = append(out, oracle.View{Conn: c.id, Room: room, Members: ms})
		}
	}
	return out
}

func (h *harness) nodesCopy() []oracle.Node {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]oracle.Node(nil), h.nodes...)
}

func (h *harness) connRecords() []oracle.Conn {
	h.mu.Lock()
	recs := append([]connEntry(nil), h.recs...)
	h.mu.Unlock()
	out := make([]oracle.Conn, len(recs))
	for i, e := range recs {
		out[i] = e.record()
	}
	return out
}

// readStream reads every message of the region's stream.
func (h *harness) readStream(nc *nats.Conn) []oracle.Event {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		h.t.Fatal(err)
	}
	st, err := js.Stream(ctx, "PRESENCE_"+oracleRegion)
	if err != nil {
		h.t.Fatalf("stream: %v", err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		h.t.Fatal(err)
	}
	last := info.State.LastSeq
	var out []oracle.Event
	if last == 0 {
		return out
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		h.t.Fatal(err)
	}
	for {
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			h.t.Fatalf("stream fetch: %v", err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			md, err := m.Metadata()
			if err != nil {
				h.t.Fatal(err)
			}
			e, err := h.decodeEvent(m.Data())
			e.Stored = md.Timestamp.Sub(h.start)
			if err != nil {
				h.note(-1, fmt.Sprintf("undecodable stream message %d: %v", md.Sequence.Stream, err))
			} else if h.opts.tap == nil || h.opts.tap(e) {
				out = append(out, e)
			}
			if md.Sequence.Stream >= last {
				return out
			}
		}
		if n == 0 {
			h.t.Fatalf("stream: stopped at %d events, last sequence %d", len(out), last)
		}
	}
}

// coreHas reports whether the core subscriber has seen every stream id.
func (h *harness) coreHas(stream []oracle.Event) bool {
	h.mu.Lock()
	seen := make(map[string]bool, len(h.core))
	for _, e := range h.core {
		seen[e.ID] = true
	}
	h.mu.Unlock()
	for _, e := range stream {
		if !seen[e.ID] {
			return false
		}
	}
	return true
}

func (h *harness) record(end time.Duration, stream []oracle.Event, final oracle.Final, dropped int) *oracle.Run {
	conns := h.connRecords()
	h.mu.Lock()
	defer h.mu.Unlock()
	ops := map[string]int{}
	for k, v := range h.ops {
		ops[k] = v
	}
	return &oracle.Run{
		Seed: h.plan.Scenario.Seed, Timing: h.plan.Scenario.Timing, End: end,
		Nodes: append([]oracle.Node(nil), h.nodes...), Conns: conns,
		Stream: stream, Core: append([]oracle.Event(nil), h.core...), CoreDropped: dropped,
		Ops: ops, Final: final, Resyncs: append([]oracle.Resync(nil), h.resyncs...),
		Notes: append([]oracle.Note(nil), h.notes...), Lag: append([]time.Duration(nil), h.lag...),
		Empty: append([]oracle.Empty(nil), h.empty...),
	}
}

// actor carries out one tab's operations in order.
type actor struct {
	h      *harness
	tab    *oracle.Tab
	conn   *wsClient
	rooms  []string
	states map[string]string
}

func (a *actor) run() {
	a.states = map[string]string{}
	for _, op := range a.tab.Ops {
		a.do(op)
	}
}

// lastEnd is when the tab's connection ended: its node's death if that came
// first (a kill), else the client's close or the node's.
func (a *actor) lastEnd() time.Duration {
	end, _ := a.conn.endTime()
	if d := a.h.nodeDied(a.conn.rec.Node); d != oracle.None && (end == oracle.None || d < end) {
		return d
	}
	return end
}

// usable reports whether the tab has an open connection; a connection lost
// on a node that did not die by plan (a crash) is replaced at once.
func (a *actor) usable() bool {
	if a.conn != nil && a.conn.alive() {
		return true
	}
	if a.conn == nil {
		return false
	}
	a.h.mu.Lock()
	killed := a.h.nodes[a.conn.rec.Node].Killed
	a.h.mu.Unlock()
	if _, byClient := a.conn.endTime(); byClient || killed {
		return false // the plan brings it back
	}
	a.h.count("recover")
	a.connect(a.conn.rec.Node+1, a.rooms, a.statesOf(a.rooms))
	return a.conn != nil && a.conn.alive()
}

func (a *actor) statesOf(rooms []string) []string {
	out := make([]string, len(rooms))
	for i, r := range rooms {
		out[i] = a.states[r]
	}
	return out
}

func (a *actor) do(op oracle.Op) {
	h := a.h
	switch op.Kind {
	case oracle.OpConnect:
		if op.Gap > 0 && a.conn != nil {
			// A return: keep the planned gap from the real end of the
			// connection (the close sent, or the kill).
			h.until(op.At)
			_ = testkit.Poll(5*time.Second, 10*time.Millisecond, func() error {
				if a.conn.alive() {
					return errors.New("the connection is still open")
				}
				return nil
			})
			if a.conn.alive() {
				h.note(a.conn.id, "planned return while still connected: handover instead")
				a.handover(op)
				return
			}
			h.until(a.lastEnd() + op.Gap)
			h.count("reconnect " + string(op.Band))
		} else {
			h.until(op.At)
			h.lagged(op.At)
			h.count("connect")
		}
		a.connect(op.Node, op.Rooms, op.States)
		return
	}
	h.until(op.At)
	h.lagged(op.At)
	switch op.Kind {
	case oracle.OpJoin:
		a.rooms = append(a.rooms, op.Room)
		if op.State != "" {
			a.states[op.Room] = op.State
		}
		if a.usable() {
			a.conn.joinAll([]string{op.Room}, []string{op.State})
		}
	case oracle.OpLeave:
		for i, r := range a.rooms {
			if r == op.Room {
				a.rooms = append(a.rooms[:i:i], a.rooms[i+1:]...)
				break
			}
		}
		if a.usable() {
			a.conn.leave(op.Room)
		}
	case oracle.OpState:
		a.states[op.Room] = op.State
		if a.usable() {
			a.conn.setState(op.Room, op.State)
		}
	case oracle.OpClose:
		if a.usable() {
			h.count("close")
			a.conn.closeClean()
		}
	case oracle.OpReset:
		if a.usable() {
			h.count("reset")
			a.conn.reset()
		}
	case oracle.OpHandover:
		a.handover(op)
	default:
		h.t.Errorf("unknown op %v", op)
	}
}

// connect opens a connection to slot (or the next live one), joins rooms
// and sends the states again. A failed dial tries the next slot.
func (a *actor) connect(slot int, rooms, states []string) {
	a.rooms = append([]string(nil), rooms...)
	for i, r := range rooms {
		if i < len(states) {
			a.states[r] = states[i]
		}
	}
	for try := range 3 {
		id, addr, ok := a.h.node(slot + try)
		if !ok {
			break
		}
		c, err := a.h.dialWS(id, addr, a.tab.User, a.tab.Session)
		if err != nil {
			a.h.note(-1, fmt.Sprintf("%s/%s: dial node %d: %v", a.tab.User, a.tab.Session, id, err))
			continue
		}
		a.conn = c
		c.joinAll(rooms, states)
		return
	}
	a.h.note(-1, fmt.Sprintf("%s/%s: no node to connect to", a.tab.User, a.tab.Session))
}

// handover is make-before-break: the new connection joins and sends the
// states, then the old one closes cleanly (if the node has not already
// closed it with 4001).
func (a *actor) handover(op oracle.Op) {
	a.h.count("handover")
	old := a.conn
	a.connect(op.Node, op.Rooms, op.States)
	if old != nil && old != a.conn && old.alive() {
		old.closeClean()
	}
}

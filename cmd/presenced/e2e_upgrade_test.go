package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/redis/go-redis/v9"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/oracle"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/presence"
)

// The rolling format change with real processes (region/doc.go,
// "Upgrading"): a region of format 2 (presenced as built) whose nodes are
// replaced one at a time by nodes of the test format 3 (presenced built
// with the presenceformat3 tag), then switched with presenced upgrade
// --finish; or rolled back before the switch. Throughout, users who
// stay hear nothing, every client's view is a fresh snapshot's, and the
// query service is the truth.

var (
	format3Once sync.Once
	format3Bin  string
	format3Err  error
)

// binaryFormat3 builds presenced with the test format 3, once.
func binaryFormat3(t *testing.T) string {
	t.Helper()
	format3Once.Do(func() {
		format3Bin = filepath.Join(filepath.Dir(binary), "presenced-format3")
		out, err := exec.Command("go", "build", "-tags", "presenceformat3", "-o", format3Bin, ".").CombinedOutput()
		if err != nil {
			format3Err = fmt.Errorf("build presenced with the test format 3: %v\n%s", err, out)
		}
	})
	if format3Err != nil {
		t.Fatal(format3Err)
	}
	return format3Bin
}

// A rollout's scale: 150 users, 300 tabs in 10 rooms (a third of the
// users with one tab, a third with two, a third with three), each tab
// with a state; 10 users of one tab leave during it.
const (
	upUsers   = 150
	upRooms   = 10
	upLeavers = 10
)

// upTiming gives the rollout's sessions twice the tests' TTL: 100
// clients of a killed node reconnecting at once on a loaded machine must
// not outlast their sessions (the grace stays the tests').
var upTiming = []string{"--session-ttl", (2 * e2eTTL).String(), "--heartbeat", (2 * e2eBeat).String()}

// upFleet is a region under a rollout: its nodes and the clients' tabs.
type upFleet struct {
	t       *testing.T
	e       *env
	rdb     *redis.Client
	q       *bus.Client
	mu      sync.Mutex
	nodes   []*proc // running, in the order they take new clients
	next    atomic.Int64
	tabs    []*upTab
	leavers map[string]time.Time // user -> when their one tab closed
	drains  int
	w       *watcher // every transition since the setup settled
}

// upTab is one client: it reconnects to another node whenever its
// connection ends, until it leaves.
type upTab struct {
	f                       *upFleet
	user, sess, room, state string
	mu                      sync.Mutex // all below; writes to ws
	ws                      *websocket.Conn
	view                    oracle.Members // the join's snapshot, then the events; nil while not joined
	codes                   []int          // close codes the nodes sent
	quit                    bool
	done                    chan struct{}
}

func newUpFleet(t *testing.T) *upFleet {
	e := newEnv(t)
	rdb := redis.NewClient(&redis.Options{Addr: e.redis})
	t.Cleanup(func() { _ = rdb.Close() })
	return &upFleet{t: t, e: e, rdb: rdb, q: bus.NewClient(e.nc, "eu"), leavers: map[string]time.Time{}}
}

// startNode starts a node of bin and lets it take clients.
func (f *upFleet) startNode(bin string) *proc {
	f.t.Helper()
	p := f.e.startBin(bin, f.e.nodeArgs("eu", upTiming...), nil, true)
	f.mu.Lock()
	f.nodes = append(f.nodes, p)
	f.mu.Unlock()
	return p
}

// pick is the address of a running node, round robin.
func (f *upFleet) pick() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.nodes) == 0 {
		return ""
	}
	return f.nodes[int(f.next.Add(1))%len(f.nodes)].addr
}

// drop stops giving p clients.
func (f *upFleet) drop(p *proc) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nodes = slices.DeleteFunc(f.nodes, func(q *proc) bool { return q == p })
}

// replace drains p (SIGTERM: its clients reconnect to the others) and
// starts a node of bin in its place.
func (f *upFleet) replace(p *proc, bin string) *proc {
	f.t.Helper()
	f.drop(p)
	f.drains++
	p.signal(syscall.SIGTERM)
	if code := p.exit(f.t, 20*time.Second); code != 0 {
		f.t.Fatalf("a drained node exited %d", code)
	}
	return f.startNode(bin)
}

// kill SIGKILLs p and starts a node of bin in its place.
func (f *upFleet) kill(p *proc, bin string) *proc {
	f.t.Helper()
	f.drop(p)
	p.signal(syscall.SIGKILL)
	p.exit(f.t, 10*time.Second)
	return f.startNode(bin)
}

// tabsPerUser is 1, 2 or 3: a third of the users each.
func tabsPerUser(i int) int { return i%3 + 1 }

// connect starts every tab and waits until each has joined and set its
// state, and every transition of that has come: the watcher started
// after it hears only what the rollout changes.
func (f *upFleet) connect() {
	f.t.Helper()
	setup := f.e.watch()
	for i := range upUsers {
		for k := range tabsPerUser(i) {
			user := fmt.Sprintf("u%03d", i)
			tb := &upTab{f: f, user: user, sess: fmt.Sprintf("%s-t%d", user, k), room: fmt.Sprintf("r%d", i%upRooms),
				state: fmt.Sprintf(`{"tab":%d,"user":"%s"}`, k, user), done: make(chan struct{})}
			f.tabs = append(f.tabs, tb)
			go tb.run()
		}
	}
	// An online per user, an update (joined) per further tab, an update
	// (state) per tab.
	want := upUsers + (len(f.tabs) - upUsers) + len(f.tabs)
	testkit.CheckFor(f.t, 60*time.Second, 10*time.Millisecond, func() error { return testkit.AtLeast("tabs joined with their states", len(setup.All()), want) })
	f.settled("the setup")
	f.w = f.e.watch()
}

// leave closes the one tab of the next n leavers (users with one tab).
func (f *upFleet) leave(n int) {
	f.t.Helper()
	for _, tb := range f.tabs {
		if n == 0 {
			return
		}
		if tabsPerUser(userIndex(tb.user)) != 1 || userIndex(tb.user)%15 != 0 {
			continue
		}
		if _, gone := f.leavers[tb.user]; gone {
			continue
		}
		// A tab between two connections would leave by its session's
		// expiry, not by a release: it leaves once joined.
		testkit.CheckFor(f.t, 30*time.Second, 10*time.Millisecond, func() error {
			if !tb.joined() {
				return fmt.Errorf("%s not joined yet, and it must before it leaves", tb.sess)
			}
			return nil
		})
		// Before the close is sent: its release, and so the grace, come
		// after this.
		f.leavers[tb.user] = time.Now()
		tb.leave()
		n--
	}
}

func userIndex(user string) int {
	var i int
	_, _ = fmt.Sscanf(user, "u%d", &i)
	return i
}

// joined reports whether the tab holds a connection with its join's
// snapshot.
func (tb *upTab) joined() bool {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return tb.ws != nil && tb.view != nil
}

func (tb *upTab) leave() {
	tb.mu.Lock()
	tb.quit = true
	if tb.ws != nil {
		_ = tb.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "bye"), time.Now().Add(time.Second))
	}
	tb.mu.Unlock()
	select {
	case <-tb.done:
	case <-time.After(10 * time.Second):
		tb.f.t.Errorf("%s did not close", tb.sess)
	}
}

// run keeps the tab connected and joined until it leaves.
func (tb *upTab) run() {
	defer close(tb.done)
	for {
		tb.mu.Lock()
		quit := tb.quit
		tb.mu.Unlock()
		if quit {
			return
		}
		addr := tb.f.pick()
		if addr == "" || tb.session(addr) != nil {
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// session is one connection of the tab: it dials addr, joins, sets the
// state the first time, and folds the frames into the view until the
// connection ends.
func (tb *upTab) session(addr string) error {
	tok, err := oracleToken(e2eSecret, tb.user)
	if err != nil {
		return err
	}
	d := websocket.Dialer{HandshakeTimeout: 5 * time.Second}
	ws, resp, err := d.Dial(fmt.Sprintf("ws://%s/v1/ws?session=%s&access_token=%s", addr, tb.sess, tok), nil)
	if resp != nil && resp.Body != nil {
		resp.Body.Close()
	}
	if err != nil {
		return err
	}
	defer ws.Close()
	tb.mu.Lock()
	tb.ws = ws
	quit := tb.quit
	tb.mu.Unlock()
	if quit {
		return nil
	}
	tb.send(map[string]any{"type": "join", "room": tb.room, "ref": "j"})
	for {
		_, data, err := ws.ReadMessage()
		if err != nil {
			tb.ended(err)
			return nil
		}
		tb.frame(data)
	}
}

func (tb *upTab) send(m map[string]any) {
	b, _ := json.Marshal(m)
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if tb.ws != nil {
		_ = tb.ws.SetWriteDeadline(time.Now().Add(5 * time.Second))
		_ = tb.ws.WriteMessage(websocket.TextMessage, b)
	}
}

// ended records the node's close code and forgets the view.
func (tb *upTab) ended(err error) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	var ce *websocket.CloseError
	if errors.As(err, &ce) && ce.Code != websocket.CloseAbnormalClosure {
		tb.codes = append(tb.codes, ce.Code)
	}
	tb.ws, tb.view = nil, nil
}

// frame folds one frame into the view (PROTOCOL.md, "What a view holds"),
// sends the state after every join and retries a join refused for
// the store's pace.
func (tb *upTab) frame(data []byte) {
	var f wsFrame
	if e, ok := fastEvent(data); ok {
		f.Type, f.ev = "event", e
	} else if json.Unmarshal(data, &f) != nil {
		return
	}
	switch {
	case f.Type == "snapshot" && f.Snapshot != nil:
		tb.mu.Lock()
		tb.view = f.Snapshot.members()
		tb.mu.Unlock()
		// As a client does after every join: the same state again is no
		// change, on a node of either format.
		tb.send(map[string]any{"type": "state", "room": tb.room, "state": json.RawMessage(tb.state), "ref": "s"})
	case f.Type == "event":
		e := f.ev
		if e.ID == "" && json.Unmarshal(f.Event, &e) != nil {
			return
		}
		tb.mu.Lock()
		foldEvent(tb.view, e)
		tb.mu.Unlock()
	case f.Type == "error" && f.Ref == "j" && f.Code == "unavailable":
		time.AfterFunc(200*time.Millisecond, func() { tb.send(map[string]any{"type": "join", "room": tb.room, "ref": "j"}) })
	case f.Type == "error":
		tb.f.t.Errorf("%s: error frame %s %s (ref %q)", tb.sess, f.Code, f.Message, f.Ref)
	}
}

// foldEvent applies an event to a view (nil: not joined).
func foldEvent(v oracle.Members, e wsEvent) {
	if v == nil {
		return
	}
	switch e.Kind {
	case "online":
		v[e.User] = map[string]string{e.Session: ""}
	case "offline":
		delete(v, e.User)
	case "update":
		ss := v[e.User]
		if ss == nil {
			return
		}
		switch e.Reason {
		case "joined":
			ss[e.Session] = ""
		case "left", "expired":
			delete(ss, e.Session)
		default:
			ss[e.Session] = normState(e.State)
		}
	}
}

// truth is what every room should list: the tabs that have not left,
// with their states; users whose grace still runs are left out (grace
// lists them as members for a while, and then not).
func (f *upFleet) truth() (map[string]oracle.Members, map[string]bool) {
	out, skip := map[string]oracle.Members{}, map[string]bool{}
	for u, at := range f.leavers {
		if time.Since(at) < e2eGrace+3*time.Second {
			skip[u] = true
		}
	}
	for _, tb := range f.tabs {
		if out[tb.room] == nil {
			out[tb.room] = oracle.Members{}
		}
		if _, gone := f.leavers[tb.user]; gone || skip[tb.user] {
			continue
		}
		if out[tb.room][tb.user] == nil {
			out[tb.room][tb.user] = map[string]string{}
		}
		out[tb.room][tb.user][tb.sess] = normState(json.RawMessage(tb.state))
	}
	return out, skip
}

// mismatch compares, for every room, the query service's snapshot with
// the truth, and every joined tab's view with the snapshot; "" when all
// agree. Every tab must be joined.
func (f *upFleet) mismatch() string {
	truth, skip := f.truth()
	snaps := map[string]oracle.Members{}
	for room, want := range truth {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		snap, err := f.q.Snapshot(ctx, room, 0, 1000)
		cancel()
		if err != nil {
			return fmt.Sprintf("snapshot of %s: %v", room, err)
		}
		got := oracle.Members{}
		for _, m := range snap.Members {
			if skip[m.User] {
				continue
			}
			got[m.User] = map[string]string{}
			for _, ss := range m.Sessions {
				got[m.User][ss.ID] = normState(ss.State)
			}
		}
		if !reflect.DeepEqual(got, want) {
			return fmt.Sprintf("the query service's %s: %v, want %v", room, got, want)
		}
		snaps[room] = got
	}
	for _, tb := range f.tabs {
		if d := tb.differs(snaps[tb.room], skip); d != "" {
			return d
		}
	}
	return ""
}

// differs compares the tab's view with a snapshot, users in skip aside.
func (tb *upTab) differs(snap oracle.Members, skip map[string]bool) string {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if tb.quit {
		return ""
	}
	if tb.view == nil {
		return tb.sess + " is not joined"
	}
	v := maps.Clone(tb.view)
	maps.DeleteFunc(v, func(u string, _ map[string]string) bool { return skip[u] })
	if !reflect.DeepEqual(v, snap) {
		return fmt.Sprintf("%s's view of %s: %v, the snapshot %v", tb.sess, tb.room, v, snap)
	}
	return ""
}

// settled waits until every tab is joined and every view, the snapshots
// and the truth agree.
func (f *upFleet) settled(when string) {
	f.t.Helper()
	var last string
	// Generous: on a loaded machine 300 clients moving and the query
	// service's answers take their time; on an idle one this is a second.
	if err := testkit.Poll(90*time.Second, 200*time.Millisecond, func() error {
		if last = f.mismatch(); last != "" {
			return errors.New(last)
		}
		return nil
	}); err != nil {
		f.t.Fatalf("after %s: %v", when, err)
	}
}

// upgradeCmd runs presenced upgrade of bin on the region.
func (f *upFleet) upgradeCmd(bin string, args ...string) (string, int) {
	f.t.Helper()
	cmd := exec.Command(bin, append([]string{"upgrade", "--redis", f.e.redis}, args...)...)
	out, err := cmd.CombinedOutput()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		f.t.Fatal(err)
	}
	return string(out), code
}

// states returns the region's stored states (presence:{R}:st), raw.
func (f *upFleet) states() []string {
	var out []string
	for r := range upRooms {
		for _, v := range f.rdb.HGetAll(context.Background(), fmt.Sprintf("presence:{r%d}:st", r)).Val() {
			out = append(out, v)
		}
	}
	return out
}

// format3States reports whether the stored states are all (true) or
// none (false) in format 3, and whether that holds.
func (f *upFleet) formatOfStates(three bool) bool {
	vs := f.states()
	for _, v := range vs {
		if strings.HasPrefix(v, "~") != three {
			return false
		}
	}
	return len(vs) > 0
}

// verdict waits past the last leaver's grace, then checks what the
// rollout announced: one offline (left) per leaver, on time, nothing for
// anyone else, and no tab ever closed with 4001.
func (f *upFleet) verdict() {
	f.t.Helper()
	var latest time.Time
	for _, at := range f.leavers {
		if at.After(latest) {
			latest = at
		}
	}
	pastGrace(latest)
	f.settled("the last grace")
	got := map[string]int{}
	for _, tr := range f.w.All() {
		at, left := f.leavers[tr.User]
		if !left || tr.Kind != presence.Offline || tr.Reason != presence.Left {
			f.t.Errorf("announced during the rollout: %s %s %s/%s", tr.Kind, tr.Reason, tr.Room, tr.User)
			continue
		}
		got[tr.User]++
		// Never before the grace (the close was sent after at); after it,
		// a reap interval and a loaded machine's delay.
		if d := tr.At.Sub(at); d < e2eGrace || d > e2eGrace+4*time.Second {
			f.t.Errorf("%s's offline %v after the close, want the grace (%v)", tr.User, d, e2eGrace)
		}
	}
	for u := range f.leavers {
		if got[u] != 1 {
			f.t.Errorf("%s announced offline %d times, want once", u, got[u])
		}
	}
	moved := 0
	for _, tb := range f.tabs {
		tb.mu.Lock()
		if slices.Contains(tb.codes, oracle.CodeSessionMoved) {
			f.t.Errorf("%s closed with %d", tb.sess, oracle.CodeSessionMoved)
		}
		for _, c := range tb.codes {
			if c == websocket.CloseServiceRestart {
				moved++
			}
		}
		tb.mu.Unlock()
	}
	// Each drain moved its clients: the rollout did move them.
	if moved < f.drains {
		f.t.Errorf("%d clients closed with 1012 over %d drains", moved, f.drains)
	}
	f.t.Logf("%d tabs, %d drains, %d closes with 1012, %d transitions during the rollout", len(f.tabs), f.drains, moved, len(f.w.All()))
}

// A region of format 2 is rolled, node by node, to nodes of format 3,
// then switched: nothing is announced but the leavers' offlines, every
// view is a fresh snapshot's after each step, the data stays in format 2
// until the switch and moves to 3 after it. With kill, the first node of
// format 3 is SIGKILLed mid-rollout and replaced.
func TestE2EFormatRollout(t *testing.T) {
	skipIfShort(t, "a rolling format change of 3 nodes and 300 clients")
	for _, kill := range []bool{false, true} {
		t.Run(map[bool]string{false: "drains", true: "a node killed"}[kill], func(t *testing.T) {
			bin3 := binaryFormat3(t)
			f := newUpFleet(t)
			old := []*proc{f.startNode(binary), f.startNode(binary), f.startNode(binary)}
			f.connect()
			var fresh []*proc
			for i, p := range old {
				fresh = append(fresh, f.replace(p, bin3))
				if kill && i == 1 {
					// Killed before the leaves, not after: a close the
					// node has echoed but not yet stored as a release
					// ends, when the node dies, as an expiry, rightly.
					fresh[0] = f.kill(fresh[0], bin3)
					f.settled("the kill")
				}
				f.leave(3 + i/2)
				f.settled(fmt.Sprintf("replacing node %d", i))
				if i < 2 {
					if out, code := f.upgradeCmd(bin3); code != 0 || !strings.Contains(out, "not ready") {
						t.Fatalf("status with nodes of format 2 left: exit %d\n%s", code, out)
					}
				}
			}
			if !f.formatOfStates(false) {
				t.Fatalf("states in format 3 before the switch: %q", f.states())
			}
			out, code := f.upgradeCmd(bin3, "--finish")
			if code != 0 || !strings.Contains(out, "switched the region from format 2 to 3") {
				t.Fatalf("upgrade --finish: exit %d\n%s", code, out)
			}
			testkit.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
				if !f.formatOfStates(true) {
					return fmt.Errorf("states %v, want every one in format 3", f.states())
				}
				return nil
			})
			if _, code := f.upgradeCmd(binary); code == 0 {
				t.Fatal("presenced of format 2 accepted a region of format 3")
			}
			f.settled("the switch")
			f.verdict()
		})
	}
}

// Before the switch a rollout can go back: with two nodes of format 3
// beside one of format 2 the switch is refused, naming the old node; the
// nodes of format 3 are replaced by nodes of format 2 again, which read
// everything, and nothing is announced but the leavers' offlines.
func TestE2EFormatRollback(t *testing.T) {
	skipIfShort(t, "a rolled back format change of 3 nodes and 300 clients")
	bin3 := binaryFormat3(t)
	f := newUpFleet(t)
	nodes := []*proc{f.startNode(binary), f.startNode(binary), f.startNode(binary)}
	f.connect()
	for i := range 2 {
		nodes[i] = f.replace(nodes[i], bin3)
		f.leave(2)
		f.settled(fmt.Sprintf("replacing node %d", i))
	}
	out, code := f.upgradeCmd(bin3, "--finish")
	if code == 0 || !strings.Contains(out, "cannot switch to format 3") {
		t.Fatalf("upgrade --finish beside a node of format 2: exit %d\n%s", code, out)
	}
	if v := f.rdb.Get(context.Background(), "presence:schema").Val(); v != "2" {
		t.Fatalf("marker %q after a refused switch", v)
	}
	for i := range 2 {
		nodes[i] = f.replace(nodes[i], binary)
		f.leave(3)
		f.settled(fmt.Sprintf("rolling node %d back", i))
	}
	if !f.formatOfStates(false) {
		t.Fatalf("states in format 3 in a region of format 2: %q", f.states())
	}
	f.verdict()
}

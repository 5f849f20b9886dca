package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/target"
	"github.com/chromedp/chromedp"
	"github.com/gorilla/websocket"

	"github.com/presence-dev/presence/internal/tcpproxy"
	"github.com/presence-dev/presence/internal/testkit"
)

// The browser tests drive the JavaScript client (/v1/client.js) in a
// headless Chromium against a real presenced. Each page's WebSocket goes
// through a tcpproxy.Proxy of its own, so a test can cut one tab's link at
// the TCP level. The pages are served by a test HTTP server (testPage),
// which also forwards /v1/client.js to the node.

// Browser test timing: short, and the grace long enough for a cut link
// to come back inside it (the client retries after about half a second).
const (
	brTTL   = 4 * time.Second
	brGrace = 3 * time.Second
	brBeat  = time.Second
	brReap  = 100 * time.Millisecond
)

// browserEnv names the variable that makes a missing browser a failure
// instead of a skip (CI sets it).
const browserEnv = "PRESENCE_REQUIRE_BROWSER"

// chromiumPath finds the browser: $PRESENCE_CHROMIUM, else chromium on
// the PATH (Debian's package installs /usr/bin/chromium).
func chromiumPath() string {
	if p := os.Getenv("PRESENCE_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// browser is one headless Chromium for a test. Its first context is
// never navigated: tabs are children of it.
type browser struct {
	t   *testing.T
	ctx context.Context
}

// newBrowser starts Chromium, or skips the test (under -short, or when
// there is no browser and PRESENCE_REQUIRE_BROWSER is not 1).
func newBrowser(t *testing.T) *browser {
	t.Helper()
	skipIfShort(t, "browser test")
	path := chromiumPath()
	if path == "" {
		if os.Getenv(browserEnv) == "1" {
			t.Fatalf("no chromium on the PATH and %s=1 (Debian: apt-get install -y chromium)", browserEnv)
		}
		t.Skipf("no chromium on the PATH (Debian: apt-get install -y chromium; %s=1 makes this a failure)", browserEnv)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, // CI runs as root, where Chromium's sandbox refuses to start
		chromedp.DisableGPU,
	)
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); acancel() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser, bound to ctx
		t.Fatalf("start chromium (%s): %v", path, err)
	}
	return &browser{t: t, ctx: ctx}
}

// tab is one page of the browser.
type tab struct {
	t       *testing.T
	name    string
	ctx     context.Context
	cancel  context.CancelFunc
	console testkit.Recorder[chromedp.ConsoleMessage]
	closed  bool
}

// open opens url in a new tab. A new profile (isolated) is another
// browser as far as the page can tell: its own storage and its own
// BroadcastChannel; otherwise the tab shares the test browser's.
func (b *browser) open(name, u string, isolated bool) *tab {
	b.t.Helper()
	var opts []chromedp.ContextOption
	if isolated {
		opts = append(opts, chromedp.WithNewBrowserContext())
	}
	ctx, cancel := chromedp.NewContext(b.ctx, opts...)
	tb := b.attach(name, ctx, cancel)
	nctx, ncancel := context.WithTimeout(ctx, 15*time.Second)
	defer ncancel()
	if err := chromedp.Do(nctx, chromedp.Navigate(u)); err != nil {
		b.t.Fatalf("%s: navigate to %s: %v", name, u, err)
	}
	return tb
}

// attach makes a tab of a context and records its console.
func (b *browser) attach(name string, ctx context.Context, cancel context.CancelFunc) *tab {
	b.t.Helper()
	tb := &tab{t: b.t, name: name, ctx: ctx, cancel: cancel}
	messages := chromedp.Console(ctx) // creates the target: every message of the page is seen
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			tb.console.Add(m)
		}
	}()
	b.t.Cleanup(func() {
		if b.t.Failed() {
			for _, m := range tb.console.All() {
				b.t.Logf("%s console: %s", name, m)
			}
		}
		tb.close()
	})
	return tb
}

// duplicate opens a copy of the tab the way a browser duplicates one:
// window.open of the same URL, which copies the tab's sessionStorage.
func (tb *tab) duplicate(name string) *tab {
	tb.t.Helper()
	ch := chromedp.WaitNewTarget(tb.ctx, func(i *target.Info) bool { return i.Type == "page" })
	tb.eval(`void window.open(location.href)`, nil)
	var id target.ID
	select {
	case id = <-ch:
	case <-time.After(10 * time.Second):
		tb.t.Fatalf("%s: window.open made no tab", tb.name)
	}
	if id == "" {
		tb.t.Fatalf("%s: window.open made no tab", tb.name)
	}
	b := &browser{t: tb.t, ctx: tb.ctx}
	ctx, cancel := chromedp.NewContext(tb.ctx, chromedp.WithTargetID(id))
	return b.attach(name, ctx, cancel)
}

// close closes the tab, as a user closing it.
func (tb *tab) close() {
	if tb.closed {
		return
	}
	tb.closed = true
	tb.cancel()
}

// eval runs a JavaScript expression in the page and decodes its value
// into out (nil: ignore it).
func (tb *tab) eval(expr string, out any) {
	tb.t.Helper()
	if err := tb.tryEval(expr, out); err != nil {
		tb.t.Fatalf("%s: %s: %v", tb.name, expr, err)
	}
}

func (tb *tab) tryEval(expr string, out any) error {
	ctx, cancel := context.WithTimeout(tb.ctx, 5*time.Second)
	defer cancel()
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[[]byte](expr, chromedp.EvalAsValue, chromedp.EvalAwaitPromise))
	if err != nil || out == nil {
		return err
	}
	if len(raw) == 0 {
		return fmt.Errorf("no value")
	}
	return json.Unmarshal(raw, out)
}

// click clicks the element that the CSS selector finds.
func (tb *tab) click(sel string) {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, 10*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(sel))); err != nil {
		tb.t.Fatalf("%s: click %s: %v", tb.name, sel, err)
	}
}

// noConsoleErrors fails the test if the page logged an error, threw, or
// the browser logged an error for it (a failed request, a favicon 404).
func (tb *tab) noConsoleErrors() {
	tb.t.Helper()
	for _, m := range tb.console.All() {
		if m.Type == chromedp.ConsoleError || m.IsException() {
			tb.t.Errorf("%s: console %s (%s:%d)", tb.name, m, m.URL, m.Line)
		}
	}
}

// pageView is what the test page exposes of its client (window.view()).
type pageView struct {
	Ready    bool         `json:"ready"`
	Status   string       `json:"status"`   // client.status
	Session  string       `json:"session"`  // client.sessionId
	Stored   string       `json:"stored"`   // sessionStorage "presence.session"
	Synced   bool         `json:"synced"`   // a sync came
	Members  []pageMember `json:"members"`  // room.members()
	Events   []roomEvent  `json:"events"`   // room events, in order
	Statuses []string     `json:"statuses"` // client status changes, in order
	Errors   []string     `json:"errors"`   // client errors
	Tokens   int          `json:"tokens"`   // getToken calls
	Closes   []int        `json:"closes"`   // close codes of the client's WebSockets, in order
}

type pageMember struct {
	User     string        `json:"user"`
	Sessions []pageSession `json:"sessions"`
}

type pageSession struct {
	ID    string          `json:"id"`
	State json.RawMessage `json:"state,omitempty"`
}

// roomEvent is one room event the page got: join, leave, update, sync
// (user and session empty for a sync).
type roomEvent struct {
	Type    string `json:"type"`
	At      int64  `json:"at"` // Date.now() in the page
	User    string `json:"user"`
	Session string `json:"session"`
	Reason  string `json:"reason"`
	Data    string `json:"data"` // the event as JSON, for messages
}

// member returns user's entry, if listed.
func (v pageView) member(user string) (pageMember, bool) {
	for _, m := range v.Members {
		if m.User == user {
			return m, true
		}
	}
	return pageMember{}, false
}

// users lists the members' user ids, in the page's order.
func (v pageView) users() []string {
	var out []string
	for _, m := range v.Members {
		out = append(out, m.User)
	}
	return out
}

// status returns the "status" field of the state of user's session id:
// listed reports whether that session is listed, and status is "" for
// a session without state (or without that field).
func (v pageView) status(user, id string) (status string, listed bool) {
	m, ok := v.member(user)
	if !ok {
		return "", false
	}
	for _, s := range m.Sessions {
		if s.ID == id {
			var st struct {
				Status string `json:"status"`
			}
			_ = json.Unmarshal(s.State, &st) // no state, or another shape: ""
			return st.Status, true
		}
	}
	return "", false
}

// sessionIDs lists user's session ids, sorted.
func (v pageView) sessionIDs(user string) []string {
	m, _ := v.member(user)
	var out []string
	for _, s := range m.Sessions {
		out = append(out, s.ID)
	}
	slices.Sort(out)
	return out
}

// eventsSince returns the room events at index from and after, leaving
// out syncs (a resync is a snapshot, not a change).
func (v pageView) eventsSince(from int) []roomEvent {
	var out []roomEvent
	for i := from; i < len(v.Events); i++ {
		if v.Events[i].Type != "sync" {
			out = append(out, v.Events[i])
		}
	}
	return out
}

func (v pageView) String() string {
	b, _ := json.Marshal(v)
	return string(b)
}

// view reads the test page's view.
func (tb *tab) view() pageView {
	tb.t.Helper()
	var v pageView
	tb.eval(`window.view()`, &v)
	return v
}

// waitView polls the page's view until cond holds, and returns it.
func (tb *tab) waitView(within time.Duration, what string, cond func(pageView) bool) pageView {
	tb.t.Helper()
	var last pageView
	testkit.CheckFor(tb.t, within, 50*time.Millisecond, func() error {
		var v pageView
		if err := tb.tryEval(`window.view ? window.view() : {ready:false}`, &v); err != nil {
			return fmt.Errorf("%s: waiting for %s; last view %s (error %w)", tb.name, what, last, err)
		}
		last = v
		if v.Ready && cond(v) {
			return nil
		}
		return fmt.Errorf("%s: waiting for %s; last view %s", tb.name, what, last)
	})
	return last
}

// waitSynced waits for the page's client to be open and its room synced.
func (tb *tab) waitSynced() pageView {
	tb.t.Helper()
	return tb.waitView(15*time.Second, "the client open and the room synced", func(v pageView) bool {
		return v.Status == "open" && v.Synced
	})
}

// testPage serves the page that drives the client, /v1/client.js
// (forwarded to the node), and short tokens for the token test.
type testPage struct {
	t   *testing.T
	srv *httptest.Server

	mu        sync.Mutex
	tokenUser string        // whom /token mints for ("": no tokens)
	tokenTTL  time.Duration // how long they live
	minted    []time.Time   // expiry of each token served
	fixed     string        // served by /token as it is, when set
}

// newTestPage serves the test page for the node at nodeAddr.
func newTestPage(t *testing.T, nodeAddr string) *testPage {
	t.Helper()
	p := &testPage{t: t}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write([]byte(testPageHTML))
	})
	mux.HandleFunc("GET /favicon.ico", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	// The node serves the client (clients/js, built into presenced); the
	// page loads it from its own origin.
	mux.Handle("GET /v1/client.js", httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: nodeAddr}))
	mux.HandleFunc("GET /token", p.token)
	p.srv = httptest.NewServer(mux)
	t.Cleanup(p.srv.Close)
	return p
}

// serveTokens makes /token mint tokens for user that live ttl (whole
// seconds: JWT expiry has no finer grain).
func (p *testPage) serveTokens(user string, ttl time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tokenUser, p.tokenTTL = user, ttl
}

// serveToken makes /token serve tok, minted elsewhere.
func (p *testPage) serveToken(tok string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fixed = tok
}

func (p *testPage) token(w http.ResponseWriter, _ *http.Request) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fixed != "" {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte(p.fixed))
		return
	}
	if p.tokenUser == "" {
		http.Error(w, "no tokens in this test", http.StatusNotFound)
		return
	}
	tok, err := testkit.Token([]byte(e2eSecret), p.tokenUser, []string{"*"}, p.tokenTTL)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	p.minted = append(p.minted, time.Now().Add(p.tokenTTL).Truncate(time.Second))
	w.Header().Set("Content-Type", "text/plain")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write([]byte(tok))
}

// tokens returns the expiry of every token minted so far.
func (p *testPage) tokens() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Time(nil), p.minted...)
}

// link is a proxy for one tab's WebSocket to the node.
func link(t *testing.T, nodeAddr string) *tcpproxy.Proxy {
	t.Helper()
	p, err := tcpproxy.New(nodeAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// pageOpts are the query parameters of the test page.
type pageOpts struct {
	room   string
	user   string // dev mode: the client's user option
	tokens bool   // secured: getToken fetches /token (see serveTokens)
	// tokenURL: getToken fetches this URL (another origin: the dev node's
	// /dev/token).
	tokenURL string
}

// url is the test page's address for a client whose WebSocket goes
// through proxy.
func (p *testPage) url(proxy *tcpproxy.Proxy, o pageOpts) string {
	q := url.Values{}
	q.Set("ws", "ws://"+proxy.Addr()+"/v1/ws")
	q.Set("room", o.room)
	if o.user != "" {
		q.Set("user", o.user)
	}
	if o.tokens {
		q.Set("tokens", "1")
	}
	if o.tokenURL != "" {
		q.Set("token_url", o.tokenURL)
	}
	return p.srv.URL + "/?" + q.Encode()
}

// startDev runs `presenced dev` (its own redis-server and embedded
// nats-server) with the browser tests' timing.
func startDev(t *testing.T) *proc {
	t.Helper()
	return startDevGrace(t, brGrace)
}

// startDevGrace is startDev with another offline grace (its session TTL
// a second longer than the grace, at least brTTL).
func startDevGrace(t *testing.T, grace time.Duration) *proc {
	t.Helper()
	t.Setenv("REDIS_URL", "") // the dev node starts its own Redis
	e := &env{t: t}
	return e.start([]string{"dev", "--listen", "127.0.0.1:0", "--nats-port", "-1",
		"--session-ttl", max(brTTL, grace+time.Second).String(), "--heartbeat", brBeat.String(),
		"--offline-grace", grace.String(), "--reap-interval", brReap.String(),
		"--last-seen-interval", "2s"}, true)
}

// startSecured runs a node that takes HS256 tokens signed with
// e2eSecret, against a test Redis and NATS.
func startSecured(t *testing.T) *proc {
	t.Helper()
	return newEnv(t).startBrowserNode()
}

// startBrowserNode runs a node of region eu against e's Redis and NATS,
// taking HS256 tokens signed with e2eSecret, with the browser tests'
// timing. Several of them on one env are one region's nodes.
func (e *env) startBrowserNode() *proc {
	e.t.Helper()
	args := []string{"node",
		"--region", "eu", "--redis", e.redis, "--nats", e.nats, "--listen", "127.0.0.1:0",
		"--jwt-secret", e2eSecret,
		"--session-ttl", brTTL.String(), "--heartbeat", brBeat.String(),
		"--offline-grace", brGrace.String(), "--reap-interval", brReap.String(),
		"--last-seen-interval", "2s", "--drain-timeout", "5s",
	}
	return e.start(args, true)
}

// testPageHTML drives one client: the room of ?room= joined with detail
// "sessions", its WebSocket at ?ws=, dev mode's ?user= or (?tokens=1)
// tokens from /token, or from ?token_url=. window.view() returns what
// the test reads.
const testPageHTML = `<!doctype html>
<html lang="en">
<meta charset="utf-8">
<title>presence browser test</title>
<pre id="out"></pre>
<script type="module">
import { createClient } from "/v1/client.js";

const q = new URLSearchParams(location.search);
const log = { events: [], statuses: [], errors: [], synced: false, tokens: 0, closes: [] };
const copy = e => { try { return JSON.stringify(e === undefined ? null : e); } catch (err) { return String(e); } };

// The client's WebSockets record how they closed (a drain is 1012).
class RecordingWebSocket extends WebSocket {
  constructor(url, protocols) {
    super(url, protocols);
    this.addEventListener("close", e => log.closes.push(e.code));
  }
}
const opts = { url: q.get("ws"), WebSocket: RecordingWebSocket };
if (q.has("user")) opts.user = q.get("user");
if (q.has("tokens") || q.has("token_url")) {
  opts.getToken = async () => {
    log.tokens++;
    const r = await fetch(q.get("token_url") || "/token", { cache: "no-store" });
    if (!r.ok) throw new Error("token: " + r.status);
    return r.text();
  };
}
const client = createClient(opts);
client.on("status", s => log.statuses.push(s));
client.on("error", e => log.errors.push(String(e && e.message || e)));

const room = client.room(q.get("room"), { detail: "sessions" });
// join, leave and update get (member, {reason, session, state}); sync
// gets the members.
for (const type of ["sync", "join", "leave", "update"]) {
  room.on(type, (m, info) => {
    if (type === "sync") { log.synced = true; m = undefined; }
    log.events.push({ type, at: Date.now(), user: (m && m.user) || "", session: (info && info.session) || "",
      reason: (info && info.reason) || "", data: copy({ member: m, info }) });
  });
}
room.subscribe(() => { document.getElementById("out").textContent = JSON.stringify(room.members(), null, 1); });

window.client = client;
window.room = room;
window.view = () => ({
  ready: true,
  status: client.status,
  session: client.sessionId || "",
  stored: sessionStorage.getItem("presence.session") || "",
  synced: log.synced,
  members: room.members(),
  events: log.events,
  statuses: log.statuses,
  errors: log.errors,
  tokens: log.tokens,
  closes: log.closes,
});
</script>
</html>
`

// passMarker joins room on the dev node at addr as user, with a
// connection of its own, and closes it cleanly. Its departure is due a
// grace after the close; the reaper settles a room's due departures in the
// order they fell due, and a page gets the room's events in seq order. So
// once a page has seen the marker leave, any departure that fell due
// before it has reached that page too: a test of "nothing was announced"
// waits for that instead of for the clock.
func passMarker(t *testing.T, addr, room, user string) {
	t.Helper()
	c := dialURL(t, fmt.Sprintf("ws://%s/v1/ws?session=m&user=%s", addr, user), user, "m")
	c.join(room)
	c.w.SendClose(websocket.CloseNormalClosure, "marker")
}

// sawLeave reports whether the page's events since from include user's
// leave.
func (v pageView) sawLeave(from int, user string) bool {
	return slices.ContainsFunc(v.eventsSince(from), func(e roomEvent) bool { return e.Type == "leave" && e.User == user })
}

// about returns the events since from about user.
func (v pageView) about(from int, user string) []roomEvent {
	return slices.DeleteFunc(v.eventsSince(from), func(e roomEvent) bool { return e.User != user })
}

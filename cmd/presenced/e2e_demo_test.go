package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/presence-dev/presence/internal/testkit"
)

// The demo page of presenced dev, in real Chromium: two users see each
// other (avatars, the user's state, short session ids with the whole id
// on hover, the grace from hello); "away" reaches the other; "Drop
// connection" takes the client to reconnecting and back to open with the
// same session while the other page hears nothing, and the dropping tab
// says so; closing a tab is one leave, after the grace. The page fits a
// phone's width. With PRESENCE_SCREENSHOTS=dir each step is saved there.
func TestBrowserDemoPage(t *testing.T) {
	b := newBrowser(t)
	// A grace of 6 s: the page drops for min(3 s, grace - 2 s), long
	// enough to be seen reconnecting on a loaded machine.
	const grace = 6 * time.Second
	n := startDevGrace(t, grace)
	shots := newDemoShots(t, "demo")
	const room = "br-demo"
	base := "http://" + n.addr + "/?room=" + room

	alice := b.open("alice", base+"&user=alice", true)
	bob := b.open("bob", base, true)
	alice.viewport(1200, 860) // a laptop's window
	bob.viewport(1200, 860)
	var name string
	bob.eval(`document.getElementById("user").value`, &name)
	if name == "" {
		t.Fatal("the demo page offers no name without ?user=")
	}
	bob.eval(`(() => { const f = document.getElementById("who"); f.elements.user.value = "bob"; f.requestSubmit(); return true })()`, nil)
	both := func(d demoView) bool { return slices.Equal(d.users(), []string{"alice", "bob"}) }
	ad := waitDemo(t, alice, "alice and bob listed", both)
	bd := waitDemo(t, bob, "alice and bob listed", both)
	if bd.Me != "bob" || ad.Me != "alice" || ad.Status != "open" || bd.Status != "open" {
		t.Fatalf("names %q and %q, statuses %q and %q", ad.Me, bd.Me, ad.Status, bd.Status)
	}
	sid := ad.SessionTitle
	checkDemoMembers(t, bd, "alice", ad)
	// The timing in force, as hello gave it: the dev node's grace.
	if want := demoSecs(grace); !strings.HasPrefix(ad.Grace, want) {
		t.Fatalf("alice's page shows the grace %q, want %s (hello's offline_grace_ms)", ad.Grace, want)
	}
	if ad.Region == "" || ad.Region == "–" {
		t.Fatalf("alice's page shows no region: %q", ad.Region)
	}
	shots.take(alice, "two-users")

	alice.click("#away")
	isAway := func(d demoView) bool { m, ok := d.member("alice"); return ok && m.State == "away" && m.Label == "Away" }
	bd = waitDemo(t, bob, "alice away", isAway)
	waitDemo(t, alice, "alice away in her own page", isAway)
	if !slices.ContainsFunc(bd.Log, func(l demoLog) bool {
		return l.Kind == "state" && l.User == "alice" && strings.Contains(l.Text, "away")
	}) {
		t.Fatalf("bob's activity does not say alice is away: %+v", bd.Log)
	}
	shots.take(bob, "alice-away")
	mark := len(bd.Log)
	amark := len(waitDemo(t, alice, "alice's page", func(demoView) bool { return true }).Log)

	alice.click("#drop")
	ad = waitDemo(t, alice, "alice's page dropping its connection", func(d demoView) bool { return d.Status == "reconnecting" })
	if ad.Note.Kind != "down" || !strings.Contains(ad.Note.Text, "The others have heard nothing") {
		t.Fatalf("alice's page during the drop: note %+v", ad.Note)
	}
	shots.take(alice, "dropping")
	ad = waitDemo(t, alice, "alice's page open again, still away", func(d demoView) bool { return d.Status == "open" && d.Note.Kind == "back" && isAway(d) })
	var statuses []string
	for _, l := range ad.Log[amark:] {
		if l.Kind == "status" {
			statuses = append(statuses, l.Text)
		}
	}
	if i := slices.Index(statuses, "this tab: reconnecting"); i < 0 || !slices.Contains(statuses[i:], "this tab: open") || slices.Contains(statuses, "this tab: closed") {
		t.Fatalf("alice's statuses over the drop: %q, want reconnecting then open and never closed", statuses)
	}
	if ad.SessionTitle != sid {
		t.Fatalf("alice's session changed over the drop: %q, then %q", sid, ad.SessionTitle)
	}
	if !strings.Contains(ad.Note.Text, "nobody else in the room was told") {
		t.Fatalf("alice's page after the drop: note %+v", ad.Note)
	}
	shots.take(alice, "back")
	// The drop came back inside the grace: bob heard nothing of it, up to
	// the leave of a marker released after the drop.
	passMarker(t, n.addr, room, "zz-marker")
	bd = waitDemo(t, bob, "the marker's leave", func(d demoView) bool { return d.sawLeave(mark, "zz-marker") })
	if heard := bd.about(mark, "alice"); len(heard) != 0 || !isAway(bd) {
		t.Fatalf("bob's page after alice's drop: heard %+v, view %+v", heard, bd.Members)
	}
	if m, _ := bd.member("alice"); !slices.Equal(m.sessionIDs(), []string{strings.TrimPrefix(sid, "session ")}) {
		t.Fatalf("bob lists alice's sessions %v, want her one session %s", m.sessionIDs(), sid)
	}
	alice.noConsoleErrors()

	// Closing alice's tab: one leave on bob's page, when the grace has passed.
	mark = len(bd.Log)
	closedAt := time.Now()
	alice.close()
	bd = waitDemo(t, bob, "alice's leave", func(d demoView) bool { _, listed := d.member("alice"); return !listed })
	passMarker(t, n.addr, room, "zz-marker2")
	bd = waitDemo(t, bob, "the second marker's leave", func(d demoView) bool { return d.sawLeave(mark, "zz-marker2") })
	heard := bd.about(mark, "alice")
	if len(heard) != 1 || heard[0].Kind != "leave" || heard[0].Text != "left" {
		t.Fatalf("bob's page after alice closed her tab: %+v, want one leave", heard)
	}
	if after := time.UnixMilli(heard[0].At).Sub(closedAt); after < grace-50*time.Millisecond {
		t.Fatalf("alice's leave came %v after she closed her tab, before the grace (%v)", after, grace)
	}
	shots.take(bob, "alice-left")
	bob.noConsoleErrors()

	// A phone's width: one column, nothing wider than the screen.
	phone := b.open("phone", base+"&user=carol", true)
	phone.viewport(390, 844)
	waitDemo(t, phone, "carol and bob listed", func(d demoView) bool { return slices.Equal(d.users(), []string{"bob", "carol"}) })
	var fit struct{ Scroll, Inner int }
	phone.eval(`({scroll: document.documentElement.scrollWidth, inner: window.innerWidth})`, &fit)
	if fit.Inner != 390 || fit.Scroll > fit.Inner {
		t.Fatalf("at a phone's width the page is %d px wide in a %d px window", fit.Scroll, fit.Inner)
	}
	shots.take(phone, "phone")
	phone.noConsoleErrors()
}

// checkDemoMembers checks how page d shows user, whose own page is own:
// an avatar, the user's state, each session id short, whole on hover.
func checkDemoMembers(t *testing.T, d demoView, user string, own demoView) {
	t.Helper()
	m, ok := d.member(user)
	if !ok {
		t.Fatalf("%s not listed: %+v", user, d.Members)
	}
	if m.Avatar == "" || m.State != "here" || m.Label != "Here" || len(m.Sessions) != 1 {
		t.Fatalf("%s shown as %+v", user, m)
	}
	s := m.Sessions[0]
	if "session "+s.ID != own.SessionTitle || len(s.Text) > 6 || !strings.HasPrefix(s.ID, s.Text) || !strings.Contains(s.Title, s.ID) {
		t.Fatalf("%s's session shown as %+v; the own page says %q", user, s, own.SessionTitle)
	}
}

// demoSecs is how the page writes a duration.
func demoSecs(d time.Duration) string {
	ms := d.Milliseconds()
	if ms >= 10000 {
		return fmt.Sprintf("%d s", (ms+500)/1000)
	}
	return strings.TrimSuffix(fmt.Sprintf("%.1f", float64(ms)/1000), ".0") + " s"
}

// demoView is what the demo page shows, read from its DOM.
type demoView struct {
	Me           string       `json:"me"`
	Status       string       `json:"status"`
	SessionTitle string       `json:"sessionTitle"` // "session <id>"
	Grace        string       `json:"grace"`
	Region       string       `json:"region"`
	Members      []demoMember `json:"members"`
	Note         struct {
		Kind string `json:"kind"`
		Text string `json:"text"`
	} `json:"note"`
	Log []demoLog `json:"log"` // oldest first
}

type demoMember struct {
	User     string `json:"user"`
	State    string `json:"state"`
	Label    string `json:"label"`
	Avatar   string `json:"avatar"`
	Sessions []struct {
		ID     string `json:"id"`
		Text   string `json:"text"`
		Title  string `json:"title"`
		Status string `json:"status"`
	} `json:"sessions"`
}

type demoLog struct {
	Kind string `json:"kind"`
	User string `json:"user"`
	Text string `json:"text"`
	At   int64  `json:"at"` // Date.now() in the page
}

func (d demoView) users() []string {
	var out []string
	for _, m := range d.Members {
		out = append(out, m.User)
	}
	return out
}

func (d demoView) member(user string) (demoMember, bool) {
	for _, m := range d.Members {
		if m.User == user {
			return m, true
		}
	}
	return demoMember{}, false
}

func (m demoMember) sessionIDs() []string {
	var out []string
	for _, s := range m.Sessions {
		out = append(out, s.ID)
	}
	return out
}

// about returns the activity since from about user.
func (d demoView) about(from int, user string) []demoLog {
	var out []demoLog
	for _, l := range d.Log[min(from, len(d.Log)):] {
		if l.User == user {
			out = append(out, l)
		}
	}
	return out
}

func (d demoView) sawLeave(from int, user string) bool {
	return slices.ContainsFunc(d.about(from, user), func(l demoLog) bool { return l.Kind == "leave" })
}

const demoDOM = `(() => {
  const $ = id => document.getElementById(id);
  if (!$("members")) return null;
  const note = $("note");
  return {
    me: $("user").value,
    status: $("status").dataset.status,
    sessionTitle: $("session").title,
    grace: $("c-grace").textContent,
    region: $("c-region").textContent,
    members: [...document.querySelectorAll("#members > li")].map(li => ({
      user: li.dataset.user,
      state: li.dataset.state,
      label: li.querySelector(".state").textContent,
      avatar: li.querySelector(".avatar").textContent,
      sessions: [...li.querySelectorAll("[data-session]")].map(s => ({id: s.dataset.session, text: s.textContent, title: s.title, status: s.dataset.status})),
    })),
    note: note.hidden ? {kind: "", text: ""} : {kind: note.dataset.kind, text: note.textContent},
    log: [...document.querySelectorAll("#log > li")].map(li => ({
      kind: li.dataset.kind, user: li.dataset.user || "", at: Number(li.dataset.at),
      text: li.querySelector("span").textContent.slice(li.dataset.user ? li.dataset.user.length + 1 : 0),
    })).reverse(),
  };
})()`

func waitDemo(t *testing.T, tb *tab, what string, cond func(demoView) bool) demoView {
	t.Helper()
	last, err := pollPage(tb, demoDOM, 30*time.Second, cond)
	if err != nil {
		t.Fatalf("%s: waiting for %s: %v; last %+v", tb.name, what, err, last)
	}
	return last
}

// pollPage evaluates expr in tb until cond holds of its value or within
// has passed, and returns the last value read and, on a timeout, the
// reason: the page's last error, or that the last value read (which its
// callers show) did not do.
func pollPage[V any](tb *tab, expr string, within time.Duration, cond func(V) bool) (V, error) {
	var last V
	err := testkit.Poll(within, 50*time.Millisecond, func() error {
		var v V
		if err := tb.tryEval(expr, &v); err != nil {
			return fmt.Errorf("the page: %w", err)
		}
		last = v
		if !cond(v) {
			return errors.New("the page does not show it")
		}
		return nil
	})
	return last, err
}

// viewport sets the tab's window size, as a phone's.
func (tb *tab) viewport(w, h int64) {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, 10*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(w, h)); err != nil {
		tb.t.Fatalf("%s: viewport: %v", tb.name, err)
	}
}

// demoShots saves screenshots of a test's steps under
// $PRESENCE_SCREENSHOTS/<name>/, numbered in order; without the
// variable it saves nothing.
type demoShots struct {
	t   *testing.T
	dir string
	n   int
}

func newDemoShots(t *testing.T, name string) *demoShots {
	s := &demoShots{t: t}
	if root := os.Getenv("PRESENCE_SCREENSHOTS"); root != "" {
		s.dir = filepath.Join(root, name)
		if err := os.MkdirAll(s.dir, 0o750); err != nil { //nolint:gosec // the test's own output directory, named in its own environment
			t.Fatal(err)
		}
	}
	return s
}

func (s *demoShots) take(tb *tab, step string) {
	s.t.Helper()
	if s.dir == "" {
		return
	}
	s.n++
	ctx, cancel := context.WithTimeout(tb.ctx, 10*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // 100: PNG
	if err != nil {
		s.t.Fatalf("%s: screenshot: %v", tb.name, err)
	}
	path := filepath.Join(s.dir, fmt.Sprintf("%02d-%s-%s.png", s.n, tb.name, step))
	if err := os.WriteFile(path, png, 0o600); err != nil {
		s.t.Fatal(err)
	}
	s.t.Logf("screenshot %s", path)
}

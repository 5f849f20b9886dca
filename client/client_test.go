package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
)

// drop cuts c's link without a close frame, as a network failure does.
func drop(c *Client) *conn {
	c.mu.Lock()
	cn := c.cur
	c.mu.Unlock()
	if cn != nil {
		_ = cn.ws.NetConn().Close()
	}
	return cn
}

func member(ms []Member, user string) (Member, bool) {
	i := slices.IndexFunc(ms, func(m Member) bool { return m.User == user })
	if i < 0 {
		return Member{}, false
	}
	return ms[i], true
}

func stateOf(ms []Member, user, session string) (string, bool) {
	m, ok := member(ms, user)
	if !ok {
		return "", false
	}
	for _, s := range m.Sessions {
		if s.ID == session {
			return string(s.State), true
		}
	}
	return "", false
}

// stateIs is a poll's condition: who's view ms has user's session in
// state want; the reason shows the view.
func stateIs(who string, ms []Member, user, session, want string) error {
	if s, _ := stateOf(ms, user, session); s != want {
		return fmt.Errorf("%s sees %s's %s in state %q, want %q (view %s)", who, user, session, s, want, render(ms))
	}
	return nil
}

// listed is a poll's condition: who's view ms lists user, or (want
// false) does not.
func listed(who string, ms []Member, user string, want bool) error {
	if _, ok := member(ms, user); ok != want {
		return fmt.Errorf("%s lists %s: %v, want %v (view %s)", who, user, ok, want, render(ms))
	}
	return nil
}

func TestJoinStateAndLeaveAreSeenByAnother(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	var seen changes
	obs, err := e.dial("obs", "o", nil).Join(ctx, "room", JoinOptions{Sessions: true, OnChange: seen.add})
	if err != nil {
		t.Fatal(err)
	}
	amy := e.dial("amy", "tab", nil)
	ra, err := amy.Join(ctx, "room", JoinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := member(ra.Members(), "obs"); !ok {
		t.Fatalf("amy's first view %v lacks obs", ra.Members())
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if _, ok := stateOf(obs.Members(), "amy", "tab"); !ok {
			return fmt.Errorf("obs does not see amy's tab (view %s)", render(obs.Members()))
		}
		return nil
	})
	if err := ra.SetState(ctx, map[string]string{"status": "away"}); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		return stateIs("obs", obs.Members(), "amy", "tab", `{"status":"away"}`)
	})
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		return stateIs("amy", ra.Members(), "amy", "tab", `{"status":"away"}`)
	})
	if err := ra.Leave(ctx); err != nil || ra.Err() == nil || len(ra.Members()) != 0 {
		t.Fatalf("leave: %v, room err %v, view %v", err, ra.Err(), ra.Members())
	}
	testkit.CheckFor(t, testTiming.OfflineGrace+10*time.Second, 10*time.Millisecond, func() error { return listed("obs", obs.Members(), "amy", false) })
	evs := seen.events()
	if last := evs[len(evs)-1]; last.User != "amy" || last.Kind != presence.Offline || last.Reason != presence.Left {
		t.Fatalf("obs's last event %v, want amy's offline (left)", last)
	}
	if err := ra.SetState(ctx, nil); err == nil {
		t.Fatal("SetState on a room left succeeded")
	}
}

func TestBadTokensAreRefusedAtDial(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	forged := func(context.Context) (string, error) {
		good, err := tokens("mallory", false, time.Hour)(ctx)
		return good[:len(good)-4] + "AAAA", err // the signature no longer matches
	}
	var he *HandshakeError
	if _, err := Dial(ctx, Config{URL: e.srv.URL, Token: forged}); !errors.As(err, &he) || he.Status != 401 || he.Message == "" {
		t.Fatalf("forged token: %v, want a 401 that says why", err)
	}
	if _, err := Dial(ctx, Config{URL: e.srv.URL}); !errors.As(err, &he) || he.Status != 401 {
		t.Fatalf("no token: %v, want a 401", err)
	}
	boom := errors.New("the token endpoint is down")
	var te *TokenError
	_, err := Dial(ctx, Config{URL: e.srv.URL, Token: func(context.Context) (string, error) { return "", boom }})
	if !errors.As(err, &te) || !errors.Is(err, boom) {
		t.Fatalf("failing token source: %v, want a TokenError wrapping its error", err)
	}
	for _, cfg := range []Config{{URL: "ftp://x"}, {URL: e.srv.URL, Session: "a b"}} {
		if _, err := Dial(ctx, cfg); err == nil {
			t.Fatalf("Dial(%+v) succeeded", cfg)
		}
	}
}

// A dropped link inside the grace: the client reconnects with its session
// id, rejoins and sends its state again, and nobody hears anything.
func TestReconnectKeepsTheSession(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	var seen changes
	obs, err := e.dial("obs", "o", nil).Join(ctx, "room", JoinOptions{Sessions: true, OnChange: seen.add})
	if err != nil {
		t.Fatal(err)
	}
	var x errs
	amy := e.dial("amy", "tab", &x)
	ra, err := amy.Join(ctx, "room", JoinOptions{Sessions: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := ra.SetState(ctx, "here"); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return stateIs("obs", obs.Members(), "amy", "tab", `"here"`) })
	before := len(seen.events())
	old := drop(amy)
	dropped := time.Now()
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		amy.mu.Lock()
		defer amy.mu.Unlock()
		switch {
		case amy.cur == nil:
			return errors.New("amy is not connected again")
		case amy.cur == old:
			return errors.New("amy is still on the dropped connection")
		case !ra.synced:
			return errors.New("amy reconnected, her room is not rejoined yet")
		}
		return nil
	})
	if amy.Session() != "tab" || amy.Hello().Session != "tab" {
		t.Fatalf("session %q, hello's %q, want tab", amy.Session(), amy.Hello().Session)
	}
	if s, _ := stateOf(ra.Members(), "amy", "tab"); s != `"here"` {
		t.Fatalf("amy's view after the rejoin: %v", ra.Members())
	}
	// The grace of the drop passes (and 3s more: the wait is the test, an
	// offline would be due by then); a marker's online then flushes obs's
	// stream, and nothing about amy came before it.
	time.Sleep(time.Until(dropped.Add(testTiming.OfflineGrace + 3*time.Second)))
	if _, err := e.dial("zed", "z", nil).Join(ctx, "room", JoinOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return listed("obs", obs.Members(), "zed", true) })
	for _, ev := range seen.events()[before:] {
		if ev.User == "amy" {
			t.Fatalf("obs heard %v about amy after the drop", ev)
		}
	}
	if ts := e.rec.Of(presence.Offline, "room", "amy"); len(ts) != 0 {
		t.Fatalf("amy's offline was announced: %v", ts)
	}
	if _, ds := x.all(); len(ds) != 1 || closeErrorOf(ds[0]) != nil {
		t.Fatalf("OnDisconnect got %v, want one dropped link (no close frame)", ds)
	}
}

// tab is one client of a churn, and its room while joined.
type tab struct {
	c *Client
	r *Room
}

// churn runs 60 random steps: joins at either detail, states, dropped
// links (the client reconnects on its own) and leaves.
func churn(ctx context.Context, t *testing.T, tabs []*tab, rng *rand.Rand) {
	states := []any{nil, "away", map[string]bool{"typing": true}}
	var err error
	for range 60 {
		tb := tabs[rng.IntN(len(tabs))]
		switch op := rng.IntN(10); {
		case tb.r == nil:
			if tb.r, err = tb.c.Join(ctx, "churn", JoinOptions{Sessions: rng.IntN(2) == 0}); err != nil {
				t.Fatal(err)
			}
		case op < 5:
			if err := tb.r.SetState(ctx, states[rng.IntN(len(states))]); err != nil && !errors.Is(err, ErrDisconnected) {
				t.Fatal(err)
			}
		case op < 7:
			drop(tb.c)
		case op < 8:
			if err := tb.r.Leave(ctx); err != nil {
				t.Fatal(err)
			}
			tb.r = nil
		}
	}
}

// After random churn by several clients, each one's folded view equals a
// fresh snapshot of the room, and the count view its total.
func TestViewsEqualTheSnapshotAfterChurn(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	sess, err := e.dial("obs1", "o", nil).Join(ctx, "churn", JoinOptions{Sessions: true})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := e.dial("obs2", "o", nil).Join(ctx, "churn", JoinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	count, err := e.dial("obs3", "o", nil).Join(ctx, "churn", JoinOptions{Count: true, Observe: true})
	if err != nil {
		t.Fatal(err)
	}
	tabs := make([]*tab, 6)
	for i := range tabs {
		tabs[i] = &tab{c: e.dial(fmt.Sprintf("u%d", i/2), fmt.Sprintf("t%d", i%2), nil)}
	}
	churn(ctx, t, tabs, rand.New(rand.NewPCG(7, 24)))
	views := []*Room{sess, plain}
	for _, tb := range tabs {
		if tb.r != nil {
			views = append(views, tb.r)
		}
	}
	testkit.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		snap, err := e.store.Snapshot(context.Background(), "churn", 0, 1000)
		if err != nil {
			return fmt.Errorf("snapshot: %w", err)
		}
		for _, r := range views {
			if got, want := render(r.Members()), project(snap, r.opts.Sessions); got != want {
				return fmt.Errorf("a view %s, the snapshot %s", got, want)
			}
		}
		return testkit.Want("the count view's count (the snapshot's total)", count.Count(), snap.Total)
	})
}

// The count view follows the room unlisted; a watch list sees its users
// only.
func TestCountAndWatchViews(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	obs := e.dial("obs", "o", nil)
	cnt, err := obs.Join(ctx, "lobby", JoinOptions{Count: true, Observe: true})
	if err != nil {
		t.Fatal(err)
	}
	var seen changes
	w, err := obs.Watch(ctx, "lobby", []string{"amy", "amy", "cat"}, seen.add)
	if err != nil || !slices.Equal(w.Users(), []string{"amy", "cat"}) {
		t.Fatalf("watch: %v, users %v", err, w.Users())
	}
	// A room is joined once and watched once; a bad id is the node's
	// invalid_room, refused before anything is sent.
	if _, err := obs.Join(ctx, "lobby", JoinOptions{}); err == nil {
		t.Fatal("a second join of lobby succeeded")
	}
	if _, err := obs.Watch(ctx, "lobby", []string{"bob"}, nil); err == nil {
		t.Fatal("a second watch of lobby succeeded")
	}
	var bad *protocol.Error
	if _, err := obs.Watch(ctx, "no room", []string{"bob"}, nil); !errors.As(err, &bad) || bad.Code != protocol.CodeInvalidRoom {
		t.Fatalf("watch of an invalid room: %v, want invalid_room", err)
	}
	ra, err := e.dial("amy", "a", nil).Join(ctx, "lobby", JoinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rb, err := e.dial("bob", "b", nil).Join(ctx, "lobby", JoinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return testkit.Want("count", cnt.Count(), 2) })
	if _, listed := member(rb.Members(), "obs"); listed {
		t.Fatal("the observer is listed")
	}
	if err := rb.SetState(ctx, "bob's"); err != nil {
		t.Fatal(err)
	}
	if err := ra.SetState(ctx, "amy's"); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error { return stateIs("the watch", w.Members(), "amy", "a", `"amy's"`) })
	for _, ev := range seen.events() {
		if ev.User != "amy" {
			t.Fatalf("the watch of amy and cat got %v", ev)
		}
	}
	if ms := w.Members(); len(ms) != 1 {
		t.Fatalf("watch view %v, want amy only", ms)
	}
	if err := w.Update(ctx, []string{"bob"}); err != nil {
		t.Fatal(err)
	}
	if s, _ := stateOf(w.Members(), "bob", "b"); s != `"bob's"` || len(w.Members()) != 1 {
		t.Fatalf("watch view after the update: %v", w.Members())
	}
	var pe *protocol.Error
	if err := cnt.SetState(ctx, "x"); !errors.As(err, &pe) || pe.Code != protocol.CodeNotJoined {
		t.Fatalf("state in an observed room: %v, want not_joined", err)
	}
	if err := w.Close(ctx); err != nil || len(w.Members()) != 0 {
		t.Fatalf("close: %v, view %v", err, w.Members())
	}
}

// A token that expires closes the connection with 4002: the client is
// told, connects again with a fresh token, and is back in its room.
func TestTokenExpiryIsSurfacedAndReconnected(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	var x errs
	c, err := Dial(ctx, Config{URL: e.srv.URL, Token: tokens("amy", false, 2*time.Second), Session: "tab", OnDisconnect: x.onDisconnect, OnError: x.onError})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	r, err := c.Join(ctx, "room", JoinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	first := c.Hello().TokenExpires
	testkit.CheckFor(t, 15*time.Second, 10*time.Millisecond, func() error {
		_, ds := x.all()
		h := c.Hello()
		switch {
		case len(ds) == 0:
			return errors.New("no disconnect reported yet")
		case first == nil || h.TokenExpires == nil:
			return fmt.Errorf("a hello without token_expires (first %v, now %v)", first, h.TokenExpires)
		case !h.TokenExpires.After(*first):
			return fmt.Errorf("disconnected (%v), not yet reconnected with a new token", ds[0])
		}
		return nil
	})
	_, ds := x.all()
	var ce *CloseError
	if !errors.As(ds[0], &ce) || ce.Code != protocol.CloseTokenExpired {
		t.Fatalf("OnDisconnect got %v, want close 4002", ds[0])
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if err := r.Err(); err != nil {
			return fmt.Errorf("the room: %w", err)
		}
		return listed("amy", r.Members(), "amy", true)
	})
}

// A draining node closes with 1012, and refuses the reconnect with 503:
// both reach the client, which keeps trying until Close.
func TestDrainIsSurfaced(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	var x errs
	c := e.dial("amy", "tab", &x)
	if _, err := c.Join(ctx, "room", JoinOptions{}); err != nil {
		t.Fatal(err)
	}
	go func() { _ = e.node.Drain(ctx) }()
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		es, ds := x.all()
		var ce *CloseError
		var he *HandshakeError
		if len(ds) != 1 || !errors.As(ds[0], &ce) || ce.Code != protocol.CloseRestart {
			return fmt.Errorf("disconnects %v, want one close 1012", ds)
		}
		if len(es) == 0 || !errors.As(es[0], &he) || he.Status != 503 {
			return fmt.Errorf("errors %v, want a 503 refusal first", es)
		}
		return nil
	})
	if err := c.Close(); err != nil || !errors.Is(c.Err(), ErrClosed) {
		t.Fatalf("close: %v, Err %v", err, c.Err())
	}
	if _, err := c.Join(ctx, "other", JoinOptions{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("join after close: %v", err)
	}
}

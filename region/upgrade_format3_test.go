//go:build presenceformat3

package region

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
)

// The test format 3 in a live region of format 2 (run with -tags
// presenceformat3; make test-format3): a store of the next release reads
// format 2 and writes it while the region is in it; the switch waits for
// every holder of the old format; after it the store writes format 3
// within a heartbeat, its heartbeat moves each state it refreshes, and
// every reader returns the same states, read from either format.
func TestFormat3RollsIntoARegionOfFormat2(t *testing.T) {
	ctx := context.Background()
	rdb, _ := testredis.Client(t)
	if err := rdb.Set(ctx, "presence:schema", "2", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s := newStore(t, rdb, &collector{})
	if err := s.Preload(ctx); err != nil {
		t.Fatalf("a region of format 2: %v", err)
	}
	a, b := ref("r", "u", "a"), ref("r", "v", "b")
	touch(t, s, a, b)
	setState(t, s, a, `{"tab":1}`)
	// A state as a store of format 2 wrote it.
	if err := rdb.HSet(ctx, "presence:{r}:st", "v:b", `{"tab":2}`).Err(); err != nil {
		t.Fatal(err)
	}
	if v := rdb.HGet(ctx, "presence:{r}:st", "u:a").Val(); v != `{"tab":1}` {
		t.Fatalf("state written in a region of format 2 as %q, want the JSON as format 2 has it", v)
	}
	want := map[string]string{"u/a": `{"tab":1}`, "v/b": `{"tab":2}`}
	checkStates(t, s, want)

	switchPastAnOldHolder(t, s)
	// Within a heartbeat the heartbeat moves every state it refreshes.
	testkit.CheckFor(t, 10*testTiming.Heartbeat, 10*time.Millisecond, func() error {
		if _, err := s.Refresh(ctx, []presence.SessionRef{a, b}); err != nil {
			t.Fatal(err)
		}
		vs := rdb.HGetAll(ctx, "presence:{r}:st").Val()
		if vs["u:a"] != `~{"tab":1}` || vs["v:b"] != `~{"tab":2}` {
			return fmt.Errorf("states %v, want both in format 3", vs)
		}
		return nil
	})
	checkStates(t, s, want)
	// The same state again is no change; a new one is written in format 3.
	if ok, err := s.SetState(ctx, a, []byte(`{"tab":1}`)); err != nil || !ok {
		t.Fatalf("set state: %v %v", ok, err)
	}
	setState(t, s, b, `{"tab":3}`)
	if v := rdb.HGet(ctx, "presence:{r}:st", "v:b").Val(); v != `~{"tab":3}` {
		t.Fatalf("a state written after the switch: %q", v)
	}
	want["v/b"] = `{"tab":3}`
	checkStates(t, s, want)
	// A region in a format newer than 3 is still refused.
	if err := rdb.Set(ctx, "presence:schema", "4", 0).Err(); err != nil {
		t.Fatal(err)
	}
	var se *SchemaError
	if err := newStore(t, rdb, &collector{}).Preload(ctx); !errors.As(err, &se) || se.Found != "4" {
		t.Fatalf("a region of format 4: %v, want a SchemaError", err)
	}
}

// switchPastAnOldHolder checks that a holder of format 2 whose lease runs
// keeps the region in format 2, and switches it once that lease ended.
func switchPastAnOldHolder(t *testing.T, s *Store) {
	t.Helper()
	ctx := context.Background()
	rdb := s.rdb
	// A holder of format 2 whose lease runs keeps the region in format 2.
	setRegistry(t, rdb, "\xf0", "old", time.Now().Add(time.Minute).UnixMilli(), time.Now().Add(2*time.Minute).UnixMilli())
	var ue *UpgradeBlockedError
	if _, err := s.FinishUpgrade(ctx); !errors.As(err, &ue) || len(ue.Blocking) != 1 || ue.Blocking[0].Name != "x" || ue.Switched {
		t.Fatalf("finish with a holder of format 2: %v, want it refused naming x", err)
	}
	if v := rdb.Get(ctx, "presence:schema").Val(); v != "2" {
		t.Fatalf("marker %q after a refused switch", v)
	}
	// Its lease ended: the switch goes through.
	setRegistry(t, rdb, "\xf0", "old", time.Now().Add(-time.Second).UnixMilli(), time.Now().Add(time.Minute).UnixMilli())
	st, err := s.FinishUpgrade(ctx)
	if err != nil || st.Region != 3 {
		t.Fatalf("finish: %+v, %v", st, err)
	}
	if v := rdb.Get(ctx, "presence:schema").Val(); v != "3" {
		t.Fatalf("marker %q after the switch, want 3", v)
	}
}

func setState(tb testing.TB, s *Store, r presence.SessionRef, state string) {
	tb.Helper()
	if ok, err := s.SetState(context.Background(), r, json.RawMessage(state)); err != nil || !ok {
		tb.Fatalf("set state of %v: %v %v", r, ok, err)
	}
}

// checkStates reads the states of room r through every reader: the
// snapshot, one user's sessions, the rosters and the members the change
// log names.
func checkStates(tb testing.TB, s *Store, want map[string]string) {
	tb.Helper()
	ctx := context.Background()
	snap, err := s.Snapshot(ctx, "r", 0, 100)
	if err != nil {
		tb.Fatal(err)
	}
	compareStates(tb, "snapshot", snap.Members, want)
	ros, err := s.Rosters(ctx, []string{"r"})
	if err != nil || len(ros) != 1 {
		tb.Fatalf("rosters: %v", err)
	}
	compareStates(tb, "roster", ros[0].Members, want)
	us, err := s.Users(ctx, "r", []string{"u", "v"})
	if err != nil {
		tb.Fatal(err)
	}
	compareStates(tb, "users", us.Members, want)
	for key, w := range want {
		user, sess, _ := strings.Cut(key, "/")
		m, ok, err := s.Sessions(ctx, "r", user)
		if err != nil || !ok || len(m.Sessions) != 1 || m.Sessions[0].ID != sess || string(m.Sessions[0].State) != w {
			tb.Fatalf("sessions of %s: %+v %v %v, want %s", user, m, ok, err, w)
		}
	}
}

func compareStates(tb testing.TB, what string, ms []presence.Member, want map[string]string) {
	tb.Helper()
	got := map[string]string{}
	for _, m := range ms {
		for _, ss := range m.Sessions {
			got[m.User+"/"+ss.ID] = string(ss.State)
		}
	}
	if len(got) != len(want) {
		tb.Fatalf("%s: %v, want %v", what, got, want)
	}
	for k, v := range want {
		if got[k] != v {
			tb.Fatalf("%s: %v, want %v", what, got, want)
		}
	}
}

// After the switch the registry refuses a lease to a holder of format 2,
// and refreshes move states only for a span after their store began
// writing format 3: past it a refresh reads no state (the heartbeat's
// path), while a claim still moves the state of the session it takes.
func TestAfterTheSwitchOldHoldersGetNoLeaseAndRefreshesStopMoving(t *testing.T) {
	ctx := context.Background()
	rdb, _ := testredis.Client(t)
	if err := rdb.Set(ctx, "presence:schema", "2", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s := newStore(t, rdb, &collector{})
	if err := s.Preload(ctx); err != nil {
		t.Fatal(err)
	}
	a := ref("r", "u", "a")
	touch(t, s, a)
	if _, err := s.FinishUpgrade(ctx); err != nil {
		t.Fatal(err)
	}
	_, err := scriptHold.Run(ctx, rdb, []string{"presence:holders"}, "oldnonce", "", 60000, 60000, "old", codeBytes, 2).Slice()
	if err == nil || !strings.Contains(err.Error(), "PRESENCE_FORMAT 3") {
		t.Fatalf("a lease for a holder of format 2 after the switch: %v, want PRESENCE_FORMAT 3", err)
	}
	// This store reads the marker again (its poll is due), writes format 3
	// and moves what it refreshes.
	s.holdMu.Lock()
	s.formatNext = time.Time{}
	s.holdMu.Unlock()
	if err := rdb.HSet(ctx, "presence:{r}:st", "u:a", `{"tab":1}`).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Refresh(ctx, []presence.SessionRef{a}); err != nil {
		t.Fatal(err)
	}
	if v := rdb.HGet(ctx, "presence:{r}:st", "u:a").Val(); v != `~{"tab":1}` {
		t.Fatalf("a refresh inside the span left %q", v)
	}
	// Past the span a refresh leaves a state as it is; a claim moves it.
	s.moveUntil.Store(time.Now().Add(-time.Millisecond).UnixNano())
	if err := rdb.HSet(ctx, "presence:{r}:st", "u:a", `{"tab":2}`).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Refresh(ctx, []presence.SessionRef{a}); err != nil {
		t.Fatal(err)
	}
	if v := rdb.HGet(ctx, "presence:{r}:st", "u:a").Val(); v != `{"tab":2}` {
		t.Fatalf("a refresh past the span rewrote the state: %q", v)
	}
	touch(t, s, a)
	if v := rdb.HGet(ctx, "presence:{r}:st", "u:a").Val(); v != `~{"tab":2}` {
		t.Fatalf("a claim past the span left %q, want it moved", v)
	}
}

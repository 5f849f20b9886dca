package bigroom

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/presence"
)

// The events frame of docs/PROTOCOL.md "Node to client".
const protocolEvents = `{"type":"events","room":"lobby","region":"eu","epoch":1764444000000,
 "events":[[18,"online","joined","u_4242","tab-3f9a",1],
           [19,"update","state","u_4242","tab-3f9a",1,{"status":"away"}],
           [20,"offline","left","u_9001","",0]]}`

func TestParseEventsProtocolExample(t *testing.T) {
	f, es, err := parseEvents([]byte(protocolEvents))
	if err != nil {
		t.Fatal(err)
	}
	if f.Room != "lobby" || f.Region != "eu" || f.Epoch != 1764444000000 || len(es) != 3 {
		t.Fatalf("frame %+v, %d entries", f, len(es))
	}
	want := []entry{
		{Seq: 18, Kind: presence.Online, Reason: "joined", User: "u_4242", Session: "tab-3f9a", Sessions: 1},
		{Seq: 19, Kind: presence.Update, Reason: "state", User: "u_4242", Session: "tab-3f9a", Sessions: 1, State: json.RawMessage(`{"status":"away"}`)},
		{Seq: 20, Kind: presence.Offline, Reason: "left", User: "u_9001", Session: "", Sessions: 0},
	}
	for i := range want {
		g, w := es[i], want[i]
		if g.Seq != w.Seq || g.Kind != w.Kind || g.Reason != w.Reason || g.User != w.User || g.Session != w.Session || g.Sessions != w.Sessions || string(g.State) != string(w.State) {
			t.Errorf("entry %d = %+v, want %+v", i, g, w)
		}
	}
	if k := frameKind([]byte(protocolEvents)); k != "events" {
		t.Errorf("frameKind = %q", k)
	}
}

func TestParseEventsRejects(t *testing.T) {
	for name, frame := range map[string]string{
		"out of order": `{"type":"events","epoch":1,"events":[[5,"online","joined","a","s",1],[4,"offline","left","b","",0]]}`,
		"repeated":     `{"type":"events","epoch":1,"events":[[5,"online","joined","a","s",1],[5,"offline","left","a","",0]]}`,
		"short":        `{"type":"events","epoch":1,"events":[[5,"online","joined","a","s"]]}`,
		"long":         `{"type":"events","epoch":1,"events":[[5,"update","state","a","s",1,{},9]]}`,
		"kind":         `{"type":"events","epoch":1,"events":[[5,"away","joined","a","s",1]]}`,
		"seq type":     `{"type":"events","epoch":1,"events":[["5","online","joined","a","s",1]]}`,
		"no user":      `{"type":"events","epoch":1,"events":[[5,"online","joined","","s",1]]}`,
	} {
		if _, _, err := parseEvents([]byte(frame)); err == nil {
			t.Errorf("%s: parsed without an error", name)
		}
	}
}

func TestFrameKind(t *testing.T) {
	for in, want := range map[string]string{
		`{"type":"event","event":{}}`: "event",
		`{"type":"events","room":"r"`: "events",
		`{"type":"snapsh`:             "",
		`{"room":"r","type":"count"}`: "",
		``:                            "",
		`{"type":"count","ref":"j"}`:  "count",
	} {
		if got := frameKind([]byte(in)); got != want {
			t.Errorf("frameKind(%q) = %q, want %q", in, got, want)
		}
	}
}

func snap(seq uint64, total, offset int, users ...string) *presence.Snapshot {
	s := &presence.Snapshot{Region: "eu", Room: "r", Total: total, Offset: offset, RoomSeq: seq, Epoch: 7}
	for _, u := range users {
		s.Members = append(s.Members, presence.Member{User: u, Sessions: []presence.SessionInfo{}})
	}
	return s
}

func ev(seq uint64, kind, reason, user string) entry {
	return entry{Seq: seq, Kind: presence.Kind(kind), Reason: presence.Reason(reason), User: user, Session: "s"}
}

func users(v view) []string {
	var u []string
	for k := range v {
		u = append(u, k)
	}
	slices.Sort(u)
	return u
}

// Events apply the same whether they come one per `event` frame or as
// entries of an `events` frame, across frames.
func TestFoldEventAndEventsAgree(t *testing.T) {
	single, batched := newFolder(), newFolder()
	single.snapshot(snap(17, 2, 0, "u_1", "u_9001"), false)
	batched.snapshot(snap(17, 2, 0, "u_1", "u_9001"), false)
	// seq 18-20 as single events, from their bus encoding.
	for _, e := range []entry{ev(18, "online", "joined", "u_4242"), ev(19, "update", "state", "u_4242"), ev(20, "offline", "left", "u_9001")} {
		tr := presence.Transition{ID: fmt.Sprintf("eu/r/7/%d", e.Seq), Kind: e.Kind, Reason: e.Reason, Region: "eu", Room: "r", User: e.User,
			Session: e.Session, Seq: e.Seq, Epoch: 7, At: time.Unix(1, 0)}
		if e.Kind == presence.Update {
			tr.State = json.RawMessage(`{"status":"away"}`)
		}
		data, err := bus.EncodeEvent(tr)
		if err != nil {
			t.Fatal(err)
		}
		got, err := bus.DecodeEvent(data)
		if err != nil {
			t.Fatal(err)
		}
		single.apply(got.Epoch, entryOf(got))
	}
	// The same as two events frames.
	for _, fr := range []string{
		`{"type":"events","room":"r","region":"eu","epoch":7,"events":[[18,"online","joined","u_4242","s",1]]}`,
		`{"type":"events","room":"r","region":"eu","epoch":7,"events":[[19,"update","state","u_4242","s",1,{"status":"away"}],[20,"offline","left","u_9001","",0]]}`,
	} {
		f, es, err := parseEvents([]byte(fr))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range es {
			batched.apply(f.Epoch, e)
		}
	}
	want := view{"u_1": {}, "u_4242": {"s": `{"status":"away"}`}}
	for name, f := range map[string]*folder{"event": single, "events": batched} {
		if d := diffViews(want, f.v, nil); len(d) > 0 {
			t.Errorf("%s: %v", name, d)
		}
		if f.seq != 20 || f.dups+f.gaps+f.epochErrs != 0 {
			t.Errorf("%s: seq %d dups %d gaps %d epochs %d", name, f.seq, f.dups, f.gaps, f.epochErrs)
		}
	}
}

func TestFoldCountsGapsRepeatsAndEpochs(t *testing.T) {
	f := newFolder()
	f.apply(7, ev(1, "online", "joined", "early")) // before a snapshot: ignored
	f.snapshot(snap(10, 0, 0), false)
	f.apply(7, ev(11, "online", "joined", "a"))
	f.apply(7, ev(11, "online", "joined", "a")) // repeated
	f.apply(7, ev(9, "online", "joined", "z"))  // already in the snapshot
	f.apply(7, ev(15, "online", "joined", "b")) // 12-14 missing
	f.apply(8, ev(16, "online", "joined", "c")) // another epoch without a resync
	if f.dups != 2 || f.gaps != 1 || f.missing != 3 || f.epochErrs != 1 {
		t.Fatalf("dups %d gaps %d missing %d epochs %d", f.dups, f.gaps, f.missing, f.epochErrs)
	}
	if got := users(f.v); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("view %v", got)
	}
	// A resync replaces the view and restarts the numbering.
	s := snap(3, 1, 0, "q")
	s.Epoch = 8
	f.snapshot(s, true)
	f.apply(8, ev(4, "offline", "left", "q"))
	if f.resyncs != 1 || len(f.v) != 0 || f.seq != 4 || f.dups != 2 {
		t.Fatalf("after resync: resyncs %d view %v seq %d dups %d", f.resyncs, f.v, f.seq, f.dups)
	}
}

func TestFoldUpdates(t *testing.T) {
	f := newFolder()
	f.snapshot(snap(1, 1, 0, "a"), false)
	st := func(seq uint64, reason, state string) entry {
		e := ev(seq, "update", reason, "a")
		if state != "" {
			e.State = json.RawMessage(state)
		}
		return e
	}
	f.apply(7, st(2, "state", `{"x":1}`))
	f.apply(7, st(3, "joined", "")) // a second tab: not listed without detail
	if !sameSessions(f.v["a"], map[string]string{"s": `{"x":1}`}) {
		t.Fatalf("after state: %v", f.v["a"])
	}
	f.apply(7, st(4, "state", "")) // cleared
	if len(f.v["a"]) != 0 {
		t.Fatalf("after clear: %v", f.v["a"])
	}
	f.apply(7, st(5, "state", `"busy"`))
	f.apply(7, st(6, "left", "")) // the session's grace ended
	if _, ok := f.v["a"]; !ok || len(f.v["a"]) != 0 {
		t.Fatalf("after update/left: %v", f.v)
	}
}

// Paging per PROTOCOL.md "Large rooms": pages from one before the end of
// the last, an event newer than the page wins, and a page that starts
// after the last user known is asked again from earlier.
func TestFoldPaging(t *testing.T) {
	page := func(seq uint64, total, offset int, from, n int) *presence.Snapshot {
		var us []string
		for i := from; i < from+n; i++ {
			us = append(us, fmt.Sprintf("u%05d", i))
		}
		return snap(seq, total, offset, us...)
	}
	f := newFolder()
	if !f.snapshot(page(100, 2500, 0, 0, 1000), false) {
		t.Fatal("a truncated snapshot must ask for pages")
	}
	if f.nextOff != 999 {
		t.Fatalf("first page at %d, want 999", f.nextOff)
	}
	// Meanwhile: u01500 left (seq 101), u01600 changed state (102).
	f.apply(7, ev(101, "offline", "left", "u01500"))
	upd := ev(102, "update", "state", "u01600")
	upd.State = json.RawMessage(`1`)
	f.apply(7, upd)
	// The page, read at seq 100 (before both), still lists u01500 and
	// u01600 without a state: the events are newer and win.
	if !f.page(f.gen, page(100, 2500, 999, 999, 1000)) {
		t.Fatal("more pages expected")
	}
	if _, ok := f.v["u01500"]; ok {
		t.Error("u01500 came back from a page older than its offline")
	}
	if !sameSessions(f.v["u01600"], map[string]string{"s": "1"}) {
		t.Errorf("u01600 lost its newer state: %v", f.v["u01600"])
	}
	if f.nextOff != 1998 {
		t.Fatalf("next page at %d, want 1998", f.nextOff)
	}
	// Two users before the offset left: the page starts two users late,
	// after the last user known (u01998): asked again from earlier.
	if !f.page(f.gen, page(103, 2498, 1998, 2000, 498)) || f.pageSlips != 1 || f.nextOff >= 1998 {
		t.Fatalf("slip: more, slips %d, next %d", f.pageSlips, f.nextOff)
	}
	if _, ok := f.v["u02000"]; ok {
		t.Error("a slipped page was applied")
	}
	// From earlier, the page overlaps: taken, and it is the last.
	if f.page(f.gen, page(103, 2498, f.nextOff, 1990, 510)) {
		t.Fatal("no more pages expected")
	}
	if len(f.v) != 2499 { // 2500 users, u01500 gone
		t.Fatalf("view of %d users, want 2499", len(f.v))
	}
	// A page of an earlier generation (before a resync) is dropped.
	gen := f.gen
	f.snapshot(page(200, 2, 0, 0, 2), true)
	if f.page(gen, page(100, 2500, 999, 3000, 10)) || len(f.v) != 2 {
		t.Fatalf("an old generation's page changed the view: %d users", len(f.v))
	}
}

// A watch list's folder sees only its users' events, without seq gaps
// (other users' events take the seqs between).
func TestFoldWatchFilter(t *testing.T) {
	f := newFolder()
	f.filter = map[string]bool{"a": true, "b": true}
	if f.snapshot(snap(50, 1, 0, "a"), false) {
		t.Fatal("a watching snapshot never pages")
	}
	f.apply(7, ev(55, "offline", "left", "a"))
	f.apply(7, ev(60, "online", "joined", "x"))
	f.apply(7, ev(61, "online", "joined", "b"))
	if f.gaps != 0 || !slices.Equal(users(f.v), []string{"b"}) {
		t.Fatalf("gaps %d view %v", f.gaps, users(f.v))
	}
}

func TestDiffViews(t *testing.T) {
	want := view{"a": {}, "b": {"s": "1"}, "c": {}}
	got := view{"a": {}, "b": {"s": "2"}, "d": {}}
	d := diffViews(want, got, nil)
	if len(d) != 3 || !strings.HasPrefix(d[0], "extra d") || !strings.HasPrefix(d[1], "missing c") || !strings.HasPrefix(d[2], "state of b") {
		t.Fatalf("diff %q", d)
	}
	if d := diffViews(want, got, map[string]bool{"a": true}); len(d) != 0 {
		t.Fatalf("restricted diff %q", d)
	}
}

func TestDiffTrans(t *testing.T) {
	want := []trans{{User: "a", Kind: "online", Seq: 3}, {User: "a", Kind: "offline", Seq: 9}}
	if d := diffTrans(want, []entry{ev(3, "online", "joined", "a"), ev(9, "offline", "left", "a")}); d != "" {
		t.Fatal(d)
	}
	if d := diffTrans(want, []entry{ev(3, "online", "joined", "a")}); !strings.HasPrefix(d, "missing event 9") {
		t.Fatal(d)
	}
	if d := diffTrans(want[:1], []entry{ev(3, "online", "joined", "a"), ev(4, "online", "joined", "b")}); !strings.HasPrefix(d, "extra event 4") {
		t.Fatal(d)
	}
	if d := diffTrans(want, []entry{ev(3, "online", "joined", "a"), ev(8, "offline", "left", "a")}); !strings.HasPrefix(d, "event 1") {
		t.Fatal(d)
	}
}

// A watch list's users' events may cross (each user's are in order): the
// fold applies both, and still counts a repeat of one user's event.
func TestWatchFoldTakesCrossingUsers(t *testing.T) {
	f := newFolder()
	f.filter = map[string]bool{"a": true, "b": true}
	f.snapshot(&presence.Snapshot{Epoch: 1, RoomSeq: 10, Members: []presence.Member{}}, false)
	f.apply(1, entry{Seq: 12, Kind: presence.Online, User: "b"})
	f.apply(1, entry{Seq: 11, Kind: presence.Online, User: "a"})
	f.apply(1, entry{Seq: 12, Kind: presence.Online, User: "b"}) // repeated
	f.apply(1, entry{Seq: 9, Kind: presence.Offline, User: "a"}) // in the snapshot
	if len(f.v) != 2 || f.dups != 2 {
		t.Fatalf("view %v, repeats %d: want a and b, 2 repeats", f.v, f.dups)
	}
}

func TestSnapshotReasonIsReadFromTheHead(t *testing.T) {
	for head, want := range map[string]string{
		`{"type":"snapshot","ref":"j","room":"big","reason":"resync","truncated":true,"snapshot":{`: "resync",
		`{"type":"snapshot","ref":"j","room":"big","reason":"join","truncated":false,"snap`:         "join",
		`{"type":"snapshot","ref":"j","room":"big","rea`:                                            "",
	} {
		if got := snapshotReason([]byte(head)); got != want {
			t.Errorf("snapshotReason(%s) = %q, want %q", head, got, want)
		}
	}
}

package node

import (
	"bytes"
	"compress/flate"
	"encoding/json"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
)

// marshalSnapshot is the reference: what encoding/json writes for the frame.
func marshalSnapshot(ref, reason string, s presence.Snapshot) []byte {
	return mustJSON(protocol.Snapshot{Type: protocol.TypeSnapshot, Ref: ref, Room: s.Room, Reason: reason, Truncated: s.Total > len(s.Members), Snapshot: s})
}

var hostile = []string{
	"", "a", "room-1_=@+~", `q"uote`, `back\slash`, "<script>&amp;", "tab\there", "nl\n",
	"\x00\x1f", "é", "\u2028\u2029", "\xff\xfe", "日本", strings100(),
}

func strings100() string { return string(bytes.Repeat([]byte("x"), 100)) }

var states = []json.RawMessage{
	nil, json.RawMessage(`{}`), json.RawMessage(`"away"`), json.RawMessage(`{"a":1,"b":[true,null]}`),
	json.RawMessage(` { "a" : 1 } `), json.RawMessage(`"<b>&</b>"`), json.RawMessage("\"\u2028\""),
	json.RawMessage(`"é"`), json.RawMessage("[1,\n2]"),
}

func randomSnapshot(r *rand.Rand) (string, string, presence.Snapshot) {
	pick := func() string { return hostile[r.IntN(len(hostile))] }
	when := func() time.Time {
		switch r.IntN(4) {
		case 0:
			return time.Time{}
		case 1:
			return time.UnixMilli(r.Int64N(4e12)).UTC()
		case 2:
			return time.Unix(r.Int64N(4e9), r.Int64N(1e9)).In(time.FixedZone("x", 3600*(r.IntN(25)-12)))
		default:
			return time.Unix(r.Int64N(4e9), 0).UTC()
		}
	}
	s := presence.Snapshot{
		Region: pick(), Room: pick(), At: when(), Total: r.IntN(5), Offset: r.IntN(3),
		RoomSeq: r.Uint64(), Epoch: r.Int64() - r.Int64(), StreamSeq: r.Uint64(),
	}
	if r.IntN(5) > 0 {
		s.Members = []presence.Member{}
		for range r.IntN(4) {
			m := presence.Member{User: pick(), Until: when()}
			if r.IntN(4) > 0 {
				m.Sessions = []presence.SessionInfo{}
				for range r.IntN(3) {
					m.Sessions = append(m.Sessions, presence.SessionInfo{ID: pick(), Expires: when(), State: states[r.IntN(len(states))]})
				}
			}
			s.Members = append(s.Members, m)
		}
	}
	return pick(), pick(), s
}

func TestSnapshotFrameIsWhatEncodingJSONWrites(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	cases := 20000
	if testing.Short() {
		cases = 1000 // the same first cases; the full run checks all
	}
	for i := range cases {
		ref, reason, s := randomSnapshot(r)
		want := marshalSnapshot(ref, reason, s)
		if got := encodeSnapshot(ref, reason, s); !bytes.Equal(got, want) {
			t.Fatalf("case %d:\n got %s\nwant %s", i, got, want)
		}
	}
}

func TestSnapshotFrameWithAnUnencodableTimeStillEncodes(t *testing.T) {
	s := presence.Snapshot{Room: "r", At: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}
	b := encodeSnapshot("j1", "", s)
	var f map[string]any
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatalf("frame %s: %v", b, err)
	}
	if snap := f["snapshot"].(map[string]any); snap["at"] != nil {
		t.Fatalf("at = %v, want null", snap["at"])
	}
}

func FuzzSnapshotFrame(f *testing.F) {
	f.Add("r", "u", "s", []byte(`{"a":1}`), int64(1))
	f.Add("<", "\xff", "\u2028", []byte(" [ 1 ] "), int64(-1))
	f.Fuzz(func(t *testing.T, room, user, sid string, state []byte, ms int64) {
		if !json.Valid(state) {
			state = nil
		}
		at := time.UnixMilli(ms % 2e14).UTC()
		s := presence.Snapshot{Room: room, At: at, Total: 1, Members: []presence.Member{{User: user, Until: at, Sessions: []presence.SessionInfo{{ID: sid, Expires: at, State: state}}}}}
		if got, want := encodeSnapshot(sid, user, s), marshalSnapshot(sid, user, s); !bytes.Equal(got, want) {
			t.Fatalf("\n got %s\nwant %s", got, want)
		}
	})
}

func BenchmarkSnapshotFrame(b *testing.B) {
	s := presence.Snapshot{Region: "eu", Room: "room-1", At: time.Now().UTC(), Total: 50}
	for i := range 50 {
		at := time.Now().Add(time.Duration(i) * time.Second).UTC()
		s.Members = append(s.Members, presence.Member{User: "user-" + string(rune('a'+i%26)), Until: at, Sessions: []presence.SessionInfo{{ID: "tab-1", Expires: at}}})
	}
	b.Run("hand", func(b *testing.B) {
		for b.Loop() {
			encodeSnapshot("j1", "", s)
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		for b.Loop() {
			marshalSnapshot("j1", "", s)
		}
	})
}

// An events frame is valid JSON whose entries give back each transition's
// fields, whatever the ids and states hold; entries at or below after,
// and session-only ones without detail, are left out.
func TestEventsFramesCarryEachTransition(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	kinds := []struct {
		k presence.Kind
		r presence.Reason
	}{{presence.Online, presence.Joined}, {presence.Offline, presence.Left}, {presence.Update, presence.State}, {presence.Update, presence.Joined}}
	for range 200 {
		var ts []presence.Transition
		var es []event
		for i := range 1 + r.IntN(8) {
			kr := kinds[r.IntN(len(kinds))]
			tr := presence.Transition{Kind: kr.k, Reason: kr.r, User: hostile[r.IntN(len(hostile))], Session: hostile[r.IntN(len(hostile))],
				Sessions: r.IntN(5), Seq: uint64(10 + i), Epoch: 9}
			if kr.r == presence.State {
				tr.State = states[r.IntN(len(states))]
			}
			ts = append(ts, tr)
			es = append(es, event{epoch: 9, seq: tr.Seq, entry: encodeEntry(tr), sessionsOnly: sessionsOnly(tr)})
		}
		after := uint64(9 + r.IntN(3))
		d := detail(r.IntN(2))
		f := encodeEvents(hostile[r.IntN(len(hostile))], "room", es, after, d)
		var want []presence.Transition
		for _, tr := range ts {
			if tr.Seq > after && (!sessionsOnly(tr) || d == detailSessions) {
				want = append(want, tr)
			}
		}
		if len(want) == 0 {
			if f != nil {
				t.Fatalf("a frame of nothing: %s", f)
			}
			continue
		}
		var fr struct {
			Type   string
			Room   string
			Epoch  int64
			Events [][]json.RawMessage
		}
		if err := json.Unmarshal(f, &fr); err != nil || fr.Type != "events" || fr.Room != "room" || fr.Epoch != 9 || len(fr.Events) != len(want) {
			t.Fatalf("frame %s: %v", f, err)
		}
		for i, tr := range want {
			e := fr.Events[i]
			var seq uint64
			var kind, reason, user, session string
			var sessions int
			for j, dst := range []any{&seq, &kind, &reason, &user, &session, &sessions} {
				if err := json.Unmarshal(e[j], dst); err != nil {
					t.Fatalf("entry %s: %v", e, err)
				}
			}
			if seq != tr.Seq || kind != string(tr.Kind) || reason != string(tr.Reason) || user != viaJSON(tr.User) || session != viaJSON(tr.Session) || sessions != tr.Sessions {
				t.Fatalf("entry %s, want %+v", bytes.Join(rawJoin(e), []byte(",")), tr)
			}
			hasState := tr.Reason == presence.State && len(tr.State) > 0
			if hasState != (len(e) == 7) {
				t.Fatalf("entry %s: state present %v, want %v", bytes.Join(rawJoin(e), []byte(",")), len(e) == 7, hasState)
			}
			if hasState {
				var got, exp any
				_ = json.Unmarshal(e[6], &got)
				_ = json.Unmarshal(tr.State, &exp)
				if !reflectEqual(got, exp) {
					t.Fatalf("state %s, want %s", e[6], tr.State)
				}
			}
		}
	}
}

func rawJoin(e []json.RawMessage) [][]byte {
	out := make([][]byte, len(e))
	for i, r := range e {
		out[i] = r
	}
	return out
}

func reflectEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

// viaJSON is s as encoding/json gives it back (invalid UTF-8 replaced).
func viaJSON(s string) string {
	var out string
	_ = json.Unmarshal(mustJSON(s), &out)
	return out
}

// BenchmarkSharedEventsFrame compresses a big room's tick frame as the
// hub has it compressed for its members that negotiated permessage-deflate
// (once per frame for all of them): 300 entries of joins and leaves shaped as the bigroom
// load scenario's, about 300 ms of its 500 + 500/s. It reports the
// frame's bytes plain and as deflated on the wire (gorilla compresses at
// flate level 1 without context takeover, the 4-byte flush tail cut).
func BenchmarkSharedEventsFrame(b *testing.B) {
	es := make([]event, 300)
	for i := range es {
		t := presence.Transition{Region: "load", Room: "big1080414516", User: "c1080414516-" + strconv.Itoa(7000+i), Session: "s",
			Kind: presence.Online, Reason: presence.Joined, Sessions: 1, Seq: uint64(22000 + i), Epoch: 1764554400000}
		if i%2 == 1 {
			t.Kind, t.Reason, t.Session, t.Sessions = presence.Offline, presence.Left, "", 0
		}
		es[i] = event{epoch: t.Epoch, seq: t.Seq, entry: encodeEntry(t)}
	}
	f := encodeEvents("load", "big1080414516", es, 0, detailStates)
	var z bytes.Buffer
	w, err := flate.NewWriter(&z, 1)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() { // the cost of a tick's compression, once for every member
		z.Reset()
		w.Reset(&z)
		if _, err := w.Write(f); err != nil || w.Flush() != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(f)), "B/frame")
	b.ReportMetric(float64(z.Len()-4), "B/deflated")
}

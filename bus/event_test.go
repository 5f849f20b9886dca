package bus

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/presence-dev/presence/presence"
)

func TestEventRoundTrip(t *testing.T) {
	in := presence.Transition{
		ID: "eu/room42/1764444000000/17", Region: "eu", Room: "room42", User: "u_8827",
		Kind: presence.Update, Reason: presence.State, Sessions: 2, Seq: 17,
		At: time.UnixMilli(1764444000123), Session: "tab1", State: json.RawMessage(`{"status":"away"}`),
	}
	b, err := EncodeEvent(in)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"v":1`) || !strings.Contains(string(b), `"at":"2025-11-29T19:20:00.123Z"`) {
		t.Fatalf("encoding: %s", b)
	}
	out, err := DecodeEvent(b)
	if err != nil {
		t.Fatal(err)
	}
	if !out.At.Equal(in.At) || out.ID != in.ID || string(out.State) != string(in.State) || out.Seq != 17 || out.Sessions != 2 {
		t.Fatalf("round trip: %+v", out)
	}
	if got := EventSubject(in); got != "presence.eu.room42.update.u_8827" {
		t.Fatalf("subject: %s", got)
	}
}

func TestDecodeRejects(t *testing.T) {
	for _, bad := range []string{
		`not json`,
		`{"v":2,"id":"x","kind":"online","region":"eu","room":"r","user":"u"}`,
		`{"v":1,"kind":"online","region":"eu","room":"r","user":"u"}`,
		`{"v":1,"id":"x","kind":"away","region":"eu","room":"r","user":"u"}`,
		`{"v":1,"id":"x","kind":"online","region":"eu","room":"r.1","user":"u"}`,
	} {
		t.Run(bad, func(t *testing.T) {
			if _, err := DecodeEvent([]byte(bad)); err == nil || !strings.HasPrefix(err.Error(), "bus: decode event: ") {
				t.Errorf("DecodeEvent(%s) = %v", bad, err)
			}
		})
	}
	if _, err := EncodeEvent(presence.Transition{Kind: "x"}); err == nil {
		t.Error("encoded a transition without id")
	}
}

func TestSubjects(t *testing.T) {
	r, room, k, u, err := ParseSubject("presence.eu.room42.offline.u_1")
	if err != nil || r != "eu" || room != "room42" || k != presence.Offline || u != "u_1" {
		t.Fatalf("parse: %v %v %v %v %v", r, room, k, u, err)
	}
	if _, _, _, _, err := ParseSubject("presence.global.room42.online.u_1"); err != nil {
		t.Fatalf("global subject: %v", err)
	}
	for _, bad := range []string{"presence.eu.room42.offline", "presence.eu.room42.gone.u", "other.eu.r.online.u", "presence.eu.r.online.u.x", "presence.e u.r.online.u"} {
		if _, _, _, _, err := ParseSubject(bad); err == nil {
			t.Errorf("ParseSubject(%q) accepted", bad)
		}
	}
	if RoomFilter("eu", "room42") != "presence.eu.room42.>" || APISubject("eu", "members") != "presence-api.eu.members" {
		t.Fatal("filters")
	}
	if err := ValidateRegion("global"); err == nil {
		t.Fatal("global accepted as a region")
	}
	// The whole namespace, byte for byte: other services and the NATS
	// permissions (deploy/nats) spell these out.
	g := presence.Transition{Region: GlobalRegion, Room: "lobby", Kind: presence.Online, User: "ann"}
	for got, want := range map[string]string{
		EventSubject(g):         "presence.global.lobby.online.ann",
		IngestSubject(g):        "presence-in.global.lobby.online.ann",
		IngestFilter("eu"):      "presence-in.eu.>",
		RegionFilter("eu"):      "presence.eu.>",
		SyncDeltaSubject("eu"):  "presence-sync.eu.delta",
		SyncFullSubject("eu"):   "presence-sync.eu.full",
		SyncResyncSubject("eu"): "presence-sync.eu.resync",
		SyncResyncAllSubject:    "presence-sync.resync",
		GlobalIngestSubject(g):  "presence-sync.global.lobby.online.ann",
		GlobalIngestRoot + ".>": "presence-sync.global.>",
		TakeoverSubject("eu"):   "presence-ctl.eu.takeover",
	} {
		if got != want {
			t.Errorf("subject %q, want %q", got, want)
		}
	}
}

// at always has three fractional digits, trailing zeros included.
func TestEventTimeHasMilliseconds(t *testing.T) {
	for at, want := range map[time.Time]string{
		time.Date(2026, 11, 29, 12, 41, 22, 200e6, time.UTC):                      `"at":"2026-11-29T12:41:22.200Z"`,
		time.Date(2026, 11, 29, 12, 41, 22, 0, time.UTC):                          `"at":"2026-11-29T12:41:22.000Z"`,
		time.Date(2026, 11, 29, 13, 41, 22, 123456789, time.FixedZone("x", 3600)): `"at":"2026-11-29T12:41:22.123Z"`,
	} {
		t.Run(want, func(t *testing.T) {
			b, err := EncodeEvent(presence.Transition{ID: "eu/r/1/1", Region: "eu", Room: "r", User: "u", Kind: presence.Online, At: at})
			if err != nil || !strings.Contains(string(b), want) {
				t.Fatalf("%v: %s %v, want %s", at, b, err, want)
			}
			back, err := DecodeEvent(b)
			if err != nil || !back.At.Equal(at.Truncate(time.Millisecond)) {
				t.Fatalf("round trip of %v: %v %v", at, back.At, err)
			}
		})
	}
}

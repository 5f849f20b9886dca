package region

import (
	"context"
	"encoding/json"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/presence"
)

// The outbox entries the real Lua writes, byte for byte, and what they
// decode to. A change of emit's format in lib.lua, or of decodeEntry,
// fails here.
func TestOutboxEntryGolden(t *testing.T) {
	rdb, _ := testredis.Client(t)
	c := &collector{}
	c.down.Store(true) // nothing is acknowledged: the entries stay
	s := newStore(t, rdb, c)
	ctx := context.Background()
	tab := ref("golden", "alice", "tab")
	touch(t, s, tab)
	if ok, err := s.SetState(ctx, tab, []byte(`{"x": "a|b"}`)); !ok || err != nil {
		t.Fatalf("SetState: %v %v", ok, err)
	}
	release(t, s, tab)
	waitRedisPast(t, rdb, redisNow(t, rdb).Add(testTiming.OfflineGrace))
	reap(t, s)

	raw, err := rdb.LRange(ctx, s.roomKeys("golden").o, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	// The golden entries; E is the room's epoch and A an event's time,
	// both Redis ms, which no test controls.
	golden := []string{
		`1|E|online|joined|alice|1|A|tab|`,
		`2|E|update|state|alice|1|A|tab|{"x":"a|b"}`,
		`3|E|offline|left|alice|0|A||`,
	}
	if len(raw) != len(golden) {
		t.Fatalf("outbox %q, want %d entries", raw, len(golden))
	}
	var epoch string
	for i, g := range golden {
		pat := "^" + regexp.QuoteMeta(g) + "$"
		pat = strings.Replace(pat, "E", `(\d{13})`, 1)
		pat = strings.Replace(pat, "A", `(\d{13})`, 1)
		m := regexp.MustCompile(pat).FindStringSubmatch(raw[i])
		if m == nil {
			t.Fatalf("entry %d: %q, want the form %q", i+1, raw[i], g)
		}
		if i == 0 {
			epoch = m[1]
			if m[2] != epoch {
				t.Fatalf("first entry %q: a new room's epoch is its first event's time", raw[i])
			}
		}
		if m[1] != epoch {
			t.Fatalf("entry %d: epoch %s, want %s", i+1, m[1], epoch)
		}
		ep, _ := strconv.ParseInt(epoch, 10, 64)
		at, _ := strconv.ParseInt(m[2], 10, 64)
		f := strings.Split(g, "|")
		want := presence.Transition{
			ID: "eu/golden/" + epoch + "/" + f[0], Region: "eu", Room: "golden", User: "alice",
			Kind: presence.Kind(f[2]), Reason: presence.Reason(f[3]), Sessions: int(f[5][0] - '0'),
			Seq: uint64(i + 1), Epoch: ep, At: time.UnixMilli(at), Session: f[7],
		}
		if i == 1 {
			want.State = json.RawMessage(`{"x":"a|b"}`)
		}
		got, err := decodeEntry("eu", "golden", raw[i])
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("entry %q decodes to\n%+v %v\nwant\n%+v", raw[i], got, err, want)
		}
	}
}

func TestDecodeEntryRejectsGarbage(t *testing.T) {
	for _, e := range []string{
		"",
		"garbage",
		"1|2|online|joined|u|1|3|",                // eight fields
		"x|2|online|joined|u|1|3||",               // seq
		"1|x|online|joined|u|1|3||",               // epoch
		"1|2|online|joined|u|x|3||",               // sessions
		"1|2|online|joined|u|1|x||",               // at
		"1|2|online|joined|u|-1|3||",              // negative sessions
		"-1|2|online|joined|u|1|3||",              // negative seq
		"1|2|sideways|joined|u|1|3||",             // kind
		"1|2|online|joined||1|3||",                // no user
		"99999999999999999999|2|online|j|u|1|3||", // seq past uint64
	} {
		t.Run(e, func(t *testing.T) {
			if tr, err := decodeEntry("eu", "r", e); err == nil {
				t.Fatalf("decoded %+v", tr)
			}
		})
	}
}

// decodeEntry never panics, and what it accepts has emit's shape.
func FuzzDecodeEntry(f *testing.F) {
	for _, e := range []string{
		"1|1764444000000|online|joined|alice|1|1764444000000||",
		`2|1764444000000|update|state|alice|1|1764444000123|tab|{"x":"a|b"}`,
		"3|1764444000000|offline|left|alice|0|1764444001000||",
		"1|2|3", "||||||||", "1|2|online|joined|u|1|3|||||",
	} {
		f.Add(e)
	}
	f.Fuzz(func(t *testing.T, e string) {
		tr, err := decodeEntry("eu", "r", e)
		if err != nil {
			return
		}
		if strings.Count(e, "|") < entryFields-1 || !tr.Kind.Valid() || tr.User == "" || tr.Sessions < 0 ||
			tr.Region != "eu" || tr.Room != "r" || tr.ID != transitionID("eu", "r", tr.Epoch, tr.Seq) {
			t.Fatalf("accepted %q as %+v", e, tr)
		}
	})
}

// The Go side sends a room's keys in the order room_at in lib.lua reads
// them, and as many as it reads per room.
func TestRoomKeysMatchTheLua(t *testing.T) {
	lib, err := luaFS.ReadFile("lua/lib.lua")
	if err != nil {
		t.Fatal(err)
	}
	body := regexp.MustCompile(`(?s)local function room_at\(base\)(.*?)\nend`).FindSubmatch(lib)
	if body == nil {
		t.Fatal("no room_at in lib.lua")
	}
	fields := regexp.MustCompile(`(\w+) = KEYS\[base(?: \+ (\d+))?\]`).FindAllSubmatch(body[1], -1)
	n := regexp.MustCompile(`local ROOM_KEYS = (\d+)`).FindSubmatch(lib)
	k := (&Store{opt: Options{Prefix: "presence"}}).roomKeys("r")
	all := k.all()
	if n == nil || string(n[1]) != strconv.Itoa(len(all)) || len(fields) != len(all) {
		t.Fatalf("lib.lua reads %d keys per room (ROOM_KEYS %s), Go sends %d", len(fields), n, len(all))
	}
	v := reflect.ValueOf(k)
	for i, f := range fields {
		off := 0
		if len(f[2]) > 0 {
			off, _ = strconv.Atoi(string(f[2]))
		}
		if off != i || v.FieldByName(string(f[1])).String() != all[off] {
			t.Fatalf("room_at reads %s at base + %d; Go sends %q there", f[1], off, all[i])
		}
	}
}

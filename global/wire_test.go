package global

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/presence-dev/presence/bus"
)

func TestDiffApplyRoundTrip(t *testing.T) {
	old := regionView{"r1": {"u1": {"a"}, "u2": {"b", "c"}}, "r2": {"u3": {}}}
	now := regionView{"r1": {"u1": {"a"}, "u2": {"c"}, "u4": {}}, "r3": {"u5": {"d"}}}
	ops := now.Diff(old)
	got := regionView{"r1": {"u1": {"a"}, "u2": {"b", "c"}}, "r2": {"u3": {}}}
	got.Apply(ops)
	if !reflect.DeepEqual(got, now) {
		t.Fatalf("apply(diff) = %v, want %v", got, now)
	}
	if d := now.Diff(now); len(d) != 0 {
		t.Fatalf("diff of equal views: %v", d)
	}
	// u1 unchanged is not sent; u3's room vanished entirely.
	data, _ := json.Marshal(ops)
	if strings.Contains(string(data), `"u1"`) || !strings.Contains(string(data), `"del":["u3"]`) {
		t.Fatalf("ops %s", data)
	}
}

func TestChunkOpsStaysUnderBudget(t *testing.T) {
	v := regionView{}
	for r := range 7 {
		room := map[string][]string{}
		for u := range 300 {
			room[fmt.Sprintf("user-%04d", u)] = []string{fmt.Sprintf("sess-%d-%d-a", r, u), fmt.Sprintf("sess-%d-%d-b", r, u)}
		}
		v[fmt.Sprintf("room-%d", r)] = room
	}
	const budget = 8 << 10
	chunks := chunkOps(v.Ops(), budget)
	if len(chunks) < 10 {
		t.Fatalf("%d chunks for ~%dKiB", len(chunks), len(mustJSON(t, v.Ops()))>>10)
	}
	back := regionView{}
	for _, c := range chunks {
		if n := len(mustJSON(t, c)); n > budget {
			t.Fatalf("chunk of %d bytes over the %d budget", n, budget)
		}
		back.Apply(c)
	}
	if !reflect.DeepEqual(back, v) {
		t.Fatal("chunks do not add up to the view")
	}
	dels := chunkOps([]roomOps{{Room: "r", Del: []string{"a", "b"}}}, budget)
	if len(dels) != 1 || len(dels[0][0].Del) != 2 {
		t.Fatalf("deletions: %v", dels)
	}
}

// States travel with their user: a change of state alone sets the user
// whole, chunks keep them, and applying the ops gives the states back.
func TestTruthDiffCarriesStates(t *testing.T) {
	old := truth{
		Members: regionView{"r": {"u1": {"a", "b"}, "u2": {"c"}}},
		States:  stateView{"r": {"u1": {"a": `"away"`}}},
	}
	now := truth{
		Members: regionView{"r": {"u1": {"a", "b"}, "u2": {"c"}}},
		States:  stateView{"r": {"u1": {"b": `"typing"`}, "u2": {"c": `{"x":"<&>"}`}}},
	}
	ops := now.Diff(old)
	if len(ops) != 1 || len(ops[0].Set) != 2 || string(ops[0].St["u1"]["b"]) != `"typing"` || ops[0].St["u1"]["a"] != nil {
		t.Fatalf("ops %s", mustJSON(t, ops))
	}
	got := stateView{"r": {"u1": {"a": `"away"`}}}
	got.Apply(ops)
	if !reflect.DeepEqual(got, now.States) {
		t.Fatalf("apply(diff) = %v, want %v", got, now.States)
	}
	if d := now.Diff(now); len(d) != 0 {
		t.Fatalf("diff of equal truths: %v", d)
	}
	// Cleared: u1 set without st.
	cleared := truth{Members: now.Members, States: stateView{"r": {"u2": now.States["r"]["u2"]}}}
	got.Apply(cleared.Diff(now))
	if !reflect.DeepEqual(got, cleared.States) {
		t.Fatalf("after clearing: %v", got)
	}
	// Chunked small, the states still add up, and every chunk decodes.
	back := stateView{}
	for i, c := range chunkOps(now.Ops(), 64) {
		back.Apply(c)
		body := mustJSON(t, publication{V: 1, Kind: kindDelta, Region: "eu", Gen: 1, Inst: "i", Seq: uint64(i + 1), Rooms: c})
		if _, err := decodePublication(bus.SyncDeltaSubject("eu"), body); err != nil {
			t.Fatalf("chunk %d: %v", i, err)
		}
	}
	if !reflect.DeepEqual(back, now.States) {
		t.Fatalf("chunks give %v, want %v", back, now.States)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodePublicationRejects(t *testing.T) {
	good := `{"v":1,"kind":"delta","region":"eu","gen":1,"inst":"i","seq":1,"at":0,"rooms":[{"room":"r","set":{"u":["s"]},"st":{"u":{"s":{"a":1}}},"del":["x"]}]}`
	if _, err := decodePublication(bus.SyncDeltaSubject("eu"), []byte(good)); err != nil {
		t.Fatalf("good delta: %v", err)
	}
	goodFull := `{"v":1,"kind":"full","region":"eu","gen":1,"inst":"i","seq":1,"part":1,"parts":1,"rooms":[]}`
	if _, err := decodePublication(bus.SyncFullSubject("eu"), []byte(goodFull)); err != nil {
		t.Fatalf("good full: %v", err)
	}
	bad := map[string]struct{ subject, body string }{
		"not JSON":            {bus.SyncDeltaSubject("eu"), `{`},
		"version":             {bus.SyncDeltaSubject("eu"), strings.Replace(good, `"v":1`, `"v":2`, 1)},
		"region reserved":     {bus.SyncDeltaSubject("global"), strings.Replace(good, `"eu"`, `"global"`, 1)},
		"region invalid":      {"presence-sync.e u.delta", strings.Replace(good, `"eu"`, `"e u"`, 1)},
		"subject mismatch":    {bus.SyncDeltaSubject("ap"), good},
		"kind mismatch":       {bus.SyncFullSubject("eu"), good},
		"unknown kind":        {bus.SyncDeltaSubject("eu"), strings.Replace(good, `"delta"`, `"beat"`, 1)},
		"no gen":              {bus.SyncDeltaSubject("eu"), strings.Replace(good, `"gen":1`, `"gen":0`, 1)},
		"no seq":              {bus.SyncDeltaSubject("eu"), strings.Replace(good, `"seq":1`, `"seq":0`, 1)},
		"no instance":         {bus.SyncDeltaSubject("eu"), strings.Replace(good, `"inst":"i"`, `"inst":""`, 1)},
		"bad room":            {bus.SyncDeltaSubject("eu"), strings.Replace(good, `"room":"r"`, `"room":"a.b"`, 1)},
		"bad user":            {bus.SyncDeltaSubject("eu"), strings.Replace(good, `{"u":`, `{"u*":`, 1)},
		"bad session":         {bus.SyncDeltaSubject("eu"), strings.Replace(good, `["s"]`, `["s>"]`, 1)},
		"bad deleted user":    {bus.SyncDeltaSubject("eu"), strings.Replace(good, `["x"]`, `[""]`, 1)},
		"part of a delta":     {bus.SyncDeltaSubject("eu"), strings.Replace(good, `"at":0`, `"at":0,"part":1,"parts":1`, 1)},
		"part 0":              {bus.SyncFullSubject("eu"), strings.Replace(goodFull, `"part":1`, `"part":0`, 1)},
		"part beyond parts":   {bus.SyncFullSubject("eu"), strings.Replace(goodFull, `"part":1`, `"part":2`, 1)},
		"too many parts":      {bus.SyncFullSubject("eu"), strings.Replace(goodFull, `"parts":1`, `"parts":1000000`, 1)},
		"full deletes":        {bus.SyncFullSubject("eu"), strings.Replace(goodFull, `"rooms":[]`, `"rooms":[{"room":"r","del":["u"]}]`, 1)},
		"wrong type":          {bus.SyncDeltaSubject("eu"), strings.Replace(good, `"seq":1`, `"seq":"1"`, 1)},
		"state of no user":    {bus.SyncDeltaSubject("eu"), strings.Replace(good, `"st":{"u":`, `"st":{"v":`, 1)},
		"state of no session": {bus.SyncDeltaSubject("eu"), strings.Replace(good, `{"s":{"a":1}}`, `{"t":{"a":1}}`, 1)},
		"null state":          {bus.SyncDeltaSubject("eu"), strings.Replace(good, `{"a":1}`, `null`, 1)},
		"state too big":       {bus.SyncDeltaSubject("eu"), strings.Replace(good, `{"a":1}`, `"`+strings.Repeat("x", 1100)+`"`, 1)},
	}
	for name, c := range bad {
		t.Run(name, func(t *testing.T) {
			if _, err := decodePublication(c.subject, []byte(c.body)); err == nil {
				t.Errorf("%s: accepted", name)
			} else if !strings.HasPrefix(err.Error(), "global: decode publication") {
				t.Errorf("%s: error %v", name, err)
			}
		})
	}
}

func TestKeyEscape(t *testing.T) {
	for in, want := range map[string]string{"eu-west": "eu-west", "a_b": "a_5Fb", "x@y+z~w=v": "x_40y_2Bz_7Ew_3Dv"} {
		t.Run(in, func(t *testing.T) {
			if got := keyEscape(in); got != want {
				t.Errorf("keyEscape(%q) = %q, want %q", in, got, want)
			}
		})
	}
	if err := checkBucket("b", LeaseBucket("a@b_c")); err != nil {
		t.Fatal(err)
	}
}

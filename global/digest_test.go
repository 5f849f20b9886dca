package global

import (
	"encoding/json"
	"testing"
)

// A publisher and an aggregator holding the same view agree on its
// digest: whatever the order it was built in, and with states as the
// publisher reads them (raw) and as the aggregator receives them
// (escaped by json.Marshal).
func TestDigestOfTheSameViewAgrees(t *testing.T) {
	raw := `{"note":"<b>&</b>"}`
	pubView := truth{Members: regionView{"r": {"u1": {"a", "b"}, "u2": {}}}, States: stateView{"r": {"u1": {"b": raw}}}}
	sent, err := json.Marshal(publication{Rooms: pubView.Ops()})
	if err != nil {
		t.Fatal(err)
	}
	var got publication
	if err := json.Unmarshal(sent, &got); err != nil {
		t.Fatal(err)
	}
	aggRooms, aggStates := regionView{}, stateView{}
	aggRooms.Apply(got.Rooms)
	aggStates.Apply(got.Rooms)
	if aggStates["r"]["u1"]["b"] == raw {
		t.Fatal("the state arrived unescaped: this test no longer tests the escaping")
	}
	if a, b := digest(pubView.Members, pubView.States), digest(aggRooms, aggStates); a != b {
		t.Fatalf("publisher %s, aggregator %s", a, b)
	}
	// Any difference shows: a session, a state, a member in the grace.
	for name, v := range map[string]truth{
		"session": {Members: regionView{"r": {"u1": {"a"}, "u2": {}}}, States: pubView.States},
		"state":   {Members: pubView.Members, States: stateView{"r": {"u1": {"b": `{}`}}}},
		"grace":   {Members: regionView{"r": {"u1": {"a", "b"}}}, States: pubView.States},
		"room":    {Members: regionView{"q": {"u1": {"a", "b"}, "u2": {}}}, States: stateView{"q": {"u1": {"b": raw}}}},
	} {
		if digest(v.Members, v.States) == digest(pubView.Members, pubView.States) {
			t.Errorf("%s: same digest", name)
		}
	}
}

// A delta whose digest differs from the aggregator's copy once applied
// puts the region out of sync (held) and asks for a full; a matching one
// changes nothing.
func TestCoreADigestMismatchAsksForAFull(t *testing.T) {
	r := newRig(t, "eu")
	view := regionView{"r": {"u1": {"s1"}}}
	r.full("eu", view, false)
	ok := digest(regionView{"r": {"u1": {"s1"}, "u2": {"s2"}}}, stateView{})
	r.seq["eu"]++
	_, ask := r.c.publication(&publication{V: 1, Kind: kindDelta, Region: "eu", Gen: r.gen["eu"], Inst: "i", Seq: r.seq["eu"],
		Rooms: []roomOps{set("r", map[string][]string{"u2": {"s2"}})}, Digest: ok}, r.now)
	if ask || r.c.stats.DigestMismatches.Load() != 0 || !r.c.regions["eu"].synced {
		t.Fatalf("a matching digest: ask %v mismatches %d", ask, r.c.stats.DigestMismatches.Load())
	}
	r.seq["eu"]++
	_, ask = r.c.publication(&publication{V: 1, Kind: kindDelta, Region: "eu", Gen: r.gen["eu"], Inst: "i", Seq: r.seq["eu"], Digest: "1234"}, r.now)
	if !ask || r.c.stats.DigestMismatches.Load() != 1 || r.c.regions["eu"].synced {
		t.Fatalf("a wrong digest: ask %v mismatches %d synced %v", ask, r.c.stats.DigestMismatches.Load(), r.c.regions["eu"].synced)
	}
	if _, err := decodePublication("presence-sync.eu.full", []byte(`{"v":1,"kind":"full","region":"eu","gen":1,"inst":"i","seq":1,"part":1,"parts":1,"rooms":[],"dg":"1"}`)); err == nil {
		t.Fatal("a full with a digest decoded")
	}
}

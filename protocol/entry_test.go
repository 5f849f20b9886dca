package protocol

import (
	"encoding/json"
	"testing"

	"github.com/presence-dev/presence/presence"
)

// PROTOCOL.md's events example, entry by entry.
func TestDecodeEntryReadsTheDocsExample(t *testing.T) {
	var f Events
	err := json.Unmarshal([]byte(`{"type":"events","room":"lobby","region":"eu","epoch":1764444000000,
 "events":[[18,"online","joined","u_4242","tab-3f9a",1],
           [19,"update","state","u_4242","tab-3f9a",1,{"status":"away"}],
           [20,"offline","left","u_9001","",0]]}`), &f)
	if err != nil {
		t.Fatal(err)
	}
	want := []presence.Transition{
		{Seq: 18, Kind: presence.Online, Reason: presence.Joined, User: "u_4242", Session: "tab-3f9a", Sessions: 1},
		{Seq: 19, Kind: presence.Update, Reason: presence.State, User: "u_4242", Session: "tab-3f9a", Sessions: 1, State: json.RawMessage(`{"status":"away"}`)},
		{Seq: 20, Kind: presence.Offline, Reason: presence.Left, User: "u_9001"},
	}
	if len(f.Events) != len(want) {
		t.Fatalf("%d entries", len(f.Events))
	}
	for i, raw := range f.Events {
		got, err := DecodeEntry(&f, raw)
		w := want[i]
		w.Room, w.Region, w.Epoch = "lobby", "eu", 1764444000000
		if err != nil || got.String() != w.String() || got.Session != w.Session || string(got.State) != string(w.State) {
			t.Errorf("entry %d: %+v %v, want %+v", i, got, err, w)
		}
	}
}

func TestDecodeEntryRefusesMalformedEntries(t *testing.T) {
	f := &Events{Room: "r", Region: "eu", Epoch: 1}
	for name, raw := range map[string]string{
		"not an array": `{"seq":1}`,
		"short":        `[5,"online","joined","a","s"]`,
		"long":         `[5,"update","state","a","s",1,{},9]`,
		"kind":         `[5,"away","joined","a","s",1]`,
		"seq type":     `["5","online","joined","a","s",1]`,
		"no user":      `[5,"online","joined","","s",1]`,
		"bad user":     `[5,"online","joined","a b","s",1]`,
		"not json":     `[5,`,
	} {
		if tr, err := DecodeEntry(f, json.RawMessage(raw)); err == nil {
			t.Errorf("%s: %s decoded as %v", name, raw, tr)
		}
	}
}

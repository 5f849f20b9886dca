package client

import (
	"testing"

	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
)

// A snapshot of a large room lists its first members only; Total counts
// them all, and the events after it keep the count: an online adds one,
// an offline (of a member listed or not) takes one, an update neither.
func TestTotalOfATruncatedRoomFollowsTheEvents(t *testing.T) {
	r := &Room{id: "big", view: newView(false), joinRef: "1", ready: make(chan struct{})}
	snap := &presence.Snapshot{Room: "big", Total: 5000, RoomSeq: 10, Members: []presence.Member{{User: "a"}, {User: "b"}}}
	r.onSnapshot(&protocol.Frame{Type: protocol.TypeSnapshot, Ref: "1", Room: "big", Truncated: true, Snapshot: snap})
	for _, st := range []struct {
		t    presence.Transition
		want int
	}{
		{presence.Transition{Seq: 11, Kind: presence.Online, Reason: presence.Joined, User: "zz", Session: "s"}, 5001},
		{presence.Transition{Seq: 12, Kind: presence.Update, Reason: presence.State, User: "zz", Session: "s", State: []byte(`1`)}, 5001},
		{presence.Transition{Seq: 13, Kind: presence.Offline, Reason: presence.Left, User: "a"}, 5000},
		{presence.Transition{Seq: 14, Kind: presence.Offline, Reason: presence.Expired, User: "yy"}, 4999}, // not listed
		{presence.Transition{Seq: 14, Kind: presence.Offline, Reason: presence.Expired, User: "yy"}, 4999}, // a repeat
	} {
		r.onEvent(st.t)
		if r.total != st.want {
			t.Fatalf("after %v %s: total %d, want %d", st.t.Kind, st.t.User, r.total, st.want)
		}
	}
	if ms := r.view.list(); len(ms) != 2 || ms[0].User != "b" || ms[1].User != "zz" {
		t.Fatalf("view %v, want b and zz", ms)
	}
}

package node

import (
	"bytes"
	"testing"

	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
)

// TestJoinersOfOneReadShareTheirFrames: joiners served by one snapshot
// read with the same ref get the same snapshot frame, encoded once; a
// different ref, or another read, gets its own. The events after the
// snapshot are encoded once for all of them, again once more arrive.
func TestJoinersOfOneReadShareTheirFrames(t *testing.T) {
	r := &room{name: "r", view: "eu"}
	snap := presence.Snapshot{Room: "r", Region: "eu", Epoch: 7, RoomSeq: 2, Total: 3,
		Members: []presence.Member{{User: "a"}, {User: "b"}}}
	body := r.bodies.get(snap, detailStates)
	f1 := r.joinFrames.snapshot("1", protocol.ReasonJoin, snap, detailStates, body)
	f2 := r.joinFrames.snapshot("1", protocol.ReasonJoin, snap, detailStates, r.bodies.get(snap, detailStates))
	if &f1[0] != &f2[0] {
		t.Error("two joiners of one read with one ref: the frame was encoded twice")
	}
	if want := encodeSnapshotBody("1", protocol.ReasonJoin, "r", true, body); !bytes.Equal(f1, want) {
		t.Errorf("shared frame %s, want %s", f1, want)
	}
	f3 := r.joinFrames.snapshot("2", protocol.ReasonJoin, snap, detailStates, body)
	if !bytes.Contains(f3, []byte(`"ref":"2"`)) {
		t.Errorf("another ref got %s", f3)
	}
	snap2 := snap
	snap2.RoomSeq = 3
	if f4 := r.joinFrames.snapshot("2", protocol.ReasonJoin, snap2, detailStates, r.bodies.get(snap2, detailStates)); &f4[0] == &f3[0] {
		t.Error("another read's joiner got the last read's frame")
	}

	if f := r.joinFrames.events(r, 2, detailStates); f != nil {
		t.Errorf("no events buffered, got %s", f)
	}
	r.buffered = []event{fanEvent(3, presence.Online, presence.Joined), fanEvent(4, presence.Online, presence.Joined)}
	e1, e2 := r.joinFrames.events(r, 2, detailStates), r.joinFrames.events(r, 2, detailStates)
	if e1 == nil || &e1[0] != &e2[0] {
		t.Fatal("the events after one snapshot were encoded per joiner")
	}
	if want := encodeEvents("eu", "r", r.buffered, 2, detailStates); !bytes.Equal(e1, want) {
		t.Errorf("shared events frame %s, want %s", e1, want)
	}
	r.buffered = append(r.buffered, fanEvent(5, presence.Online, presence.Joined))
	if e3 := r.joinFrames.events(r, 2, detailStates); !bytes.Equal(e3, encodeEvents("eu", "r", r.buffered, 2, detailStates)) {
		t.Errorf("after one more event, got %s", e3)
	}
	if e4 := r.joinFrames.events(r, 4, detailStates); !bytes.Equal(e4, encodeEvents("eu", "r", r.buffered, 4, detailStates)) {
		t.Errorf("a joiner at 4 got %s", e4)
	}
}

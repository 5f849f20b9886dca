package node

import (
	"fmt"
	"github.com/presence-dev/presence/protocol"
	"slices"
	"testing"
	"time"
)

// A room larger than a snapshot is read in pages with members; bad pages
// and rooms not joined are refused and change nothing.
func TestMembersPagesThroughALargeRoom(t *testing.T) {
	e := newEnv(t)
	n := e.newNode(func(c *Config) { c.Limits.SnapshotMembers = 2 })
	all := []string{"*"}
	for i := range 4 {
		n.dial(t, token(t, fmt.Sprintf("u%d", i), all, time.Hour), "s").join("big")
	}
	c := n.dial(t, token(t, "u4", all, time.Hour), "s")
	first := c.join("big")
	if !first.Truncated || first.Snapshot.Total != 5 || len(first.Snapshot.Members) != 2 {
		t.Fatalf("snapshot: %s", first.raw)
	}
	var users []string
	for off := 0; off < 5; off += 2 {
		c.send(map[string]any{"type": "members", "room": "big", "offset": off, "limit": 2, "ref": "p"})
		f := c.expect("members")
		if f.Ref != "p" || f.Room != "big" || f.Snapshot.Total != 5 || f.Snapshot.Offset != off || f.Snapshot.RoomSeq < first.Snapshot.RoomSeq {
			t.Fatalf("page at %d: %s", off, f.raw)
		}
		for _, m := range f.Snapshot.Members {
			users = append(users, m.User)
		}
	}
	if want := []string{"u0", "u1", "u2", "u3", "u4"}; !slices.Equal(users, want) {
		t.Fatalf("pages gave %v, want %v", users, want)
	}
	c.send(map[string]any{"type": "members", "room": "big", "ref": "d"}) // defaults: offset 0, the snapshot limit
	if f := c.expect("members"); len(f.Snapshot.Members) != 2 || f.Snapshot.Members[0].User != "u0" {
		t.Fatalf("default page: %s", f.raw)
	}

	for _, bad := range []struct {
		frame map[string]any
		code  protocol.ErrorCode
	}{
		{map[string]any{"type": "members", "room": "big", "limit": 3, "ref": "b1"}, protocol.CodeInvalidPage},
		{map[string]any{"type": "members", "room": "big", "limit": 0, "ref": "b2"}, protocol.CodeInvalidPage},
		{map[string]any{"type": "members", "room": "big", "offset": -1, "ref": "b3"}, protocol.CodeInvalidPage},
		{map[string]any{"type": "members", "room": "other", "ref": "b4"}, protocol.CodeNotJoined},
		{map[string]any{"type": "members", "room": "a.b", "ref": "b5"}, protocol.CodeInvalidRoom},
	} {
		ref := bad.frame["ref"].(string)
		t.Run(ref, func(t *testing.T) {
			c := c.in(t)
			c.send(bad.frame)
			c.expectError(bad.code, ref)
		})
	}
	c.send(map[string]any{"type": "members", "room": "big", "offset": "x"})
	c.expectError(protocol.CodeBadFrame, "")
	c.ping()
	e.quiesce("big")
	if n := len(e.rec.Of("", "big", "u4")); n != 1 {
		t.Fatalf("u4 has %d transitions, want the join only", n)
	}
}

package region

import (
	"slices"
	"testing"

	"github.com/presence-dev/presence/presence"
)

// A touch writes the last seen only of users it did not announce: the
// delivery of an online or offline writes theirs (departuresSeen).
func TestUnannouncedLeavesOutTheUsersAnOnlineOrOfflineNames(t *testing.T) {
	refs := []presence.SessionRef{ref("r", "ann", "t1"), ref("r", "bob", "t1"), ref("q", "ann", "t2"), ref("r", "cat", "t1"), ref("r", "dan", "t1")}
	ts := []presence.Transition{
		{Kind: presence.Online, User: "ann"},
		{Kind: presence.Update, User: "bob"},
		{Kind: presence.Offline, User: "cat"},
	}
	got := unannounced(refs, ts)
	if want := []presence.SessionRef{refs[1], refs[4]}; !slices.Equal(got, want) {
		t.Fatalf("unannounced = %v, want %v", got, want)
	}
	if !slices.Equal(refs[:2], []presence.SessionRef{ref("r", "ann", "t1"), ref("r", "bob", "t1")}) {
		t.Fatalf("the caller's refs were changed: %v", refs)
	}
	if got := unannounced(refs, nil); !slices.Equal(got, refs) {
		t.Fatalf("with nothing announced: %v, want every ref", got)
	}
}

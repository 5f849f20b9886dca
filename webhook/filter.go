package webhook

import (
	"path"
	"slices"

	"github.com/presence-dev/presence/presence"
)

// matches reports whether the endpoint's filter takes t. A transition it
// does not take still moves the room's position: it is no gap.
func (e *Endpoint) matches(t presence.Transition) bool {
	if len(e.Kinds) > 0 && !slices.Contains(e.Kinds, string(t.Kind)) {
		return false
	}
	if len(e.Reasons) > 0 && !slices.Contains(e.Reasons, string(t.Reason)) {
		return false
	}
	if len(e.Rooms) == 0 {
		return true
	}
	for _, p := range e.Rooms {
		if ok, _ := path.Match(p, t.Room); ok {
			return true
		}
	}
	return false
}

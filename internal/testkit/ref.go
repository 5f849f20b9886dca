package testkit

import "github.com/presence-dev/presence/presence"

// Ref names one session of a user in a room.
func Ref(room, user, session string) presence.SessionRef {
	return presence.SessionRef{Room: room, User: user, Session: session}
}

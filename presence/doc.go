// Package presence is the model shared by every part of the service: the
// ids that name rooms, users, sessions and regions, the timing that decides
// when a session counts as gone, and the transitions (online, offline,
// update) that the service announces.
//
// A user is online in a room while at least one of their sessions is live.
// A session is live until its expiry, which only a live node pushes forward
// on its heartbeat. A clean close does not end presence at once: the user
// stays a member for the offline grace period, and a session that returns
// inside it makes the close a non-event.
//
// The package imports nothing else of this module.
package presence

// Package client is a Go client of the presence service: it connects to a
// node over WebSocket (docs/PROTOCOL.md, version 1), joins rooms and keeps
// each room's members as a view, folding the join's snapshot and the
// events after it by the protocol's rule, and stays present across
// network drops.
//
// A client keeps one session id across reconnects. While the link is
// down it reconnects on the browser client's schedule: tries at most a
// second apart until the offline grace (hello's offline_grace_ms) is
// nearly over, so an outage shorter than the grace ends in a reconnect
// inside it and the other members hear nothing; then waits growing to
// 10 s. After each reconnect it joins its rooms again, sends their states
// again and sends its watch lists again; every rejoin's snapshot replaces
// the view (a Sync change).
//
// Services, bots and devices use it to be present in a room (Join, then
// SetState), to follow one without being listed (JoinOptions.Observe), to
// follow only its count (JoinOptions.Count) or a few users of it (Watch).
// The browser's client is clients/js.
package client

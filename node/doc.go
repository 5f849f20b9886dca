// Package node is the WebSocket edge of the presence service. Browsers and
// other clients connect to a node, join rooms and set per-session state;
// the node keeps their sessions alive in the regional store with batched
// heartbeats, and forwards each joined room's snapshot and then its live
// transitions from NATS. The wire protocol is described in
// docs/PROTOCOL.md.
//
// A node holds no presence state of its own: everything lives in the
// regional store, and transitions reach NATS through the store's sink. A
// node that dies is noticed by the TTL of its sessions; a node that drains
// closes its clients with code 1012 without releasing their sessions, so
// a reconnect to another node inside the TTL is not announced at all.
//
// Parts: Node (node.go) wires them and runs their loops; none reaches
// another through it. A connection (conn*.go) gets its dependencies as
// narrow interfaces declared in conn.go: the rooms the hub offers
// (hub.go, room.go, resync.go, view.go; its parts: the snapshot flights in
// flight.go, the tick's fan-out in fanout.go, wave.go and count.go), the
// watch lists (watch.go), the sessions the session keeper holds for it
// (heartbeat.go), token checks (auth.go), admission (admission.go; the
// reconnect storm's gate, package internal/storm, in storm.go), metrics
// and a logger. The lock order is in locksordering.txt.
//
// Goroutines: per connection one reader and one writer. Per node the
// session keeper's heartbeat, one ping wheel, one NATS event dispatcher,
// one NATS status watcher. The store runs its reaper itself.
package node

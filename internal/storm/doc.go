// Package storm is a node's part in a reconnect storm, and the load
// tool's stand-in for it (cmd/presence-load): the join limiter that
// admits joins that claim a session at the store's pace and tells the
// ones it refuses when to come back (JoinLimiter), the appointments that
// hold a refused client to its hint (Appointments), the extender that
// keeps a refused client's session alive until its retry (Extender), and
// the gate that puts them together for a node (Gate).
//
// Every part takes the time as an argument (or, Extender.Run, from a
// ticker), so its tests script the clock.
package storm

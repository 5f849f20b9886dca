package main

import (
	"time"

	"github.com/nats-io/nats.go"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/global"
	"github.com/presence-dev/presence/node"
)

// The console's data on each kind of process: bus.Operations for its
// view, with a flapping detector fed from the view's transitions on
// NATS. Only with API keys: without them the console cannot log in, and
// the detector's subscription would cost for nothing.

// nodeOperations answers NodesSubject with the node's status and, with
// API keys, for the node's region, minting observer tokens when the node
// signs.
func (s *nodeServer) nodeOperations() (*bus.Operations, error) {
	// Every node answers for itself, keys or not: the aggregator's
	// console lists the nodes of every region.
	version := buildInfo()["version"]
	sub, err := bus.ServeNode(s.nc, s.cfg.Region, func() bus.NodeInfo { return nodeInfo(s.node.Status(), s.svcID, s.cfg.Region, version, s.nc) })
	if err != nil {
		return nil, err
	}
	s.onClose(func() { _ = sub.Unsubscribe() })
	if s.apiKeys.Len() == 0 {
		return nil, nil
	}
	region := s.cfg.Region
	ops := &bus.Operations{View: region, NATS: s.nc,
		Regions: func() []bus.RegionInfo { return []bus.RegionInfo{{Region: region, State: string(global.RegionLive)}} }}
	if s.node.CanSign() {
		ops.Mint = s.node.SignObserver
	}
	return ops, s.feedOn(s.nc, ops, region)
}

// feedOn makes the detector of ops and subscribes it to view's transitions.
func (c *cleanups) feedOn(nc *nats.Conn, ops *bus.Operations, view string) error {
	ops.Flapping = bus.NewFlapping(0, 0, nil)
	sub, err := bus.FeedFlapping(nc, view, ops.Flapping)
	if err != nil {
		return err
	}
	c.onClose(func() { _ = sub.Unsubscribe() })
	return nil
}

// nodeInfo is a node's status as NodesSubject answers it: degraded while
// NATS is not connected (an answer sent then waits for the reconnect).
func nodeInfo(st node.Status, id, region, version string, nc *nats.Conn) bus.NodeInfo {
	state := st.State
	if state == "ok" && !nc.IsConnected() {
		state = "degraded"
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	return bus.NodeInfo{ID: id, Region: region, Version: version, State: state,
		Connections: st.Connections, Sessions: st.Sessions, Rooms: st.Rooms,
		HeartbeatMS: ms(st.Heartbeat), HeartbeatBudgetMS: ms(st.HeartbeatBudget),
		JoinRate: st.Joins, JoinLimit: st.JoinLimit, Started: st.Started.UTC()}
}

// aggregatorOperations answers for the global view: the regions the
// aggregator knows, their nodes, and the flapping of the global
// transitions. An aggregator has no WebSocket: it mints no tokens.
func (c *aggregatorCommand) aggregatorOperations() (*bus.Operations, error) {
	if c.apiKeys.Len() == 0 {
		return nil, nil
	}
	ops := &bus.Operations{View: bus.GlobalRegion, NATS: c.nc, Regions: func() []bus.RegionInfo {
		var out []bus.RegionInfo
		for _, r := range c.agg.RegionStatuses() {
			ri := bus.RegionInfo{Region: r.Region, State: string(r.State)}
			if !r.Heard.IsZero() {
				h := r.Heard.UTC()
				ri.Heard = &h
			}
			out = append(out, ri)
		}
		return out
	}}
	return ops, c.feedOn(c.nc, ops, bus.GlobalRegion)
}

package bus

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
)

// A view's nodes are found over NATS: every node of a region answers a
// request on NodesSubject(region), each on its own (no queue group), and
// the asker gathers what comes within NodesWait.

// EndpointNodes is the nodes subject's last token.
const EndpointNodes = "nodes"

// NodesWait is how long GatherNodes waits for the nodes to answer.
const NodesWait = 500 * time.Millisecond

// MaxNodes bounds the nodes one gathering takes per region.
const MaxNodes = 1000

// NodesSubject is the subject every node of region answers with its
// NodeInfo.
func NodesSubject(region string) string { return APISubject(region, EndpointNodes) }

// NodeInfo is one node's status, as it reports it.
type NodeInfo struct {
	ID      string `json:"id"`
	Region  string `json:"region"`
	Version string `json:"version"`
	// State is starting, ok, degraded (NATS or the store down), draining
	// or closed.
	State       string `json:"state"`
	Connections int64  `json:"connections"`
	Sessions    int    `json:"sessions"`
	Rooms       int    `json:"rooms"`
	// HeartbeatMS is the slowest heartbeat batch of the last 10 to 20
	// seconds; HeartbeatBudgetMS the time between two batches, which a
	// slower one exceeds.
	HeartbeatMS       float64 `json:"heartbeat_ms"`
	HeartbeatBudgetMS float64 `json:"heartbeat_budget_ms"`
	// JoinRate is room joins per second over the last 10 to 20 seconds,
	// JoinLimit the join rate limiter's rate.
	JoinRate  float64   `json:"join_rate"`
	JoinLimit float64   `json:"join_limit"`
	Started   time.Time `json:"started"`
}

// NodesReply lists the nodes of a view's regions that answered, by
// region then id.
type NodesReply struct {
	Region string     `json:"region"`
	Nodes  []NodeInfo `json:"nodes"`
}

// ServeNode answers NodesSubject(region) with info() until the
// subscription is unsubscribed.
func ServeNode(nc *nats.Conn, region string, info func() NodeInfo) (*nats.Subscription, error) {
	if nc == nil || info == nil {
		return nil, errors.New("bus: nodes: a connection and an info func are required")
	}
	if err := ValidateRegion(region); err != nil {
		return nil, err
	}
	return nc.Subscribe(NodesSubject(region), func(m *nats.Msg) {
		if m.Reply == "" {
			return
		}
		b, err := json.Marshal(info())
		if err == nil {
			_ = m.Respond(b)
		}
	})
}

// GatherNodes asks every node of regions for its NodeInfo and returns
// those that answered within NodesWait (or before ctx is done). Answers
// that do not decode, name another region or repeat an id are dropped.
func GatherNodes(ctx context.Context, nc *nats.Conn, view string, regions []string) (NodesReply, error) {
	rep := NodesReply{Region: view, Nodes: []NodeInfo{}}
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return rep, &QueryError{Code: CodeInternal, Description: "nodes: " + err.Error()}
	}
	defer func() { _ = sub.Unsubscribe() }()
	for _, r := range regions {
		if err := nc.PublishRequest(NodesSubject(r), inbox, nil); err != nil {
			return rep, &QueryError{Code: CodeInternal, Description: "nodes: " + err.Error()}
		}
	}
	ctx, cancel := context.WithTimeout(ctx, NodesWait)
	defer cancel()
	seen, ids := map[string]int{}, map[string]bool{}
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			break // the wait is over
		}
		var n NodeInfo
		if json.Unmarshal(m.Data, &n) != nil || !slices.Contains(regions, n.Region) || seen[n.Region] >= MaxNodes || ids[n.ID] {
			continue // a node heard twice (two routes to it) counts once
		}
		seen[n.Region]++
		ids[n.ID] = true
		rep.Nodes = append(rep.Nodes, n)
	}
	slices.SortFunc(rep.Nodes, func(a, b NodeInfo) int { return cmp.Or(cmp.Compare(a.Region, b.Region), cmp.Compare(a.ID, b.ID)) })
	return rep, nil
}

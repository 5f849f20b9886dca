package node

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"

	"github.com/nats-io/nats.go"

	"github.com/presence-dev/presence/presence"
)

// A session id belongs to one node at a time, and the store says which:
// a join claims the session, taking it over from any other node. The
// node that lost it finds out on its next heartbeat (the store reports
// the session lost) and closes its stale connection with
// CloseSessionMoved. Without waiting for that, a node that took a
// session over says so on TakeoverSubject, and the others check at once.
// The message is only a hint: a node acts on what the store answers, so
// a forged or late hint costs one refresh and closes nothing.

// TakeoverSubject is where the nodes of a region say they took sessions
// over: presence-ctl.<region>.takeover.
func TakeoverSubject(region string) string { return "presence-ctl." + region + ".takeover" }

type takeoverMsg struct {
	Node    string `json:"node"`
	Room    string `json:"room"`
	User    string `json:"user"`
	Session string `json:"session"`
}

// newNodeID names this node instance on the takeover subject.
func newNodeID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// announceTaken tells the region's other nodes that this one took refs
// over. A lost message only delays the old node's close to its next
// heartbeat.
func (n *Node) announceTaken(refs []presence.SessionRef) {
	for _, r := range refs {
		b, _ := json.Marshal(takeoverMsg{Node: n.id, Room: r.Room, User: r.User, Session: r.Session})
		if err := n.cfg.NATS.Publish(TakeoverSubject(n.cfg.Region), b); err != nil {
			n.log.Debug("node: takeover announce failed", "err", err)
		}
	}
}

// onTakeover checks with the store whether a session another node says it
// took over is still held here; the scheduler closes its owners if not.
// Each check runs on its own goroutine: NATS delivers a subscription's
// messages one at a time, and a check waits for the store.
func (n *Node) onTakeover(m *nats.Msg) {
	var t takeoverMsg
	if json.Unmarshal(m.Data, &t) != nil || t.Node == n.id {
		return
	}
	r := presence.SessionRef{Room: t.Room, User: t.User, Session: t.Session}
	if r.Validate() != nil || !n.sched.holds(r) {
		return
	}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		ctx, cancel := context.WithTimeout(n.ctx, n.cfg.StoreTimeout)
		defer cancel()
		n.sched.verify(ctx, []presence.SessionRef{r})
	}()
}

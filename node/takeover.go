package node

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/presence-dev/presence/presence"
)

// A session id belongs to one node at a time, and the store says which:
// a join claims the session, taking it over from any other node. The
// node that lost it finds out on its next heartbeat (the store reports
// the session lost) and closes its stale connection with
// CloseSessionMoved. Without waiting for that, a node that took a
// session over says so on bus.TakeoverSubject, and the others check at once.
// The message is only a hint: a node acts on what the store answers, so
// a forged or late hint costs one refresh and closes nothing.

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

// takeovers says on bus.TakeoverSubject which sessions this node took over,
// and checks the sessions other nodes say they took.
type takeovers struct {
	id       string // this instance, on the takeover subject
	nc       *nats.Conn
	subject  string
	log      *slog.Logger
	sessions sessionChecker
	// ctx bounds the checks (the node's Close cancels it); wg counts them.
	ctx     context.Context
	timeout time.Duration
	wg      *sync.WaitGroup
	sub     *nats.Subscription
}

// sessionChecker is what the session keeper offers the takeover checks.
type sessionChecker interface {
	holds(r presence.SessionRef) bool
	verify(ctx context.Context, refs []presence.SessionRef)
}

var _ sessionChecker = (*sessionKeeper)(nil)

// subscribe starts listening to the other nodes.
func (t *takeovers) subscribe() error {
	sub, err := t.nc.Subscribe(t.subject, t.onMsg)
	if err != nil {
		return fmt.Errorf("node: subscribe %s: %w", t.subject, err)
	}
	t.sub = sub
	return nil
}

// close stops listening.
func (t *takeovers) close() {
	if t.sub != nil {
		_ = t.sub.Unsubscribe()
	}
}

// announce tells the region's other nodes that this one took refs
// over. A lost message only delays the old node's close to its next
// heartbeat.
func (t *takeovers) announce(refs []presence.SessionRef) {
	for _, r := range refs {
		b, _ := json.Marshal(takeoverMsg{Node: t.id, Room: r.Room, User: r.User, Session: r.Session})
		if err := t.nc.Publish(t.subject, b); err != nil {
			t.log.Debug("node: takeover announce failed", "err", err)
		}
	}
}

// onMsg checks with the store whether a session another node says it
// took over is still held here; the keeper closes its owners if not.
// Each check runs on its own goroutine: NATS delivers a subscription's
// messages one at a time, and a check waits for the store.
func (t *takeovers) onMsg(m *nats.Msg) {
	var msg takeoverMsg
	if json.Unmarshal(m.Data, &msg) != nil || msg.Node == t.id {
		return
	}
	r := presence.SessionRef{Room: msg.Room, User: msg.User, Session: msg.Session}
	if r.Validate() != nil || !t.sessions.holds(r) {
		return
	}
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		ctx, cancel := context.WithTimeout(t.ctx, t.timeout)
		defer cancel()
		t.sessions.verify(ctx, []presence.SessionRef{r})
	}()
}

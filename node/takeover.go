package node

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"sync"

	"github.com/nats-io/nats.go"
)

// A session id belongs to one connection at a time. When a client
// reconnects to another node before this one has noticed its old
// connection is dead (up to the pong timeout), this node would later
// release the session the other node now holds, and announce a departure
// that did not happen. So every node announces the sessions it accepts on
// TakeoverSubject, and a node holding the same session on an older
// connection closes it with CloseSessionMoved, keeping the session.

// TakeoverSubject is where the nodes of a region announce accepted
// sessions: presence-ctl.<region>.takeover.
func TakeoverSubject(region string) string { return "presence-ctl." + region + ".takeover" }

type takeoverMsg struct {
	Node    string `json:"node"`
	User    string `json:"user"`
	Session string `json:"session"`
}

type sessKey struct{ user, session string }

// sessions indexes this node's connections by (user, session).
type sessions struct {
	id string // this node's instance id
	mu sync.Mutex
	m  map[sessKey][]*conn
}

func newSessions() *sessions {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &sessions{id: hex.EncodeToString(b[:]), m: map[sessKey][]*conn{}}
}

func (s *sessions) add(c *conn) {
	k := sessKey{c.user, c.session}
	s.mu.Lock()
	s.m[k] = append(s.m[k], c)
	s.mu.Unlock()
}

func (s *sessions) remove(c *conn) {
	k := sessKey{c.user, c.session}
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.m[k]
	for i, x := range l {
		if x == c {
			l[i] = l[len(l)-1]
			l = l[:len(l)-1]
			break
		}
	}
	if len(l) == 0 {
		delete(s.m, k)
	} else {
		s.m[k] = l
	}
}

// announce tells the region's other nodes that this one now holds c's
// session. A lost message leaves the old race, nothing worse.
func (n *Node) announce(c *conn) {
	b, _ := json.Marshal(takeoverMsg{Node: n.sess.id, User: c.user, Session: c.session})
	if err := n.cfg.NATS.Publish(TakeoverSubject(n.cfg.Region), b); err != nil {
		n.log.Debug("node: takeover announce failed", "err", err)
	}
}

// onTakeover closes this node's connections of a session that another
// node has accepted since, keeping the session alive for it.
func (n *Node) onTakeover(m *nats.Msg) {
	var t takeoverMsg
	if json.Unmarshal(m.Data, &t) != nil || t.Node == n.sess.id {
		return
	}
	n.sess.mu.Lock()
	conns := append([]*conn(nil), n.sess.m[sessKey{t.User, t.Session}]...)
	n.sess.mu.Unlock()
	for _, c := range conns {
		n.metrics.rejectedConns.WithLabelValues("moved").Inc()
		c.shutdown(CloseSessionMoved, "session moved to another connection", true)
	}
}

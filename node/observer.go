package node

import (
	"errors"
	"time"
)

// ErrNoSigner is SignObserver's error when the node only verifies tokens (a public key or a JWKS),
// so it cannot sign one.
var ErrNoSigner = errors.New("node: no signing key: the node verifies tokens with a public key or a JWKS")

// CanSign reports whether SignObserver can sign: the node has an HS256
// secret, or is in dev mode.
func (n *Node) CanSign() bool { return n.signKey() != nil }

func (n *Node) signKey() []byte {
	if n.auth.devKey != nil {
		return n.auth.devKey
	}
	return n.cfg.Auth.HMACSecret
}

// SignObserver mints a token that lets user follow room unlisted (the
// observe claim) for ttl, which this node and every node sharing its
// secret accept: the console's live room view.
func (n *Node) SignObserver(user, room string, ttl time.Duration) (string, error) {
	key := n.signKey()
	if key == nil {
		return "", ErrNoSigner
	}
	g := Grant{User: user, Rooms: []string{room}, Observe: true, TTL: ttl,
		Issuer: n.cfg.Auth.Issuer, Audience: n.cfg.Auth.Audience}
	return g.Sign(key, time.Now())
}

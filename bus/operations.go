package bus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/presence-dev/presence/presence"
)

// Operations answers an operator's questions about one view (the HTTP
// API's operator endpoints, which the console calls): its regions, its
// nodes, its flapping, and a token to follow a room unlisted. Each
// answer has its one implementation here.
type Operations struct {
	// View is the view's region token, or GlobalRegion.
	View string
	// Regions lists the view's regions and their state (required).
	Regions func() []RegionInfo
	// NATS is where the nodes are asked (required).
	NATS *nats.Conn
	// Flapping is the view's detector (required).
	Flapping *Flapping
	// Mint signs a token for user that follows room unlisted (the observe
	// claim) for ttl; nil where no signing key is at hand (the
	// aggregator, a node that only verifies): the token endpoint then
	// answers 501.
	Mint func(user, room string, ttl time.Duration) (string, error)
}

// ObserverTTL is how long an observer token lives; the console asks for
// a new one at each connect.
const ObserverTTL = 5 * time.Minute

// RegionInfo is one region of a view and its state: live, down (held:
// not heard for a while, or out of sync) or dropped (its users gone).
// Heard is its last publication to the aggregator; a node leaves it out.
type RegionInfo struct {
	Region string     `json:"region"`
	State  string     `json:"state"`
	Heard  *time.Time `json:"heard,omitempty"`
}

// RegionsReply lists a view's regions, sorted. ObserverTokens says
// whether this server mints observer tokens (else that endpoint answers
// 501): whether a room can be followed live here.
type RegionsReply struct {
	Region         string       `json:"region"`
	Regions        []RegionInfo `json:"regions"`
	ObserverTokens bool         `json:"observer_tokens"`
}

// ObserverTokenRequest asks for a token to follow Room unlisted.
type ObserverTokenRequest struct {
	Room string `json:"room"`
}

// ObserverTokenReply is a token for the client library: User may follow
// Room with present false until Expires, at the node's WebSocket.
type ObserverTokenReply struct {
	Token     string    `json:"token"`
	User      string    `json:"user"`
	Room      string    `json:"room"`
	ExpiresAt time.Time `json:"expires_at"`
}

// Check reports what is missing.
func (o *Operations) Check() error {
	if o == nil || o.Regions == nil || o.NATS == nil || o.Flapping == nil {
		return errors.New("bus: operations: regions, NATS and a flapping detector are required")
	}
	return nil
}

// ListRegions answers the view's regions.
func (o *Operations) ListRegions(context.Context) (RegionsReply, error) {
	rs := o.Regions()
	if rs == nil {
		rs = []RegionInfo{}
	}
	return RegionsReply{Region: o.View, Regions: rs, ObserverTokens: o.Mint != nil}, nil
}

// Nodes gathers the nodes of the view's regions.
func (o *Operations) Nodes(ctx context.Context) (NodesReply, error) {
	var names []string
	for _, r := range o.Regions() {
		names = append(names, r.Region)
	}
	return GatherNodes(ctx, o.NATS, o.View, names)
}

// Flaps answers the view's flapping report.
func (o *Operations) Flaps(_ context.Context, req FlapRequest) (FlapReply, error) {
	return o.Flapping.Report(o.View, req)
}

// ObserverToken mints a token for the operator key named key to follow
// req.Room unlisted, as user "console-<key>" (the name cut to fit a user
// id).
func (o *Operations) ObserverToken(_ context.Context, key string, req ObserverTokenRequest) (ObserverTokenReply, error) {
	if o.Mint == nil {
		return ObserverTokenReply{}, &QueryError{Code: CodeNotImplemented,
			Description: "this server mints no tokens: an aggregator has no WebSocket, and a node needs --jwt-secret (or dev mode) to sign them"}
	}
	if err := presence.ValidateRoom(req.Room); err != nil {
		return ObserverTokenReply{}, badRequest("room: %v", err)
	}
	user := "console-" + key
	user = user[:min(len(user), presence.MaxUserLen)]
	if err := presence.ValidateUser(user); err != nil {
		return ObserverTokenReply{}, badRequest("key name: %v", err)
	}
	exp := time.Now().Add(ObserverTTL).Truncate(time.Second)
	tok, err := o.Mint(user, req.Room, ObserverTTL)
	if err != nil {
		return ObserverTokenReply{}, &QueryError{Code: CodeInternal, Description: fmt.Sprintf("signing the token: %v", err)}
	}
	return ObserverTokenReply{Token: tok, User: user, Room: req.Room, ExpiresAt: exp.UTC()}, nil
}

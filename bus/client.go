package bus

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/presence-dev/presence/presence"
)

// Client queries a region's query service (or, with GlobalRegion, the
// cross-region view's) on presence-api.<region>.*. Its Snapshot has the
// signature of the regional store's, so what takes a store's snapshots
// can take a Client's.
type Client struct {
	nc     *nats.Conn
	region string
}

// NewClient returns a Client of region's query service on nc.
func NewClient(nc *nats.Conn, region string) *Client { return &Client{nc: nc, region: region} }

func (c *Client) request(ctx context.Context, endpoint string, req, out any) error {
	return c.requestOn(ctx, APISubject(c.region, endpoint), req, out)
}

// requestOn sends req on subject and decodes the reply into out; an error
// reply is a *QueryError.
func (c *Client) requestOn(ctx context.Context, subject string, req, out any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultRequestTimeout)
		defer cancel()
	}
	m, err := c.nc.RequestWithContext(ctx, subject, body)
	if err != nil {
		return fmt.Errorf("bus: query %s: %w", subject, err)
	}
	if code := m.Header.Get(micro.ErrorCodeHeader); code != "" {
		return &QueryError{Code: code, Description: m.Header.Get(micro.ErrorHeader)}
	}
	if err := json.Unmarshal(m.Data, out); err != nil {
		return fmt.Errorf("bus: query %s: reply: %w", subject, err)
	}
	return nil
}

// Snapshot returns one page of a room's members: the snapshot that
// snapshot + replay starts from (see Replay).
func (c *Client) Snapshot(ctx context.Context, room string, offset, limit int) (presence.Snapshot, error) {
	var snap presence.Snapshot
	err := c.request(ctx, EndpointMembers, MembersRequest{Room: room, Offset: offset, Limit: limit}, &snap)
	return snap, err
}

// Count returns a room's number of members.
func (c *Client) Count(ctx context.Context, room string) (int, error) {
	var rep CountReply
	err := c.request(ctx, EndpointCount, CountRequest{Room: room}, &rep)
	return rep.Count, err
}

// User returns one user's presence in a room.
func (c *Client) User(ctx context.Context, room, user string) (UserReply, error) {
	var rep UserReply
	err := c.request(ctx, EndpointUser, UserRequest{Room: room, User: user}, &rep)
	return rep, err
}

// LastSeen returns when a user was last active in the region, in any room.
func (c *Client) LastSeen(ctx context.Context, user string) (LastSeenReply, error) {
	var rep LastSeenReply
	err := c.request(ctx, EndpointLastSeen, LastSeenRequest{User: user}, &rep)
	return rep, err
}

// Disconnect asks the region to disconnect a user (see DisconnectRequest).
func (c *Client) Disconnect(ctx context.Context, req DisconnectRequest) (DisconnectReply, error) {
	var rep DisconnectReply
	err := c.requestOn(ctx, DisconnectSubject(c.region), req, &rep)
	return rep, err
}

package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/presence-dev/presence/presence"
)

// Disconnecting a user: a request on DisconnectSubject, served by one node
// of the region (the micro service's queue group), records the
// revocation, if any, in the region's store, then tells every node of the
// region on DropSubject. Each node closes the user's connections and
// keeps the revocation; nodes also read the store's revocations
// periodically, so one that missed the message, or started later, acts
// on them all the same.

// EndpointDisconnect is the disconnect endpoint's name; its subject is
// DisconnectSubject(region), a control subject: readers, who may query,
// may not disconnect.
const EndpointDisconnect = "disconnect"

// DisconnectSubject is where region's disconnect requests go (the global
// view's too, with GlobalRegion).
func DisconnectSubject(region string) string {
	return CtlRoot + "." + region + "." + EndpointDisconnect
}

// DropSubject is where a region's nodes are told to close a user's
// connections.
func DropSubject(region string) string { return CtlRoot + "." + region + ".drop" }

// DisconnectRequest asks to close a user's connections: in Room, or with
// Room empty in every room. RevokeUntil, when set, also refuses the
// user's joins of that room (or, for every room, their connections)
// until then, on every node of the region.
type DisconnectRequest struct {
	User        string     `json:"user"`
	Room        string     `json:"room,omitempty"`
	RevokeUntil *time.Time `json:"revoke_until,omitempty"`
}

// Check validates the request at now: the ids, and a revocation that ends
// after now and within presence.MaxRevocation. Every Disconnecter calls
// it first; its error is a *QueryError.
func (r DisconnectRequest) Check(now time.Time) error {
	if e := r.check(now); e != nil {
		return e
	}
	return nil
}

func (r DisconnectRequest) check(now time.Time) *QueryError {
	err := presence.ValidateUser(r.User)
	if r.Room != "" {
		err = errors.Join(err, presence.ValidateRoom(r.Room))
	}
	if err != nil {
		return idErrors(err)
	}
	if r.RevokeUntil != nil {
		if err := r.revocation().Validate(now); err != nil {
			return badRequest("revoke_until: %v", err)
		}
	}
	return nil
}

func (r DisconnectRequest) revocation() presence.Revocation {
	return presence.Revocation{User: r.User, Room: r.Room, Until: *r.RevokeUntil}
}

// DisconnectReply answers a DisconnectRequest. RevokedUntil is the
// revocation recorded, nil if none. Regions (the global view only) says
// how each region took the request.
type DisconnectReply struct {
	Region       string         `json:"region"`
	User         string         `json:"user"`
	Room         string         `json:"room,omitempty"`
	RevokedUntil *time.Time     `json:"revoked_until"`
	Regions      []RegionResult `json:"regions,omitempty"`
}

// RegionResult is one region's outcome of a global request: Error is nil
// where it succeeded.
type RegionResult struct {
	Region string      `json:"region"`
	Error  *ErrorReply `json:"error,omitempty"`
}

// Disconnecter disconnects users; errors are *QueryError.
type Disconnecter interface {
	Disconnect(ctx context.Context, req DisconnectRequest) (DisconnectReply, error)
}

// Revoker records revocations; *region.Store is one.
type Revoker interface {
	Revoke(ctx context.Context, r presence.Revocation) error
}

// Drop is what the nodes of a region are told on DropSubject: close the
// user's connections (in Room, or all of them) and, with Until, refuse
// them until then.
type Drop struct {
	User  string     `json:"user"`
	Room  string     `json:"room,omitempty"`
	Until *time.Time `json:"until,omitempty"`
}

// RegionDisconnect is a region's Disconnecter: it writes revocations to
// the region's store and tells the region's nodes.
type RegionDisconnect struct {
	region string
	nc     *nats.Conn
	rv     Revoker
	now    func() time.Time
	serviceOpts
}

// NewRegionDisconnect returns region's Disconnecter.
func NewRegionDisconnect(nc *nats.Conn, region string, rv Revoker, opts ...ServiceOption) (*RegionDisconnect, error) {
	if nc == nil || rv == nil {
		return nil, errors.New("bus: disconnect: connection and revoker are required")
	}
	if err := ValidateRegion(region); err != nil {
		return nil, fmt.Errorf("bus: disconnect: %w", err)
	}
	o := serviceOpts{timeout: DefaultRequestTimeout, log: slog.Default()}
	for _, f := range opts {
		f(&o)
	}
	return &RegionDisconnect{region: region, nc: nc, rv: rv, now: time.Now, serviceOpts: o}, nil
}

// Disconnect records the revocation (first: a node that misses the drop
// still finds it in the store), then tells every node of the region.
func (d *RegionDisconnect) Disconnect(ctx context.Context, req DisconnectRequest) (DisconnectReply, error) {
	return answer(&d.serviceOpts, ctx, EndpointDisconnect, req, d.disconnect)
}

func (d *RegionDisconnect) disconnect(ctx context.Context, req DisconnectRequest) (DisconnectReply, *QueryError) {
	if err := req.check(d.now()); err != nil {
		return DisconnectReply{}, err
	}
	rep := DisconnectReply{Region: d.region, User: req.User, Room: req.Room}
	drop := Drop{User: req.User, Room: req.Room}
	if req.RevokeUntil != nil {
		until := req.RevokeUntil.UTC()
		if err := d.rv.Revoke(ctx, req.revocation()); err != nil {
			return DisconnectReply{}, backendError(&d.serviceOpts, ctx, d.region, "revoke", err)
		}
		rep.RevokedUntil, drop.Until = &until, &until
	}
	body, _ := json.Marshal(drop)
	if err := d.nc.Publish(DropSubject(d.region), body); err == nil {
		err = d.nc.FlushWithContext(ctx)
		if err == nil {
			return rep, nil
		}
	}
	// The revocation, if any, is recorded: nodes find it on their next
	// read. Without one nothing happened; the caller may retry.
	return DisconnectReply{}, &QueryError{Code: CodeUnavailable, Description: "disconnect: the region's nodes could not be told (NATS); a revocation is recorded and taken up on their next read"}
}

// SubscribeDrops calls fn with every valid Drop sent to region's nodes,
// one at a time; malformed messages are dropped.
func SubscribeDrops(nc *nats.Conn, region string, fn func(Drop)) (*nats.Subscription, error) {
	return nc.Subscribe(DropSubject(region), func(m *nats.Msg) {
		var d Drop
		if json.Unmarshal(m.Data, &d) != nil || presence.ValidateUser(d.User) != nil || (d.Room != "" && presence.ValidateRoom(d.Room) != nil) {
			return
		}
		fn(d)
	})
}

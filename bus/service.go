package bus

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/presence-dev/presence/presence"
)

// Version is the query service's version, announced on $SRV.INFO. micro
// requires semantic versioning; a build may set it with -ldflags -X.
var Version = "0.1.0"

// ServiceName is the micro service name every region's query service uses.
const ServiceName = "presence"

// Query service endpoint names; the subject of each is
// APISubject(region, name).
const (
	EndpointMembers = "members"
	EndpointCount   = "count"
	EndpointUser    = "user"
)

// Page limits of the members endpoint.
const (
	DefaultLimit = 100
	MaxLimit     = 1000
)

// DefaultRequestTimeout bounds one query's backend reads.
const DefaultRequestTimeout = 5 * time.Second

// Error codes of the query service, in the Nats-Service-Error-Code header.
const (
	CodeBadRequest = "400" // the request is malformed; nothing was read
	CodeInternal   = "500" // the backend failed or timed out
)

// Reader is what the query service reads presence from; *region.Store
// satisfies it.
type Reader interface {
	Snapshot(ctx context.Context, room string, offset, limit int) (presence.Snapshot, error)
	Count(ctx context.Context, room string) (int, error)
	Sessions(ctx context.Context, room, user string) (presence.Member, bool, error)
	LastSeen(ctx context.Context, user string) (time.Time, bool, error)
}

// MembersRequest asks for one page of a room's members. Limit 0 means
// DefaultLimit.
type MembersRequest struct {
	Room   string `json:"room"`
	Offset int    `json:"offset"`
	Limit  int    `json:"limit"`
}

// CountRequest asks for a room's number of members.
type CountRequest struct {
	Room string `json:"room"`
}

// CountReply answers a CountRequest.
type CountReply struct {
	Region string `json:"region"`
	Room   string `json:"room"`
	Count  int    `json:"count"`
}

// UserRequest asks for one user's presence in a room.
type UserRequest struct {
	Room string `json:"room"`
	User string `json:"user"`
}

// UserReply answers a UserRequest. Online is true while the user is a
// member of the room, including inside the offline grace (Member then has
// no sessions). LastSeen is the user's last activity in the region, in
// any room.
type UserReply struct {
	Region   string           `json:"region"`
	Room     string           `json:"room"`
	User     string           `json:"user"`
	Online   bool             `json:"online"`
	Member   *presence.Member `json:"member"`
	LastSeen *time.Time       `json:"last_seen"`
	// Regions lists the regions where the user is present; only the
	// global view (a Reader that is a RegionLister) fills it.
	Regions []string `json:"regions,omitempty"`
}

// RegionLister is implemented by a Reader that knows which regions hold a
// user: the cross-region aggregator.
type RegionLister interface {
	Regions(room, user string) []string
}

// ErrorReply is the body of an error response; the same code and
// description are in the micro error headers.
type ErrorReply struct {
	Code  string `json:"code"`
	Error string `json:"error"`
}

// ServiceOption configures StartService.
type ServiceOption func(*serviceOpts)

type serviceOpts struct {
	timeout time.Duration
	log     *slog.Logger
}

// WithRequestTimeout bounds each request's backend reads (default
// DefaultRequestTimeout). Non-positive values are ignored.
func WithRequestTimeout(d time.Duration) ServiceOption {
	return func(o *serviceOpts) {
		if d > 0 {
			o.timeout = d
		}
	}
}

// WithLogger sets where backend errors are logged (default slog.Default).
// Replies carry only a short description of them.
func WithLogger(l *slog.Logger) ServiceOption {
	return func(o *serviceOpts) {
		if l != nil {
			o.log = l
		}
	}
}

// StartService adds the query service for region (or GlobalRegion, for
// the cross-region view) to nc: micro service ServiceName, discoverable
// with $SRV.PING / nats micro ls, with endpoints members, count and user
// on APISubject(region, name). Instances share a queue group, so any
// number may serve one region. Stop the returned service to remove it.
func StartService(nc *nats.Conn, region string, r Reader, opts ...ServiceOption) (micro.Service, error) {
	if nc == nil || r == nil {
		return nil, errors.New("bus: service: connection and reader are required")
	}
	if region != GlobalRegion {
		if err := ValidateRegion(region); err != nil {
			return nil, fmt.Errorf("bus: service: %w", err)
		}
	}
	o := serviceOpts{timeout: DefaultRequestTimeout, log: slog.Default()}
	for _, f := range opts {
		f(&o)
	}
	h := &handler{region: region, r: r, serviceOpts: o}
	svc, err := micro.AddService(nc, micro.Config{
		Name:        ServiceName,
		Version:     Version,
		Description: "presence queries for region " + region,
		Metadata:    map[string]string{"region": region},
	})
	if err != nil {
		return nil, fmt.Errorf("bus: service: %w", err)
	}
	for _, ep := range []struct {
		name string
		fn   func(context.Context, []byte) (any, *apiError)
	}{
		{EndpointMembers, h.members},
		{EndpointCount, h.count},
		{EndpointUser, h.user},
	} {
		err := svc.AddEndpoint(ep.name, h.wrap(ep.name, ep.fn),
			micro.WithEndpointSubject(APISubject(region, ep.name)),
			micro.WithEndpointMetadata(map[string]string{"region": region}))
		if err != nil {
			_ = svc.Stop()
			return nil, fmt.Errorf("bus: service: endpoint %s: %w", ep.name, err)
		}
	}
	return svc, nil
}

type apiError struct {
	code, desc string
}

func badRequest(format string, a ...any) *apiError {
	return &apiError{CodeBadRequest, fmt.Sprintf(format, a...)}
}

type handler struct {
	region string
	r      Reader
	serviceOpts
}

// wrap turns an endpoint function into a micro handler: it bounds the
// request's time, recovers from a panic in the backend, and answers with
// JSON or a micro error.
func (h *handler) wrap(name string, fn func(context.Context, []byte) (any, *apiError)) micro.HandlerFunc {
	return func(req micro.Request) {
		ctx, cancel := context.WithTimeout(context.Background(), h.timeout)
		defer cancel()
		var (
			out  any
			aerr *apiError
		)
		func() {
			defer func() {
				if p := recover(); p != nil {
					h.log.Error("presence: query panicked", "endpoint", name, "panic", p)
					out, aerr = nil, &apiError{CodeInternal, "internal error"}
				}
			}()
			out, aerr = fn(ctx, req.Data())
		}()
		if aerr == nil {
			body, err := json.Marshal(out)
			if err == nil {
				_ = req.Respond(body)
				return
			}
			h.log.Error("presence: query reply not encodable", "endpoint", name, "err", err)
			aerr = &apiError{CodeInternal, "internal error: reply not encodable"}
		}
		// Headers are one line each.
		desc := strings.NewReplacer("\r", " ", "\n", " ").Replace(aerr.desc)
		body, _ := json.Marshal(ErrorReply{Code: aerr.code, Error: desc})
		_ = req.Error(aerr.code, desc, body)
	}
}

// decode reads exactly one JSON object with no unknown fields.
func decode(data []byte, v any, want string) *apiError {
	if len(bytes.TrimSpace(data)) == 0 {
		return badRequest("empty request, want %s", want)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return badRequest("bad request JSON (want %s): %v", want, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return badRequest("bad request JSON (want %s): data after the object", want)
	}
	return nil
}

// backend turns a Reader error into a 500, logging the detail.
func (h *handler) backend(ctx context.Context, op string, err error) *apiError {
	h.log.Error("presence: query failed", "region", h.region, "op", op, "err", err)
	if errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
		return &apiError{CodeInternal, fmt.Sprintf("%s: backend timed out after %v", op, h.timeout)}
	}
	return &apiError{CodeInternal, op + ": backend error"}
}

func (h *handler) members(ctx context.Context, data []byte) (any, *apiError) {
	var q MembersRequest
	if e := decode(data, &q, `{"room":"r","offset":0,"limit":100}`); e != nil {
		return nil, e
	}
	if err := presence.ValidateRoom(q.Room); err != nil {
		return nil, badRequest("%v", err)
	}
	if q.Offset < 0 {
		return nil, badRequest("offset must be >= 0, got %d", q.Offset)
	}
	if q.Limit == 0 {
		q.Limit = DefaultLimit
	}
	if q.Limit < 0 || q.Limit > MaxLimit {
		return nil, badRequest("limit must be between 1 and %d, got %d", MaxLimit, q.Limit)
	}
	snap, err := h.r.Snapshot(ctx, q.Room, q.Offset, q.Limit)
	if err != nil {
		return nil, h.backend(ctx, "members", err)
	}
	snap.At = snap.At.UTC()
	if snap.Members == nil {
		snap.Members = []presence.Member{}
	}
	for i := range snap.Members {
		utcMember(&snap.Members[i])
	}
	return snap, nil
}

func (h *handler) count(ctx context.Context, data []byte) (any, *apiError) {
	var q CountRequest
	if e := decode(data, &q, `{"room":"r"}`); e != nil {
		return nil, e
	}
	if err := presence.ValidateRoom(q.Room); err != nil {
		return nil, badRequest("%v", err)
	}
	n, err := h.r.Count(ctx, q.Room)
	if err != nil {
		return nil, h.backend(ctx, "count", err)
	}
	return CountReply{Region: h.region, Room: q.Room, Count: n}, nil
}

func (h *handler) user(ctx context.Context, data []byte) (any, *apiError) {
	var q UserRequest
	if e := decode(data, &q, `{"room":"r","user":"u"}`); e != nil {
		return nil, e
	}
	if err := errors.Join(presence.ValidateRoom(q.Room), presence.ValidateUser(q.User)); err != nil {
		return nil, badRequest("%s", strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	m, ok, err := h.r.Sessions(ctx, q.Room, q.User)
	if err != nil {
		return nil, h.backend(ctx, "user", err)
	}
	seen, seenOK, err := h.r.LastSeen(ctx, q.User)
	if err != nil {
		return nil, h.backend(ctx, "last seen", err)
	}
	rep := UserReply{Region: h.region, Room: q.Room, User: q.User, Online: ok}
	if rl, isGlobal := h.r.(RegionLister); isGlobal {
		rep.Regions = rl.Regions(q.Room, q.User)
	}
	if ok {
		utcMember(&m)
		rep.Member = &m
	}
	if seenOK {
		seen = seen.UTC()
		rep.LastSeen = &seen
	}
	return rep, nil
}

// utcMember makes a member's times UTC, so replies do not depend on the
// server's time zone, and its sessions a list, never null.
func utcMember(m *presence.Member) {
	m.Until = m.Until.UTC()
	if m.Sessions == nil {
		m.Sessions = []presence.SessionInfo{}
	}
	for i := range m.Sessions {
		m.Sessions[i].Expires = m.Sessions[i].Expires.UTC()
	}
}

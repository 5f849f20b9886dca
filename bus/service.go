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
)

// Version is the query service's version, announced on $SRV.INFO. micro
// requires semantic versioning; a build may set it with -ldflags -X.
var Version = "0.1.0"

// ServiceName is the micro service name every region's query service uses.
const ServiceName = "presence"

// ServiceOption configures StartService, NewQuery and NewRegionDisconnect.
type ServiceOption func(*serviceOpts)

type serviceOpts struct {
	timeout    time.Duration
	log        *slog.Logger
	disconnect Disconnecter
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

// WithDisconnect adds the disconnect endpoint, served by d, on
// DisconnectSubject(region) (StartService only).
func WithDisconnect(d Disconnecter) ServiceOption {
	return func(o *serviceOpts) { o.disconnect = d }
}

// StartService adds the query service for region (or GlobalRegion, for
// the cross-region view) to nc: micro service ServiceName, discoverable
// with $SRV.PING / nats micro ls, with endpoints members, count, user,
// last_seen, rooms and counts on APISubject(region, name), answered by a
// Query on r, and with WithDisconnect the disconnect endpoint.
// Instances share a queue group, so any number may serve one region.
// Stop the returned service to remove it.
func StartService(nc *nats.Conn, region string, r Reader, opts ...ServiceOption) (micro.Service, error) {
	if nc == nil || r == nil {
		return nil, errors.New("bus: service: connection and reader are required")
	}
	q, err := NewQuery(region, r, opts...)
	if err != nil {
		return nil, fmt.Errorf("bus: service: %w", err)
	}
	svc, err := micro.AddService(nc, micro.Config{
		Name:        ServiceName,
		Version:     Version,
		Description: "presence queries for region " + region,
		Metadata:    map[string]string{"region": region},
	})
	if err != nil {
		return nil, fmt.Errorf("bus: service: %w", err)
	}
	type ep struct {
		name, subject string
		h             micro.HandlerFunc
	}
	api := func(name string) string { return APISubject(region, name) }
	eps := []ep{
		{EndpointMembers, api(EndpointMembers), handle(q.log, EndpointMembers, q.Members, `{"room":"r","offset":0,"limit":100}`)},
		{EndpointCount, api(EndpointCount), handle(q.log, EndpointCount, q.Count, `{"room":"r"}`)},
		{EndpointUser, api(EndpointUser), handle(q.log, EndpointUser, q.User, `{"room":"r","user":"u"}`)},
		{EndpointLastSeen, api(EndpointLastSeen), handle(q.log, EndpointLastSeen, q.LastSeen, `{"user":"u"}`)},
		{EndpointRooms, api(EndpointRooms), handle(q.log, EndpointRooms, q.Rooms, `{"prefix":"","cursor":"","limit":100}`)},
		{EndpointCounts, api(EndpointCounts), handle(q.log, EndpointCounts, q.Counts, `{"rooms":["r1","r2"]}`)},
	}
	if d := q.disconnect; d != nil {
		eps = append(eps, ep{EndpointDisconnect, DisconnectSubject(region),
			handle(q.log, EndpointDisconnect, d.Disconnect, `{"user":"u","room":"r","revoke_until":"2026-01-02T15:04:05Z"}`)})
	}
	for _, e := range eps {
		err := svc.AddEndpoint(e.name, e.h,
			micro.WithEndpointSubject(e.subject),
			micro.WithEndpointMetadata(map[string]string{"region": region}))
		if err != nil {
			_ = svc.Stop()
			return nil, fmt.Errorf("bus: service: endpoint %s: %w", e.name, err)
		}
	}
	return svc, nil
}

// handle maps one endpoint onto micro: the request JSON decoded into
// Req, the answer of fn encoded, or a micro error. fn bounds its own time
// and recovers from its backend's panics (Query, RegionDisconnect).
func handle[Req, Rep any](log *slog.Logger, name string, fn func(context.Context, Req) (Rep, error), want string) micro.HandlerFunc {
	return func(req micro.Request) {
		var q Req
		if qe := decode(req.Data(), &q, want); qe != nil {
			respondError(req, qe)
			return
		}
		out, err := fn(context.Background(), q)
		if err != nil {
			respondError(req, AsQueryError(err))
			return
		}
		body, err := json.Marshal(out)
		if err != nil {
			log.Error("presence: query reply not encodable", "endpoint", name, "err", err)
			respondError(req, &QueryError{Code: CodeInternal, Description: "internal error: reply not encodable"})
			return
		}
		_ = req.Respond(body)
	}
}

// AsQueryError returns err's *QueryError, or a 500 for any other error.
func AsQueryError(err error) *QueryError {
	var qe *QueryError
	if errors.As(err, &qe) {
		return qe
	}
	return &QueryError{Code: CodeInternal, Description: "internal error"}
}

// respondError answers with a micro error: the code and description in
// the headers (one line each) and as an ErrorReply body.
func respondError(req micro.Request, qe *QueryError) {
	desc := strings.NewReplacer("\r", " ", "\n", " ").Replace(qe.Description)
	body, _ := json.Marshal(ErrorReply{Code: qe.Code, Error: desc})
	_ = req.Error(qe.Code, desc, body)
}

// decode reads exactly one JSON object with no unknown fields.
func decode(data []byte, v any, want string) *QueryError {
	if len(bytes.TrimSpace(data)) == 0 {
		return badRequest("empty request, want %s", want)
	}
	if err := DecodeStrict(data, v); err != nil {
		return badRequest("bad request JSON (want %s): %v", want, err)
	}
	return nil
}

// DecodeStrict decodes exactly one JSON value into v, refusing unknown
// fields and anything after the value: the query service's rule for a
// request body, which the HTTP API shares.
func DecodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the object")
	}
	return nil
}

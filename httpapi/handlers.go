package httpapi

import (
	"bytes"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/presence-dev/presence/bus"
)

// The handlers only map HTTP onto the bus's requests: path values and
// query parameters into a request struct, which the Query (or the
// Disconnecter) validates and answers. What they refuse themselves is
// what HTTP adds: unknown or repeated query parameters, numbers that are
// not numbers, bodies that are not the documented JSON.

type handlers struct {
	q *bus.Query
	d bus.Disconnecter
	o *bus.Operations
}

func (a *API) handlers() *handlers {
	return &handlers{q: a.cfg.Query, d: a.cfg.Disconnect, o: a.cfg.Ops}
}

// params reads the query parameters, each at most once and all of them
// among names.
func params(r *http.Request, names ...string) (url.Values, error) {
	v, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, badRequest("query string: %v", err)
	}
	for name, vs := range v {
		known := false
		for _, n := range names {
			known = known || n == name
		}
		if !known {
			return nil, badRequest("unknown query parameter %q (this endpoint takes %v)", cut(name), names)
		}
		if len(vs) > 1 {
			return nil, badRequest("query parameter %q given %d times", name, len(vs))
		}
	}
	return v, nil
}

// intParam reads an integer parameter, 0 when absent.
func intParam(v url.Values, name string) (int, error) {
	s := v.Get(name)
	if s == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, badRequest("%s must be an integer, got %q", name, cut(s))
	}
	return n, nil
}

func badRequest(format string, a ...any) *bus.QueryError {
	return &bus.QueryError{Code: bus.CodeBadRequest, Description: fmt.Sprintf(format, a...)}
}

func (h *handlers) members(r *http.Request, _ []byte) (any, error) {
	v, err := params(r, "offset", "limit")
	if err != nil {
		return nil, err
	}
	offset, err := intParam(v, "offset")
	if err != nil {
		return nil, err
	}
	limit, err := intParam(v, "limit")
	if err != nil {
		return nil, err
	}
	return h.q.Members(r.Context(), bus.MembersRequest{Room: r.PathValue("room"), Offset: offset, Limit: limit})
}

func (h *handlers) count(r *http.Request, _ []byte) (any, error) {
	if _, err := params(r); err != nil {
		return nil, err
	}
	return h.q.Count(r.Context(), bus.CountRequest{Room: r.PathValue("room")})
}

func (h *handlers) user(r *http.Request, _ []byte) (any, error) {
	if _, err := params(r); err != nil {
		return nil, err
	}
	return h.q.User(r.Context(), bus.UserRequest{Room: r.PathValue("room"), User: r.PathValue("user")})
}

func (h *handlers) lastSeen(r *http.Request, _ []byte) (any, error) {
	if _, err := params(r); err != nil {
		return nil, err
	}
	return h.q.LastSeen(r.Context(), bus.LastSeenRequest{User: r.PathValue("user")})
}

func (h *handlers) rooms(r *http.Request, _ []byte) (any, error) {
	v, err := params(r, "prefix", "cursor", "limit")
	if err != nil {
		return nil, err
	}
	limit, err := intParam(v, "limit")
	if err != nil {
		return nil, err
	}
	return h.q.Rooms(r.Context(), bus.RoomsRequest{Prefix: v.Get("prefix"), Cursor: v.Get("cursor"), Limit: limit})
}

func (h *handlers) batchCount(r *http.Request, body []byte) (any, error) {
	if _, err := params(r); err != nil {
		return nil, err
	}
	var req bus.CountsRequest
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, badRequest(`empty body, want {"rooms":["room42","lobby"]}`)
	}
	if err := bus.DecodeStrict(body, &req); err != nil {
		return nil, badRequest(`bad request JSON (want {"rooms":["room42","lobby"]}): %v`, err)
	}
	return h.q.Counts(r.Context(), req)
}

// disconnectBody is the optional body of the disconnect endpoints.
type disconnectBody struct {
	RevokeUntil *time.Time `json:"revoke_until"`
}

func (h *handlers) disconnectRoom(r *http.Request, body []byte) (any, error) {
	return h.disconnect(r, body, r.PathValue("room"))
}

func (h *handlers) disconnectUser(r *http.Request, body []byte) (any, error) {
	return h.disconnect(r, body, "")
}

func (h *handlers) disconnect(r *http.Request, body []byte, room string) (any, error) {
	if _, err := params(r); err != nil {
		return nil, err
	}
	var b disconnectBody
	if len(bytes.TrimSpace(body)) > 0 {
		if err := bus.DecodeStrict(body, &b); err != nil {
			return nil, badRequest(`bad request JSON (want nothing, or {"revoke_until":"2026-01-02T15:04:05Z"}): %v`, err)
		}
	}
	return h.d.Disconnect(r.Context(), bus.DisconnectRequest{User: r.PathValue("user"), Room: room, RevokeUntil: b.RevokeUntil})
}

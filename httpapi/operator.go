package httpapi

import (
	"bytes"
	"context"
	"net/http"

	"github.com/presence-dev/presence/bus"
)

// The operator endpoints, admin scope: what the console shows (the
// view's regions, its nodes, its flapping) and the token it follows a
// room with. bus.Operations answers them; without one (Config.Ops nil)
// they answer 404.

// keyCtx carries the request's key to the handlers.
type keyCtx struct{}

func withKey(r *http.Request, k Key) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), keyCtx{}, k))
}

func keyOf(r *http.Request) Key {
	k, _ := r.Context().Value(keyCtx{}).(Key)
	return k
}

// ops returns the operations, or a 404 where none are served.
func (h *handlers) ops() (*bus.Operations, error) {
	if h.o == nil {
		return nil, &bus.QueryError{Code: bus.CodeNotFound, Description: "this server answers no operator endpoints"}
	}
	return h.o, nil
}

func (h *handlers) regions(r *http.Request, _ []byte) (any, error) {
	o, err := h.ops()
	if err != nil {
		return nil, err
	}
	if _, err := params(r); err != nil {
		return nil, err
	}
	return o.ListRegions(r.Context())
}

func (h *handlers) nodes(r *http.Request, _ []byte) (any, error) {
	o, err := h.ops()
	if err != nil {
		return nil, err
	}
	if _, err := params(r); err != nil {
		return nil, err
	}
	return o.Nodes(r.Context())
}

func (h *handlers) flapping(r *http.Request, _ []byte) (any, error) {
	o, err := h.ops()
	if err != nil {
		return nil, err
	}
	v, err := params(r, "room", "limit")
	if err != nil {
		return nil, err
	}
	limit, err := intParam(v, "limit")
	if err != nil {
		return nil, err
	}
	return o.Flaps(r.Context(), bus.FlapRequest{Room: v.Get("room"), Limit: limit})
}

func (h *handlers) observerToken(r *http.Request, body []byte) (any, error) {
	o, err := h.ops()
	if err != nil {
		return nil, err
	}
	if _, err := params(r); err != nil {
		return nil, err
	}
	var req bus.ObserverTokenRequest
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, badRequest(`empty body, want {"room":"lobby"}`)
	}
	if err := bus.DecodeStrict(body, &req); err != nil {
		return nil, badRequest(`bad request JSON (want {"room":"lobby"}): %v`, err)
	}
	return o.ObserverToken(r.Context(), keyOf(r).Name, req)
}

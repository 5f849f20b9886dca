package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/docs"
)

// Defaults of Config.
const (
	DefaultRate         = 50 // requests per second per key
	DefaultBurst        = 100
	DefaultMaxBodyBytes = 64 << 10
	DefaultReadTimeout  = 10 * time.Second
	DefaultWriteTimeout = 10 * time.Second
)

// PathOpenAPI serves the OpenAPI document, without a key.
const PathOpenAPI = "/v1/openapi.yaml"

// Config configures an API.
type Config struct {
	// Query answers the queries (required): the region's, or the global
	// view's.
	Query *bus.Query
	// Disconnect carries out the disconnect endpoints (required).
	Disconnect bus.Disconnecter
	// Ops answers the operator endpoints (regions, nodes, flapping,
	// observer tokens); nil: they answer 404.
	Ops *bus.Operations
	// Keys are the API keys; with none in force every endpoint but the
	// OpenAPI document answers 404, the API being off.
	Keys *Keys
	// Rate and Burst are each key's token bucket, in requests per
	// second. Defaults DefaultRate and DefaultBurst; a negative Rate: no
	// limit.
	Rate  float64
	Burst int
	// CORSOrigins are the origins browsers may call the API from (exact
	// Origin values, or "*"); none: no CORS headers at all.
	CORSOrigins []string
	// MaxBodyBytes bounds a request body (413 past it). Default 64 KiB.
	MaxBodyBytes int64
	// ReadTimeout bounds reading a request's body, WriteTimeout writing
	// its response (the server's own timeouts bound the headers).
	// Defaults 10s each.
	ReadTimeout, WriteTimeout time.Duration
	Logger                    *slog.Logger

	now func() time.Time // tests script the rate limits' clock
}

// API is the HTTP server API of one view; its Handler serves every
// endpoint of docs/openapi.yaml.
type API struct {
	cfg  Config
	lim  *limiters
	mux  *http.ServeMux
	log  *slog.Logger
	view string // the region token, in logs
}

// New checks cfg and returns the API.
func New(cfg Config) (*API, error) {
	if cfg.Query == nil || cfg.Disconnect == nil || cfg.Keys == nil {
		return nil, errors.New("httpapi: query, disconnect and keys are required")
	}
	if cfg.Ops != nil {
		if err := cfg.Ops.Check(); err != nil {
			return nil, fmt.Errorf("httpapi: %w", err)
		}
	}
	if cfg.Rate == 0 {
		cfg.Rate = DefaultRate
	}
	if cfg.Burst <= 0 {
		cfg.Burst = DefaultBurst
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = DefaultReadTimeout
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.now == nil {
		cfg.now = time.Now
	}
	for _, o := range cfg.CORSOrigins {
		if o != "*" && (!strings.Contains(o, "://") || strings.HasSuffix(o, "/")) {
			return nil, fmt.Errorf("httpapi: CORS origin %q: want scheme://host[:port] or *", o)
		}
	}
	a := &API{cfg: cfg, lim: newLimiters(cfg.Rate, cfg.Burst), log: cfg.Logger, view: cfg.Query.Region()}
	a.mux = a.routes()
	return a, nil
}

// Handler serves the API under /v1 (see Mount).
func (a *API) Handler() http.Handler { return a.mux }

// Prefixes are the paths Handler serves, for a mux in front of it.
var Prefixes = []string{"/v1/rooms", "/v1/rooms/", "/v1/rooms:batch-count", "/v1/users/", PathOpenAPI,
	"/v1/regions", "/v1/nodes", "/v1/flapping", "/v1/observer-token"}

// Mount serves the API on mux at Prefixes.
func (a *API) Mount(mux *http.ServeMux) {
	for _, p := range Prefixes {
		mux.Handle(p, a.mux)
	}
}

// route is one endpoint: its method, the scope it needs, and the handler
// that turns the request into an answer of the Query or Disconnecter.
type route struct {
	method string
	scope  Scope
	serve  func(r *http.Request, body []byte) (any, error)
}

func (a *API) routes() *http.ServeMux {
	mux := http.NewServeMux()
	for pattern, rt := range a.handlers().table() {
		mux.Handle(pattern, a.endpoint(rt))
	}
	mux.HandleFunc(PathOpenAPI, a.openAPI)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		a.cors(w, r)
		writeError(w, &bus.QueryError{Code: bus.CodeNotFound, Description: "no such endpoint: " + cut(r.URL.Path) + " (see " + PathOpenAPI + ")"})
	})
	return mux
}

// table is every endpoint by path pattern: the paths of docs/openapi.yaml.
func (h *handlers) table() map[string]route {
	return map[string]route{
		"/v1/rooms":                                {http.MethodGet, ScopeRead, h.rooms},
		"/v1/rooms:batch-count":                    {http.MethodPost, ScopeRead, h.batchCount},
		"/v1/rooms/{room}/members":                 {http.MethodGet, ScopeRead, h.members},
		"/v1/rooms/{room}/count":                   {http.MethodGet, ScopeRead, h.count},
		"/v1/rooms/{room}/users/{user}":            {http.MethodGet, ScopeRead, h.user},
		"/v1/rooms/{room}/users/{user}/disconnect": {http.MethodPost, ScopeAdmin, h.disconnectRoom},
		"/v1/users/{user}":                         {http.MethodGet, ScopeRead, h.lastSeen},
		"/v1/users/{user}/disconnect":              {http.MethodPost, ScopeAdmin, h.disconnectUser},
		"/v1/regions":                              {http.MethodGet, ScopeAdmin, h.regions},
		"/v1/nodes":                                {http.MethodGet, ScopeAdmin, h.nodes},
		"/v1/flapping":                             {http.MethodGet, ScopeAdmin, h.flapping},
		"/v1/observer-token":                       {http.MethodPost, ScopeAdmin, h.observerToken},
	}
}

// endpoint wraps a route with what every call goes through, in order:
// CORS, the method, the API being on, the key and its scope, the key's
// rate limit, then the body's limit and deadlines.
func (a *API) endpoint(rt route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer a.recoverTo(w, r)
		if a.cors(w, r) {
			return // a preflight, answered
		}
		if r.Method != rt.method {
			w.Header().Set("Allow", rt.method)
			writeError(w, &bus.QueryError{Code: bus.CodeMethod, Description: fmt.Sprintf("%.200s takes %s, not %.12q", r.URL.Path, rt.method, r.Method)})
			return
		}
		key, qe := a.authorize(w, r, rt.scope)
		if qe != nil {
			writeError(w, qe)
			return
		}
		rc := http.NewResponseController(w)
		_ = rc.SetWriteDeadline(a.cfg.now().Add(a.cfg.WriteTimeout))
		defer func() {
			// The connection may serve other requests after this one:
			// they set their own deadlines, or none.
			_ = rc.Flush()
			_ = rc.SetWriteDeadline(time.Time{})
		}()
		r = withKey(r, key)
		body, qe := a.readBody(w, r, rc)
		if qe != nil {
			writeError(w, qe)
			return
		}
		out, err := rt.serve(r, body)
		if err != nil {
			qe := bus.AsQueryError(err)
			if qe.Code == bus.CodeInternal || qe.Code == bus.CodeUnavailable {
				a.log.Warn("presence: api request failed", "view", a.view, "path", r.URL.Path, "key", key.Name, "code", qe.Code, "error", qe.Description)
			}
			writeError(w, qe)
			return
		}
		writeJSON(w, http.StatusOK, out)
	})
}

// authorize checks the API is on, the bearer key and its scope, and
// spends one request of the key's rate limit.
func (a *API) authorize(w http.ResponseWriter, r *http.Request, need Scope) (Key, *bus.QueryError) {
	if a.cfg.Keys.Len() == 0 {
		return Key{}, &bus.QueryError{Code: bus.CodeNotFound, Description: "the HTTP API is off: no API key is configured (--api-keys-file, or --api-keys / PRESENCE_API_KEYS)"}
	}
	tok, ok := bearer(r.Header.Get("Authorization"))
	if !ok {
		w.Header().Set("WWW-Authenticate", `Bearer realm="presence"`)
		return Key{}, &bus.QueryError{Code: bus.CodeUnauthorized, Description: "no API key: send Authorization: Bearer <key>"}
	}
	key, ok := a.cfg.Keys.lookup(tok)
	if !ok {
		w.Header().Set("WWW-Authenticate", `Bearer realm="presence", error="invalid_token"`)
		return Key{}, &bus.QueryError{Code: bus.CodeUnauthorized, Description: "unknown API key"}
	}
	if !key.Scope.allows(need) {
		return key, &bus.QueryError{Code: bus.CodeForbidden, Description: fmt.Sprintf("key %q has scope %s; this endpoint needs %s", key.Name, key.Scope, need)}
	}
	if ok, wait := a.lim.take(key.Name, a.cfg.now()); !ok {
		w.Header().Set("Retry-After", strconv.Itoa(int(wait.Seconds())))
		return key, &bus.QueryError{Code: bus.CodeTooMany, Description: fmt.Sprintf("key %q is over its rate limit (%g requests/s, burst %d); retry after %s", key.Name, a.cfg.Rate, a.cfg.Burst, wait)}
	}
	return key, nil
}

// readBody reads a POST's body within MaxBodyBytes and ReadTimeout.
func (a *API) readBody(w http.ResponseWriter, r *http.Request, rc *http.ResponseController) ([]byte, *bus.QueryError) {
	if r.Method != http.MethodPost {
		return nil, nil
	}
	tooLarge := &bus.QueryError{Code: bus.CodeTooLarge, Description: fmt.Sprintf("the request body is over %d bytes", a.cfg.MaxBodyBytes)}
	if r.ContentLength > a.cfg.MaxBodyBytes {
		return nil, tooLarge
	}
	_ = rc.SetReadDeadline(a.cfg.now().Add(a.cfg.ReadTimeout))
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, a.cfg.MaxBodyBytes))
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return nil, tooLarge
	case err != nil:
		// A client too slow to send its body within the timeout (or gone).
		w.Header().Set("Connection", "close")
		return nil, &bus.QueryError{Code: bus.CodeTimeout, Description: fmt.Sprintf("the request body did not arrive within %s", a.cfg.ReadTimeout)}
	}
	return body, nil
}

// recoverTo answers 500 for a panic of a handler.
func (a *API) recoverTo(w http.ResponseWriter, r *http.Request) {
	if p := recover(); p != nil {
		a.log.Error("presence: api handler panicked", "path", r.URL.Path, "panic", p)
		writeError(w, &bus.QueryError{Code: bus.CodeInternal, Description: "internal error"})
	}
}

// cors sets the CORS headers for an allowed Origin and answers a
// preflight (OPTIONS); it reports whether it answered.
func (a *API) cors(w http.ResponseWriter, r *http.Request) bool {
	origin := r.Header.Get("Origin")
	allowed := origin != "" && (slices.Contains(a.cfg.CORSOrigins, origin) || slices.Contains(a.cfg.CORSOrigins, "*"))
	if allowed {
		h := w.Header()
		h.Set("Access-Control-Allow-Origin", origin)
		h.Add("Vary", "Origin")
	}
	if r.Method != http.MethodOptions {
		return false
	}
	if allowed {
		h := w.Header()
		h.Set("Access-Control-Allow-Methods", "GET, POST")
		h.Set("Access-Control-Allow-Headers", "Authorization, Content-Type")
		h.Set("Access-Control-Max-Age", "600")
	}
	w.Header().Set("Allow", "GET, POST, OPTIONS")
	w.WriteHeader(http.StatusNoContent)
	return true
}

// openAPI serves docs/openapi.yaml; no key needed.
func (a *API) openAPI(w http.ResponseWriter, r *http.Request) {
	a.cors(w, r)
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeError(w, &bus.QueryError{Code: bus.CodeMethod, Description: PathOpenAPI + " takes GET"})
		return
	}
	w.Header().Set("Content-Type", "application/yaml")
	w.Header().Set("Cache-Control", "no-cache")
	_, _ = w.Write(docs.OpenAPI)
}

// writeJSON writes v as the JSON response with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError writes qe as an ErrorReply; its code is the HTTP status.
func writeError(w http.ResponseWriter, qe *bus.QueryError) {
	status, err := strconv.Atoi(qe.Code)
	if err != nil || status < 400 || status > 599 {
		status = http.StatusInternalServerError
	}
	writeJSON(w, status, bus.ErrorReply{Code: qe.Code, Error: qe.Description})
}

// Package apitest is the tests' client of the HTTP server API: every
// response it receives is validated against docs/openapi.yaml with
// kin-openapi (OpenAPI 3.1, JSON Schema 2020-12), so the document cannot
// drift from what the servers answer.
package apitest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/presence-dev/presence/docs"
)

var (
	loadOnce sync.Once
	loaded   []byte
	loadErr  error
)

// Document loads and validates docs/openapi.yaml, once per process.
func Document() (*openapi3.T, error) {
	loadOnce.Do(func() {
		doc, err := load()
		if err == nil {
			loaded, err = json.Marshal(doc)
		}
		loadErr = err
	})
	if loadErr != nil {
		return nil, loadErr
	}
	// A copy each: clients set their own servers.
	return openapi3.NewLoader().LoadFromData(loaded)
}

func load() (*openapi3.T, error) {
	doc, err := openapi3.NewLoader().LoadFromData(docs.OpenAPI)
	if err != nil {
		return nil, fmt.Errorf("openapi: load: %w", err)
	}
	if !doc.IsOpenAPI31OrLater() {
		return nil, fmt.Errorf("openapi: version %s, want 3.1", doc.OpenAPI)
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("openapi: invalid: %w", err)
	}
	return doc, nil
}

// Client calls one server's API with a key (none when empty).
type Client struct {
	tb     testing.TB
	base   string
	Key    string
	HTTP   *http.Client
	doc    *openapi3.T
	router routers.Router
}

// New returns a client of the API at base (http://host:port).
func New(tb testing.TB, base, key string) *Client {
	tb.Helper()
	doc, err := Document()
	if err != nil {
		tb.Fatal(err)
	}
	doc.Servers = openapi3.Servers{{URL: base}}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		tb.Fatalf("openapi router: %v", err)
	}
	return &Client{tb: tb, base: base, Key: key, HTTP: &http.Client{Timeout: 30 * time.Second}, doc: doc, router: router}
}

// With returns a client of the same server with another key.
func (c *Client) With(key string) *Client {
	cc := *c
	cc.Key = key
	return &cc
}

// Response is a response, read whole.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// Get calls GET path (with its query).
func (c *Client) Get(path string) *Response { return c.Do(http.MethodGet, path, "", nil) }

// Post calls POST path with a JSON body ("": none).
func (c *Client) Post(path, body string) *Response { return c.Do(http.MethodPost, path, body, nil) }

// Do sends a request with extra headers and validates the response.
func (c *Client) Do(method, path, body string, h http.Header) *Response {
	c.tb.Helper()
	req, err := http.NewRequest(method, c.base+path, strings.NewReader(body))
	if err != nil {
		c.tb.Fatal(err)
	}
	for k, vs := range h {
		req.Header[k] = vs
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.Key != "" {
		req.Header.Set("Authorization", "Bearer "+c.Key)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		c.tb.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.tb.Fatalf("%s %s: reading the body: %v", method, path, err)
	}
	r := &Response{Status: resp.StatusCode, Header: resp.Header, Body: b}
	if err := c.Validate(req, r); err != nil {
		c.tb.Errorf("%s %s: the response is not what docs/openapi.yaml says: %v\n%d %s", method, path, err, r.Status, b)
	}
	return r
}

// Validate checks a response against the document: against its
// operation's, or, for a path or method the document has not (the
// answer is then a 404 or 405), against the error body.
// A CORS preflight (OPTIONS with Access-Control-Request-Method) is no
// operation: it must be an empty 204.
func (c *Client) Validate(req *http.Request, r *Response) error {
	if req.Method == http.MethodOptions && req.Header.Get("Access-Control-Request-Method") != "" {
		if r.Status != http.StatusNoContent || len(r.Body) != 0 {
			return fmt.Errorf("a preflight answered %d with %d bytes, want an empty 204", r.Status, len(r.Body))
		}
		return nil
	}
	route, params, err := c.router.FindRoute(req)
	if err != nil {
		if r.Status != http.StatusNotFound && r.Status != http.StatusMethodNotAllowed {
			return fmt.Errorf("no operation of the document matches, and the status is %d, not 404 or 405", r.Status)
		}
		var v any
		if err := json.Unmarshal(r.Body, &v); err != nil {
			return fmt.Errorf("error body: %w", err)
		}
		return c.doc.Components.Schemas["ErrorReply"].Value.VisitJSON(v, openapi3.EnableJSONSchema2020())
	}
	opts := &openapi3filter.Options{IncludeResponseStatus: true, AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route, Options: opts},
		Status:                 r.Status,
		Header:                 r.Header,
		Options:                opts,
	}
	in.SetBodyBytes(r.Body)
	return openapi3filter.ValidateResponse(context.Background(), in)
}

// JSON decodes the body into v, failing the test if it is not JSON.
func (r *Response) JSON(tb testing.TB, v any) {
	tb.Helper()
	if err := json.Unmarshal(r.Body, v); err != nil {
		tb.Fatalf("response %d %s: %v", r.Status, r.Body, err)
	}
}

// Error returns the body of an error response with the status wanted,
// failing the test otherwise.
func (r *Response) Error(tb testing.TB, status int) (code, message string) {
	tb.Helper()
	var e struct{ Code, Error string }
	if r.Status != status || json.Unmarshal(r.Body, &e) != nil || e.Code != fmt.Sprint(status) || e.Error == "" {
		tb.Fatalf("got %d %s, want a %d error body", r.Status, bytes.TrimSpace(r.Body), status)
	}
	return e.Code, e.Error
}

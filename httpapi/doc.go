// Package httpapi is the HTTP server API of a view of presence: a
// region's, served by each of its edge nodes, or the global one, served
// by the aggregators. docs/openapi.yaml describes it (package docs embeds
// it; it is served at /v1/openapi.yaml).
//
// It holds no logic of its own about presence: each endpoint maps its
// path, query and body onto a request of package bus and answers with
// what bus.Query (or a bus.Disconnecter) answers, the very code the NATS
// micro service runs. What it adds is HTTP's: API keys with scopes
// (keys.go), a rate limit per key (limit.go), CORS, body limits and
// deadlines (api.go).
package httpapi

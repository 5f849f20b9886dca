// Package docs embeds the documents the binary serves: the HTTP API's
// OpenAPI description, openapi.yaml (served at /v1/openapi.yaml).
package docs

import _ "embed"

// OpenAPI is docs/openapi.yaml.
//
//go:embed openapi.yaml
var OpenAPI []byte

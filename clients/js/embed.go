// Package jsclient embeds the browser client of the presence service
// (@presence/client): an ES module with no dependencies, served as-is at
// /v1/client.js, and its TypeScript declarations.
package jsclient

import _ "embed"

// Source is client.js, the ES module.
//
//go:embed client.js
var Source []byte

// Types is client.d.ts, the module's TypeScript declarations.
//
//go:embed client.d.ts
var Types []byte

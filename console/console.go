// Package console is the operator console: a static page, embedded in
// the binary, that an aggregator and every node serve at /console. It
// holds no data and no key: the page asks for an admin API key and makes
// every call itself, to the HTTP API (package httpapi) and, for a room's
// live view, with the browser client (/v1/client.js) on an observer
// token the API mints.
package console

import (
	"bytes"
	"embed"
	"net/http"
	"path"
	"time"
)

// Path is where the console is served; its files are under Path + "/".
const Path = "/console"

//go:embed index.html console.css console.js room.js
var files embed.FS

// csp allows the page's own files, the API and the WebSocket of its
// origin, nothing inline: markup that reached the page as data could
// not run even if it were rendered as markup.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self' ws: wss:; img-src 'self' data:; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

var types = map[string]string{
	".html": "text/html; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
}

// Mount serves the console on mux: Path is the page, Path+"/<file>" its
// files; anything else under it is 404.
func Mount(mux *http.ServeMux) {
	mux.Handle("GET "+Path, serveFile("index.html"))
	mux.HandleFunc("GET "+Path+"/{file}", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("file")
		if name == "index.html" || types[path.Ext(name)] == "" {
			http.NotFound(w, r)
			return
		}
		serveFile(name).ServeHTTP(w, r)
	})
}

func serveFile(name string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := files.ReadFile(name)
		if err != nil {
			http.NotFound(w, r)
			return
		}
		h := w.Header()
		h.Set("Content-Type", types[path.Ext(name)])
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Cache-Control", "no-cache")
		http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(b))
	})
}

package node

import (
	"cmp"
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// PathDevToken mints client tokens in InsecureDev mode, so that the demo
// and local apps need no backend:
//
//	GET /dev/token?user=alice&rooms=room42,team7-*[&observe=true][&ttl=1h]
//
// answers a JWT as text/plain. A node serves it only in InsecureDev mode.
const PathDevToken = "/dev/token"

// Dev tokens live an hour unless asked otherwise, a day at most.
const (
	devTokenTTL    = time.Hour
	devTokenMaxTTL = 24 * time.Hour
)

// devSecret is the HS256 secret dev tokens are signed with: the node's
// secret when it has one (every node sharing it accepts the others'
// dev tokens), else a random one of this process.
func devSecret(configured []byte) ([]byte, error) {
	if len(configured) > 0 {
		return configured, nil
	}
	s := make([]byte, minSecret)
	if _, err := rand.Read(s); err != nil {
		return nil, fmt.Errorf("node: auth: dev secret: %w", err)
	}
	return s, nil
}

// routes adds the dev token endpoint in InsecureDev mode.
func (a *authenticator) routes(mux *http.ServeMux) {
	if a.cfg.InsecureDev {
		mux.HandleFunc("GET "+PathDevToken, a.serveDevToken)
	}
}

// serveDevToken mints a token signed with the dev secret. Any origin may
// read it (a local app on another port fetches it): in dev mode anyone
// may be anyone anyway.
func (a *authenticator) serveDevToken(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Access-Control-Allow-Origin", "*")
	w.Header().Set("Cache-Control", "no-store")
	g, err := a.devGrant(r.URL.Query())
	var tok string
	if err == nil {
		tok, err = g.Sign(a.devKey, time.Now())
	}
	if err != nil {
		http.Error(w, "node: dev token: "+err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = io.WriteString(w, tok)
}

// devGrant reads a dev token's grant from the query: user (required),
// rooms (default every room), observe, ttl.
func (a *authenticator) devGrant(q url.Values) (Grant, error) {
	g := Grant{User: q.Get("user"), Rooms: ParseRooms(cmp.Or(q.Get("rooms"), "*")), TTL: devTokenTTL,
		Issuer: a.cfg.Issuer, Audience: a.cfg.Audience}
	if g.User == "" {
		return g, fmt.Errorf("?user=<user id> is required")
	}
	if v := q.Get("observe"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return g, fmt.Errorf("?observe=%q: want true or false", v)
		}
		g.Observe = b
	}
	if v := q.Get("ttl"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 || d > devTokenMaxTTL {
			return g, fmt.Errorf("?ttl=%q: want a duration between 1s and %v (e.g. 10m)", v, devTokenMaxTTL)
		}
		g.TTL = d
	}
	return g, nil
}

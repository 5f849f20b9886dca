package node

import (
	"crypto/rsa"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/presence-dev/presence/presence"
)

// AuthConfig says how clients prove who they are. At least one of
// HMACSecret, RSAPublicKeyPEM or InsecureDev must be set.
type AuthConfig struct {
	// HMACSecret verifies HS256 tokens; at least 32 bytes.
	HMACSecret []byte
	// RSAPublicKeyPEM verifies RS256 tokens (PKIX or PKCS#1 PEM).
	RSAPublicKeyPEM []byte
	// Issuer and Audience, when set, must match the token's iss and aud.
	Issuer   string
	Audience string
	// Leeway tolerates clock skew on exp and nbf. Default 0.
	Leeway time.Duration
	// AllowedOrigins lists the Origin header values accepted on the
	// upgrade, e.g. "https://app.example.com"; a request without Origin
	// (not a browser) is accepted. Empty accepts any origin: tokens, not
	// cookies, authenticate, so a foreign page gains nothing.
	AllowedOrigins []string
	// InsecureDev takes the user id from the URL (?user=) with access to
	// every room and verifies nothing. For local development only; New
	// logs a warning.
	InsecureDev bool
}

// Where a token may be: browsers cannot set headers on a WebSocket, so a
// subprotocol entry or the query string carry it for them.
const (
	// Subprotocol is the protocol a node speaks. A client offering
	// subprotocols must offer it, and the node selects it.
	Subprotocol = "presence.v1"
	// TokenSubprotocolPrefix prefixes a token passed as a subprotocol
	// entry: new WebSocket(url, ["presence.v1", "bearer." + jwt]).
	TokenSubprotocolPrefix = "bearer."
	// TokenQueryParam carries a token in the URL.
	TokenQueryParam = "access_token"
	// SessionQueryParam carries the client-chosen session id (required).
	SessionQueryParam = "session"
	// UserQueryParam carries the user id in InsecureDev mode.
	UserQueryParam = "user"
)

// maxRoomPatterns bounds the rooms claim: it is matched on every join.
const maxRoomPatterns = 256

// Claims are the token claims a node reads. sub is the user id and exp is
// required. Rooms lists exact room ids, or prefixes ending in '*' ("team7-*"
// matches every room starting with "team7-", "*" matches all rooms); '*'
// is not a valid id byte, so a pattern never reads as a room.
//
// Observe lets the user join its rooms with "present":false: follow a room
// without being listed in it.
type Claims struct {
	Rooms   []string `json:"rooms"`
	Observe bool     `json:"observe,omitempty"`
	jwt.RegisteredClaims
}

// identity is who a connection is, where it may go and until when.
type identity struct {
	user  string
	rooms []string // exact ids, or prefixes with a trailing '*'
	// observe: may join without a session ("present":false).
	observe bool
	until   time.Time // exp plus the leeway; zero in dev mode (no token)
}

// allowed reports whether the identity may join room.
func (id *identity) allowed(room string) bool {
	for _, p := range id.rooms {
		if n := len(p) - 1; n >= 0 && p[n] == '*' {
			if strings.HasPrefix(room, p[:n]) {
				return true
			}
		} else if p == room {
			return true
		}
	}
	return false
}

// authError is a rejected handshake; its message goes to the client with
// HTTP 401.
type authError struct{ reason string }

func (e *authError) Error() string { return "node: auth: " + e.reason }

type authenticator struct {
	cfg    AuthConfig
	rsa    *rsa.PublicKey
	parser *jwt.Parser
}

func newAuthenticator(c AuthConfig) (*authenticator, error) {
	a := &authenticator{cfg: c}
	if c.InsecureDev {
		return a, nil
	}
	var methods []string
	if len(c.HMACSecret) > 0 {
		if len(c.HMACSecret) < 32 {
			return nil, configError("auth: hmac secret", fmt.Sprintf("must be at least 32 bytes for HS256, got %d", len(c.HMACSecret)))
		}
		methods = append(methods, jwt.SigningMethodHS256.Alg())
	}
	if len(c.RSAPublicKeyPEM) > 0 {
		k, err := jwt.ParseRSAPublicKeyFromPEM(c.RSAPublicKeyPEM)
		if err != nil {
			return nil, configError("auth: rsa public key", err.Error())
		}
		a.rsa = k
		methods = append(methods, jwt.SigningMethodRS256.Alg())
	}
	if len(methods) == 0 {
		return nil, configError("auth", "set an HMAC secret, an RSA public key, or InsecureDev")
	}
	if c.Leeway < 0 {
		return nil, configError("auth: leeway", fmt.Sprintf("must not be negative, got %v", c.Leeway))
	}
	opts := []jwt.ParserOption{jwt.WithValidMethods(methods), jwt.WithExpirationRequired(), jwt.WithLeeway(c.Leeway)}
	if c.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(c.Issuer))
	}
	if c.Audience != "" {
		opts = append(opts, jwt.WithAudience(c.Audience))
	}
	a.parser = jwt.NewParser(opts...)
	return a, nil
}

// key picks the verification key by algorithm. WithValidMethods has
// already refused algorithms not configured, and each key has the type
// only its own algorithm accepts, so an RS256 key cannot verify an HS256
// token.
func (a *authenticator) key(t *jwt.Token) (any, error) {
	switch t.Method.Alg() {
	case jwt.SigningMethodHS256.Alg():
		return a.cfg.HMACSecret, nil
	case jwt.SigningMethodRS256.Alg():
		return a.rsa, nil
	}
	return nil, fmt.Errorf("algorithm %s not accepted", t.Method.Alg())
}

// tokenFrom finds a token: Authorization header, then subprotocol, then
// query string.
func tokenFrom(r *http.Request, q url.Values) string {
	if h := r.Header.Get("Authorization"); len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	for _, p := range websocketSubprotocols(r) {
		if strings.HasPrefix(p, TokenSubprotocolPrefix) {
			return p[len(TokenSubprotocolPrefix):]
		}
	}
	return q.Get(TokenQueryParam)
}

// websocketSubprotocols splits Sec-WebSocket-Protocol like gorilla does.
func websocketSubprotocols(r *http.Request) []string {
	var out []string
	for _, h := range r.Header.Values("Sec-Websocket-Protocol") {
		for _, p := range strings.Split(h, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}

// authenticate checks the handshake's credentials.
func (a *authenticator) authenticate(r *http.Request, q url.Values) (*identity, error) {
	if a.cfg.InsecureDev {
		u := q.Get(UserQueryParam)
		if err := presence.ValidateUser(u); err != nil {
			return nil, &authError{fmt.Sprintf("dev mode needs ?%s=<user id>: %v", UserQueryParam, err)}
		}
		return &identity{user: u, rooms: []string{"*"}, observe: true}, nil
	}
	raw := tokenFrom(r, q)
	if raw == "" {
		return nil, &authError{fmt.Sprintf("no token: send Authorization: Bearer <jwt>, a %q subprotocol entry, or ?%s=", TokenSubprotocolPrefix+"<jwt>", TokenQueryParam)}
	}
	return a.parse(raw)
}

// parse verifies a token and returns the identity it grants.
func (a *authenticator) parse(raw string) (*identity, error) {
	var c Claims
	if _, err := a.parser.ParseWithClaims(raw, &c, a.key); err != nil {
		switch {
		case errors.Is(err, jwt.ErrTokenExpired):
			return nil, &authError{"token is expired"}
		case errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
			return nil, &authError{"token has no exp claim"}
		case errors.Is(err, jwt.ErrTokenMalformed):
			return nil, &authError{"token is malformed"}
		case errors.Is(err, jwt.ErrTokenSignatureInvalid), errors.Is(err, jwt.ErrTokenUnverifiable):
			return nil, &authError{"token signature is invalid or its algorithm is not accepted"}
		}
		return nil, &authError{"token rejected: " + err.Error()}
	}
	if err := presence.ValidateUser(c.Subject); err != nil {
		return nil, &authError{fmt.Sprintf("token sub is not a valid user id: %v", err)}
	}
	if len(c.Rooms) > maxRoomPatterns {
		return nil, &authError{fmt.Sprintf("token rooms claim has %d entries, at most %d", len(c.Rooms), maxRoomPatterns)}
	}
	for _, p := range c.Rooms {
		if err := checkRoomPattern(p); err != nil {
			return nil, &authError{"token rooms claim: " + err.Error()}
		}
	}
	return &identity{user: c.Subject, rooms: c.Rooms, observe: c.Observe, until: c.ExpiresAt.Add(a.cfg.Leeway)}, nil
}

// checkRoomPattern accepts a room id, or a prefix of id bytes followed by
// a single trailing '*'.
func checkRoomPattern(p string) error {
	if p == "*" {
		return nil
	}
	if n := len(p) - 1; n > 0 && p[n] == '*' {
		if err := presence.ValidateRoom(p[:n]); err != nil {
			return fmt.Errorf("pattern %q: prefix: %w", p, err)
		}
		return nil
	}
	if err := presence.ValidateRoom(p); err != nil {
		return fmt.Errorf("pattern %q: %w", p, err)
	}
	return nil
}

// originAllowed checks the Origin header against AllowedOrigins.
func (a *authenticator) originAllowed(r *http.Request) bool {
	if len(a.cfg.AllowedOrigins) == 0 {
		return true
	}
	o := r.Header.Get("Origin")
	if o == "" {
		return true // not a browser
	}
	for _, ok := range a.cfg.AllowedOrigins {
		if strings.EqualFold(o, ok) {
			return true
		}
	}
	return false
}

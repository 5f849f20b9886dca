package node

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/presence-dev/presence/presence"
	"github.com/presence-dev/presence/protocol"
)

// AuthConfig says how clients prove who they are. At least one of
// HMACSecret, PublicKeyPEM, JWKSURL or InsecureDev must be set; several
// may be, and a token is checked with the key of its algorithm (and kid).
type AuthConfig struct {
	// HMACSecret verifies HS256 tokens; at least 32 bytes.
	HMACSecret []byte
	// PublicKeyPEM verifies tokens signed with its private key, by the
	// key's type: RSA RS256 (PKIX or PKCS#1 PEM), P-256 ECDSA ES256,
	// Ed25519 EdDSA (PKIX PEM).
	PublicKeyPEM []byte
	// JWKSURL, when set, verifies RS256, ES256 and EdDSA tokens with the
	// key their kid header names in the JSON Web Key Set at this URL (an
	// identity provider's jwks_uri). The set is fetched in the
	// background, again every JWKSRefresh (default 5m), and at once,
	// at most every 10s, for a kid it lacks. A failed fetch keeps the
	// last good set; until a first one succeeds, such tokens are refused.
	JWKSURL     string
	JWKSRefresh time.Duration
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
	// InsecureDev is for local development; New logs a warning. A
	// handshake without a token takes its user id from the URL (?user=)
	// with access to every room; tokens are checked as in production, and
	// GET /dev/token (PathDevToken) mints them for anyone, signed with
	// HMACSecret or, without one, a random secret of this process.
	InsecureDev bool
}

// Where a token may be: browsers cannot set headers on a WebSocket, so a
// subprotocol entry or the query string carry it for them.
const (
	// Subprotocol is the protocol a node speaks. A client offering
	// subprotocols must offer it, and the node selects it.
	Subprotocol = protocol.Subprotocol
	// TokenSubprotocolPrefix prefixes a token passed as a subprotocol
	// entry: new WebSocket(url, ["presence.v1", "bearer." + jwt]).
	TokenSubprotocolPrefix = protocol.TokenSubprotocolPrefix
	// TokenQueryParam carries a token in the URL.
	TokenQueryParam = protocol.TokenQueryParam
	// SessionQueryParam carries the client-chosen session id (required).
	SessionQueryParam = protocol.SessionQueryParam
	// UserQueryParam carries the user id in InsecureDev mode.
	UserQueryParam = protocol.UserQueryParam
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
	keys   map[string]any // static verification key by algorithm
	jwks   *jwks          // nil without JWKSURL
	devKey []byte         // signs dev tokens (InsecureDev)
	parser *jwt.Parser
}

// Validate checks the configuration as New does, without fetching
// anything: a bad secret, key or JWKS URL is found before a node starts.
func (c AuthConfig) Validate() error {
	if c.Leeway < 0 {
		return configError("auth: leeway", fmt.Sprintf("must not be negative, got %v", c.Leeway))
	}
	if n := len(c.HMACSecret); n > 0 && n < minSecret {
		return configError("auth: hmac secret", fmt.Sprintf("must be at least %d bytes for HS256, got %d", minSecret, n))
	}
	if len(c.PublicKeyPEM) > 0 {
		if _, _, err := parsePublicKeyPEM(c.PublicKeyPEM); err != nil {
			return configError("auth: public key", err.Error())
		}
	}
	if c.JWKSURL != "" {
		if err := checkJWKS(c.JWKSURL, c.JWKSRefresh); err != nil {
			return err
		}
	}
	if len(c.HMACSecret) == 0 && len(c.PublicKeyPEM) == 0 && c.JWKSURL == "" && !c.InsecureDev {
		return configError("auth", "set an HMAC secret, a public key, a JWKS URL, or InsecureDev")
	}
	return nil
}

func newAuthenticator(c AuthConfig, log *slog.Logger) (*authenticator, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	a := &authenticator{cfg: c, keys: map[string]any{}}
	if err := a.staticKeys(); err != nil {
		return nil, err
	}
	if c.JWKSURL != "" {
		j, err := newJWKS(c.JWKSURL, c.JWKSRefresh, log)
		if err != nil {
			return nil, err
		}
		a.jwks = j
	}
	opts := []jwt.ParserOption{jwt.WithValidMethods(a.methods()), jwt.WithExpirationRequired(), jwt.WithLeeway(c.Leeway)}
	if c.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(c.Issuer))
	}
	if c.Audience != "" {
		opts = append(opts, jwt.WithAudience(c.Audience))
	}
	a.parser = jwt.NewParser(opts...)
	return a, nil
}

// staticKeys reads the configured secret and public key (Validate has
// checked them), and makes the dev secret in InsecureDev mode.
func (a *authenticator) staticKeys() error {
	c := a.cfg
	if len(c.HMACSecret) > 0 {
		a.keys[algHS256] = c.HMACSecret
	}
	if len(c.PublicKeyPEM) > 0 {
		alg, k, err := parsePublicKeyPEM(c.PublicKeyPEM)
		if err != nil {
			return configError("auth: public key", err.Error())
		}
		a.keys[alg] = k
	}
	if c.InsecureDev {
		s, err := devSecret(c.HMACSecret)
		if err != nil {
			return err
		}
		a.devKey = s
		a.keys[algHS256] = s
	}
	return nil
}

// methods lists the algorithms some configured key verifies.
func (a *authenticator) methods() []string {
	var out []string
	for _, alg := range []string{algHS256, algRS256, algES256, algEdDSA} {
		if a.keys[alg] != nil || (a.jwks != nil && alg != algHS256) {
			out = append(out, alg)
		}
	}
	return out
}

// close stops the JWKS fetching.
func (a *authenticator) close() {
	if a.jwks != nil {
		a.jwks.close()
	}
}

// key picks the verification key by algorithm, and by kid from the
// JWKS. WithValidMethods has already refused the algorithms no key
// verifies, and each key has the type only its own algorithm accepts,
// so an RS256 key cannot verify an HS256 token. A token with a kid the
// JWKS lacks is still checked with a configured public key of its
// algorithm, if there is one.
func (a *authenticator) key(t *jwt.Token) (any, error) {
	alg := t.Method.Alg()
	kid, _ := t.Header["kid"].(string)
	static := a.keys[alg]
	if alg == algHS256 || a.jwks == nil {
		if static == nil {
			return nil, fmt.Errorf("algorithm %s not accepted", alg)
		}
		return static, nil
	}
	if kid == "" {
		if static != nil {
			return static, nil
		}
		return nil, &authError{"token has no kid header: the node picks its key from the JWKS by kid"}
	}
	k, err := a.jwks.key(kid, alg)
	if err != nil && static != nil {
		return static, nil
	}
	return k, err
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
	raw := tokenFrom(r, q)
	if raw == "" && a.cfg.InsecureDev {
		u := q.Get(UserQueryParam)
		if err := presence.ValidateUser(u); err != nil {
			return nil, &authError{fmt.Sprintf("dev mode needs a token (GET %s?user=) or ?%s=<user id>: %v", PathDevToken, UserQueryParam, err)}
		}
		// A copy: u is a slice of the request line (see serveWS).
		return &identity{user: strings.Clone(u), rooms: []string{"*"}, observe: true}, nil
	}
	if raw == "" {
		return nil, &authError{fmt.Sprintf("no token: send Authorization: Bearer <jwt>, a %q subprotocol entry, or ?%s=", TokenSubprotocolPrefix+"<jwt>", TokenQueryParam)}
	}
	return a.parse(raw)
}

// parse verifies a token and returns the identity it grants.
func (a *authenticator) parse(raw string) (*identity, error) {
	var c Claims
	if _, err := a.parser.ParseWithClaims(raw, &c, a.key); err != nil {
		return nil, tokenError(err)
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

// tokenError says why the parser refused a token.
func tokenError(err error) *authError {
	var ae *authError
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.Is(err, jwt.ErrTokenExpired):
		return &authError{"token is expired"}
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		for _, claim := range []string{"exp", "iss", "aud"} {
			if strings.Contains(err.Error(), claim+" claim is required") {
				return &authError{"token has no " + claim + " claim"}
			}
		}
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return &authError{"token iss is not the issuer this node accepts"}
	case errors.Is(err, jwt.ErrTokenInvalidAudience):
		return &authError{"token aud does not name this node's audience"}
	case errors.Is(err, jwt.ErrTokenMalformed):
		return &authError{"token is malformed"}
	case errors.Is(err, jwt.ErrTokenSignatureInvalid), errors.Is(err, jwt.ErrTokenUnverifiable):
		return &authError{"token signature is invalid or its algorithm is not accepted"}
	}
	return &authError{"token rejected: " + err.Error()}
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

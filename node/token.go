package node

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/presence-dev/presence/presence"
)

// Grant is what a client token lets its holder do: be User, join Rooms
// (ids, or prefixes ending in '*'), follow them unlisted when Observe is
// set, for TTL from when it is signed. A node reads it back from the
// token's claims (see Claims); Sign is how presenced token and the dev
// token endpoint mint one.
type Grant struct {
	User    string
	Rooms   []string
	Observe bool
	TTL     time.Duration
	// Issuer and Audience become iss and aud, for a node that checks them.
	Issuer, Audience string
	// KeyID becomes the kid header, for a node that picks the key from a
	// JWKS by it.
	KeyID string
}

// Validate checks the grant with the rules a node applies to a token's
// claims: a valid user id, one to 256 room ids or patterns, a TTL of a
// second or more.
func (g Grant) Validate() error {
	if err := presence.ValidateUser(g.User); err != nil {
		return fmt.Errorf("user: %w", err)
	}
	if len(g.Rooms) == 0 {
		return errors.New("rooms: at least one room id or pattern (\"*\" for all rooms)")
	}
	if len(g.Rooms) > maxRoomPatterns {
		return fmt.Errorf("rooms: %d entries, at most %d", len(g.Rooms), maxRoomPatterns)
	}
	for _, p := range g.Rooms {
		if err := checkRoomPattern(p); err != nil {
			return fmt.Errorf("rooms: %w", err)
		}
	}
	if g.TTL < time.Second {
		return fmt.Errorf("ttl: must be at least 1s (exp is in whole seconds), got %v", g.TTL)
	}
	return nil
}

// Claims are the token claims of the grant signed at now. exp is in
// whole seconds, rounded down: a token never outlives its TTL.
func (g Grant) Claims(now time.Time) Claims {
	c := Claims{Rooms: g.Rooms, Observe: g.Observe, RegisteredClaims: jwt.RegisteredClaims{
		Subject:   g.User,
		IssuedAt:  jwt.NewNumericDate(now),
		ExpiresAt: jwt.NewNumericDate(now.Add(g.TTL)),
		Issuer:    g.Issuer,
	}}
	if g.Audience != "" {
		c.Audience = jwt.ClaimStrings{g.Audience}
	}
	return c
}

// Sign returns the grant as a JWT signed at now with key: an HS256
// secret ([]byte, at least 32 bytes), or an RSA, P-256 ECDSA or Ed25519
// private key (RS256, ES256, EdDSA).
func (g Grant) Sign(key any, now time.Time) (string, error) {
	if err := g.Validate(); err != nil {
		return "", err
	}
	m, err := signingMethod(key)
	if err != nil {
		return "", err
	}
	t := jwt.NewWithClaims(m, g.Claims(now))
	if g.KeyID != "" {
		t.Header["kid"] = g.KeyID
	}
	return t.SignedString(key)
}

// signingMethod is the one algorithm each kind of key signs with.
func signingMethod(key any) (jwt.SigningMethod, error) {
	switch k := key.(type) {
	case []byte:
		if len(k) < minSecret {
			return nil, fmt.Errorf("an HS256 secret must be at least %d bytes, got %d", minSecret, len(k))
		}
		return jwt.SigningMethodHS256, nil
	case *rsa.PrivateKey:
		return jwt.SigningMethodRS256, nil
	case *ecdsa.PrivateKey:
		if k.Curve != elliptic.P256() {
			return nil, fmt.Errorf("ES256 needs a P-256 key, got %s", k.Curve.Params().Name)
		}
		return jwt.SigningMethodES256, nil
	case ed25519.PrivateKey:
		return jwt.SigningMethodEdDSA, nil
	}
	return nil, fmt.Errorf("a %T signs no accepted algorithm (HS256 secret, RSA, P-256 ECDSA or Ed25519 private key)", key)
}

// ParseRooms splits a comma-separated rooms list ("room42, team7-*"),
// trimming spaces; Validate checks the entries.
func ParseRooms(list string) []string {
	if strings.TrimSpace(list) == "" {
		return nil
	}
	parts := strings.Split(list, ",")
	for i, p := range parts {
		parts[i] = strings.TrimSpace(p)
	}
	return parts
}

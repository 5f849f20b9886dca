package testkit

import (
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Token signs an HS256 client token for user with the given rooms claim
// (the claim names of docs/PROTOCOL.md), valid for ttl.
func Token(secret []byte, user string, rooms []string, ttl time.Duration) (string, error) {
	return jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"sub": user, "rooms": rooms, "exp": time.Now().Add(ttl).Unix(),
	}).SignedString(secret)
}

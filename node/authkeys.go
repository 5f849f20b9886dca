package node

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"

	"github.com/golang-jwt/jwt/v5"
)

// The algorithms a node accepts, each with the one key type that
// verifies it: an HS256 token is never checked with a public key's bytes,
// nor an RS256 token with an EC key.
var (
	algHS256 = jwt.SigningMethodHS256.Alg()
	algRS256 = jwt.SigningMethodRS256.Alg()
	algES256 = jwt.SigningMethodES256.Alg()
	algEdDSA = jwt.SigningMethodEdDSA.Alg()
)

// minSecret is the shortest HS256 secret accepted: the hash's size.
const minSecret = 32

// parsePublicKeyPEM reads one PEM public key and returns the algorithm
// it verifies: RSA (PKIX or PKCS#1) RS256, P-256 ECDSA ES256, Ed25519
// EdDSA.
func parsePublicKeyPEM(b []byte) (string, any, error) {
	block, _ := pem.Decode(b)
	if block == nil {
		return "", nil, errors.New("no PEM block found")
	}
	var key any
	var err error
	switch block.Type {
	case "RSA PUBLIC KEY":
		key, err = x509.ParsePKCS1PublicKey(block.Bytes)
	case "PUBLIC KEY":
		key, err = x509.ParsePKIXPublicKey(block.Bytes)
	default:
		return "", nil, fmt.Errorf("PEM block is %q; want \"PUBLIC KEY\" (or \"RSA PUBLIC KEY\")", block.Type)
	}
	if err != nil {
		return "", nil, err
	}
	alg, err := algorithmOf(key)
	return alg, key, err
}

// algorithmOf returns the algorithm a public key verifies.
func algorithmOf(key any) (string, error) {
	switch k := key.(type) {
	case *rsa.PublicKey:
		return algRS256, nil
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() {
			return "", fmt.Errorf("ECDSA key on %s: ES256 needs P-256", k.Curve.Params().Name)
		}
		return algES256, nil
	case ed25519.PublicKey:
		return algEdDSA, nil
	case []byte:
		return "", errors.New("a symmetric key: only public keys (RSA, P-256 ECDSA, Ed25519) verify tokens here")
	}
	return "", fmt.Errorf("a %T verifies no accepted algorithm (RSA, P-256 ECDSA, Ed25519)", key)
}

package main

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/presence-dev/presence/node"
)

// tokenFlags are presenced token's flags: the key, and what the token
// grants.
type tokenFlags struct {
	secret, secretFile, keyFile, kid string
	user, rooms, issuer, audience    string
	ttl                              time.Duration
	observe                          bool
}

func (f *tokenFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.secret, "jwt-secret", "", "HS256 secret of the nodes (at least 32 bytes)")
	fs.StringVar(&f.secretFile, "jwt-secret-file", "", "file holding the HS256 secret, as the nodes' --jwt-secret-file")
	fs.StringVar(&f.keyFile, "jwt-private-key-file", "", "PEM private key whose public key the nodes have (--jwt-public-key-file): RSA (RS256), P-256 EC (ES256) or Ed25519 (EdDSA)")
	fs.StringVar(&f.kid, "kid", "", "kid header, for nodes that pick the key from a JWKS by it")
	fs.StringVar(&f.user, "user", "", "the user id (sub); required")
	fs.StringVar(&f.rooms, "rooms", "", "comma-separated room ids or prefixes ending in * (room42,team7-*; * for every room); required")
	fs.DurationVar(&f.ttl, "ttl", time.Hour, "how long the token lives (exp); at least 1s")
	fs.BoolVar(&f.observe, "observe", false, `the user may also join its rooms with "present":false, following them unlisted`)
	fs.StringVar(&f.issuer, "jwt-issuer", "", "iss claim, for nodes started with --jwt-issuer")
	fs.StringVar(&f.audience, "jwt-audience", "", "aud claim, for nodes started with --jwt-audience")
}

// runTokenCommand prints a client token that nodes configured with the
// same secret or key accept, for scripts, tests and a first try without
// a backend. Every mistake is a usage error (exit 2).
func runTokenCommand(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("presenced token", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f tokenFlags
	f.register(fs)
	fs.Usage = groupedUsage(fs, commandIntro[fs.Name()], "")
	if err := parseFlags(fs, args); err != nil {
		if err == flag.ErrHelp {
			return nil
		}
		return err
	}
	key, err := f.key()
	if err != nil {
		return &usageError{err.Error()}
	}
	g := node.Grant{User: f.user, Rooms: node.ParseRooms(f.rooms), Observe: f.observe, TTL: f.ttl,
		Issuer: f.issuer, Audience: f.audience, KeyID: f.kid}
	if g.User == "" {
		return &usageError{"--user: required (the user id the token is for)"}
	}
	if len(g.Rooms) == 0 {
		return &usageError{"--rooms: required: room ids or prefixes ending in * ('room42,team7-*'; '*' for every room)"}
	}
	if err := g.Validate(); err != nil {
		return &usageError{"--" + err.Error()} // its errors name the field: user, rooms, ttl
	}
	tok, err := g.Sign(key, time.Now())
	if err != nil {
		return &usageError{f.keyFlag() + ": " + err.Error()}
	}
	_, err = fmt.Fprintln(stdout, tok)
	return err
}

// key is the signing key the flags name: exactly one of the secret,
// the secret file or the private key file.
func (f *tokenFlags) key() (any, error) {
	given := 0
	for _, v := range []string{f.secret, f.secretFile, f.keyFile} {
		if v != "" {
			given++
		}
	}
	if given != 1 {
		return nil, errors.New("give exactly one of --jwt-secret, --jwt-secret-file and --jwt-private-key-file: the nodes' secret, or the private key of their public key")
	}
	switch {
	case f.secret != "":
		return []byte(f.secret), nil
	case f.secretFile != "":
		b, err := readFileFlag("jwt-secret-file", f.secretFile)
		if err != nil {
			return nil, err
		}
		return []byte(strings.TrimSpace(string(b))), nil // as the node reads it
	}
	b, err := readFileFlag("jwt-private-key-file", f.keyFile)
	if err != nil {
		return nil, err
	}
	k, err := parsePrivateKeyPEM(b)
	if err != nil {
		return nil, fmt.Errorf("--jwt-private-key-file %s: %v", f.keyFile, err)
	}
	return k, nil
}

// keyFlag names the flag that gave the key.
func (f *tokenFlags) keyFlag() string {
	switch {
	case f.secret != "":
		return "--jwt-secret"
	case f.secretFile != "":
		return "--jwt-secret-file"
	}
	return "--jwt-private-key-file"
}

// parsePrivateKeyPEM reads a PKCS#8, PKCS#1 (RSA) or SEC 1 (EC) private
// key.
func parsePrivateKeyPEM(b []byte) (any, error) {
	block, _ := pem.Decode(b)
	if block == nil {
		return nil, errors.New("no PEM block found")
	}
	switch block.Type {
	case "PRIVATE KEY":
		return x509.ParsePKCS8PrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		return x509.ParsePKCS1PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		return x509.ParseECPrivateKey(block.Bytes)
	}
	return nil, fmt.Errorf("PEM block is %q; want \"PRIVATE KEY\", \"RSA PRIVATE KEY\" or \"EC PRIVATE KEY\"", block.Type)
}

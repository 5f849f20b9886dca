package node

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"slices"
	"strings"
	"testing"
	"time"
)

// testKey is a private key and its public key's PEM.
type testKey struct {
	priv   any
	pubPEM []byte
	pub    any
}

// newTestKey makes a key of a kind: rsa, ec (P-256), ec384, ed25519.
func newTestKey(t *testing.T, kind string) testKey {
	t.Helper()
	var priv, pub any
	switch kind {
	case "rsa":
		k, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			t.Fatal(err)
		}
		priv, pub = k, &k.PublicKey
	case "ec", "ec384":
		curve := elliptic.P256()
		if kind == "ec384" {
			curve = elliptic.P384()
		}
		k, err := ecdsa.GenerateKey(curve, rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		priv, pub = k, &k.PublicKey
	case "ed25519":
		p, k, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		priv, pub = k, p
	default:
		t.Fatalf("no key kind %q", kind)
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return testKey{priv: priv, pub: pub, pubPEM: pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})}
}

// quietAuth makes an authenticator that logs nowhere.
func quietAuth(t *testing.T, c AuthConfig) *authenticator {
	t.Helper()
	a, err := newAuthenticator(c, quiet)
	if err != nil {
		t.Fatalf("newAuthenticator: %v", err)
	}
	t.Cleanup(a.close)
	return a
}

// A grant signed with each kind of key is read back by a node
// configured with the matching secret or public key, claims intact.
func TestGrantSignRoundTrip(t *testing.T) {
	now := time.Now()
	g := Grant{User: "alice", Rooms: []string{"room42", "team7-*"}, Observe: true, TTL: time.Hour, Issuer: "me", Audience: "presence"}
	for _, kind := range []string{"hs256", "rsa", "ec", "ed25519"} {
		t.Run(kind, func(t *testing.T) {
			c := AuthConfig{Issuer: "me", Audience: "presence"}
			var key any = testSecret
			if kind == "hs256" {
				c.HMACSecret = testSecret
			} else {
				k := newTestKey(t, kind)
				key, c.PublicKeyPEM = k.priv, k.pubPEM
			}
			tok, err := g.Sign(key, now)
			if err != nil {
				t.Fatal(err)
			}
			id, err := quietAuth(t, c).parse(tok)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if id.user != "alice" || !slices.Equal(id.rooms, g.Rooms) || !id.observe || !id.until.Equal(now.Add(time.Hour).Truncate(time.Second)) {
				t.Fatalf("identity %+v", id)
			}
			if !id.allowed("team7-x") || id.allowed("team8") {
				t.Fatalf("rooms not as granted: %v", id.rooms)
			}
		})
	}
}

// A bad grant or key is refused with the rule it breaks.
func TestGrantRefused(t *testing.T) {
	ok := Grant{User: "alice", Rooms: []string{"r"}, TTL: time.Minute}
	many := make([]string, maxRoomPatterns+1)
	for i := range many {
		many[i] = "r"
	}
	cases := []struct {
		name string
		edit func(*Grant)
		key  any
		want string
	}{
		{"no user", func(g *Grant) { g.User = "" }, testSecret, "user:"},
		{"bad user", func(g *Grant) { g.User = "a.b" }, testSecret, "user:"},
		{"no rooms", func(g *Grant) { g.Rooms = nil }, testSecret, "at least one room"},
		{"bad room", func(g *Grant) { g.Rooms = []string{"team:*"} }, testSecret, `pattern "team:*"`},
		{"empty room", func(g *Grant) { g.Rooms = ParseRooms("a,,b") }, testSecret, `pattern ""`},
		{"too many rooms", func(g *Grant) { g.Rooms = many }, testSecret, "at most 256"},
		{"no ttl", func(g *Grant) { g.TTL = 0 }, testSecret, "ttl: must be at least 1s"},
		{"sub-second ttl", func(g *Grant) { g.TTL = 500 * time.Millisecond }, testSecret, "ttl: must be at least 1s"},
		{"short secret", func(*Grant) {}, []byte("short"), "at least 32 bytes"},
		{"P-384", func(*Grant) {}, newTestKey(t, "ec384").priv, "P-256"},
		{"public key", func(*Grant) {}, newTestKey(t, "ec").pub, "signs no accepted algorithm"},
	}
	for _, k := range cases {
		t.Run(k.name, func(t *testing.T) {
			g := ok
			k.edit(&g)
			if _, err := g.Sign(k.key, time.Now()); err == nil || !strings.Contains(err.Error(), k.want) {
				t.Fatalf("got %v, want an error mentioning %q", err, k.want)
			}
		})
	}
}

func TestParseRooms(t *testing.T) {
	for in, want := range map[string][]string{"": nil, " ": nil, "a": {"a"}, "room42, team7-*": {"room42", "team7-*"}, "a,,b": {"a", "", "b"}} {
		if got := ParseRooms(in); !slices.Equal(got, want) {
			t.Errorf("ParseRooms(%q) = %q, want %q", in, got, want)
		}
	}
}

// Public keys of each accepted type configure their algorithm; others
// are refused when the node is configured.
func TestPublicKeyPEM(t *testing.T) {
	for kind, alg := range map[string]string{"rsa": algRS256, "ec": algES256, "ed25519": algEdDSA} {
		got, _, err := parsePublicKeyPEM(newTestKey(t, kind).pubPEM)
		if err != nil || got != alg {
			t.Errorf("%s: got %q, %v; want %s", kind, got, err, alg)
		}
	}
	rsaKey := newTestKey(t, "rsa").priv.(*rsa.PrivateKey)
	pkcs1 := pem.EncodeToMemory(&pem.Block{Type: "RSA PUBLIC KEY", Bytes: x509.MarshalPKCS1PublicKey(&rsaKey.PublicKey)})
	if got, _, err := parsePublicKeyPEM(pkcs1); err != nil || got != algRS256 {
		t.Errorf("PKCS#1: got %q, %v", got, err)
	}
	der, _ := x509.MarshalPKCS8PrivateKey(rsaKey)
	for name, k := range map[string]struct {
		pem  []byte
		want string
	}{
		"garbage":     {[]byte("not pem"), "no PEM block"},
		"private key": {pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), `PEM block is "PRIVATE KEY"`},
		"P-384":       {newTestKey(t, "ec384").pubPEM, "ES256 needs P-256"},
		"bad DER":     {pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: []byte("x")}), "asn1"},
	} {
		err := AuthConfig{PublicKeyPEM: k.pem}.Validate()
		if err == nil || !strings.Contains(err.Error(), k.want) || !strings.Contains(err.Error(), "auth: public key") {
			t.Errorf("%s: got %v, want an auth: public key error mentioning %q", name, err, k.want)
		}
	}
}

// A node that checks iss and aud says which one a token lacks or gets
// wrong.
func TestTokenIssuerAudience(t *testing.T) {
	a := quietAuth(t, AuthConfig{HMACSecret: testSecret, Issuer: "https://app.example", Audience: "presence"})
	for _, k := range []struct {
		iss, aud, want string
	}{
		{"", "presence", "token has no iss claim"},
		{"https://evil.example", "presence", "token iss is not the issuer this node accepts"},
		{"https://app.example", "", "token has no aud claim"},
		{"https://app.example", "other", "token aud does not name this node's audience"},
	} {
		tok, err := Grant{User: "u", Rooms: []string{"r"}, TTL: time.Hour, Issuer: k.iss, Audience: k.aud}.Sign(testSecret, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.parse(tok); err == nil || err.Error() != "node: auth: "+k.want {
			t.Errorf("iss %q aud %q: got %v, want %q", k.iss, k.aud, err, k.want)
		}
	}
	tok, _ := Grant{User: "u", Rooms: []string{"r"}, TTL: time.Hour, Issuer: "https://app.example", Audience: "presence"}.Sign(testSecret, time.Now())
	if _, err := a.parse(tok); err != nil {
		t.Fatalf("the right iss and aud: %v", err)
	}
}

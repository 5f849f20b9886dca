package node

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"github.com/presence-dev/presence/protocol"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/presence-dev/presence/internal/testkit"
)

func rsaKey(t *testing.T) (*rsa.PrivateKey, []byte) {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return k, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

func sign(t *testing.T, m jwt.SigningMethod, key any, c jwt.Claims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(m, c).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func claims(user string, rooms []string, exp time.Time) Claims {
	return Claims{Rooms: rooms, RegisteredClaims: jwt.RegisteredClaims{Subject: user, ExpiresAt: jwt.NewNumericDate(exp)}}
}

// refused dials and returns the HTTP status and body of a refused
// handshake.
func refused(t *testing.T, n *node, query string, h http.Header) (int, string) {
	t.Helper()
	ws, resp, err := dialRaw(n.wsURL(query), h)
	if err == nil {
		ws.Close()
		t.Fatalf("handshake accepted, want it refused")
	}
	if resp == nil {
		t.Fatalf("no HTTP response: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestAuth(t *testing.T) {
	e := newEnv(t)
	priv, pubPEM := rsaKey(t)
	n := e.newNode(func(c *Config) { c.Auth.PublicKeyPEM = pubPEM })
	hour := time.Now().Add(time.Hour)
	bearer := func(tok string) http.Header { return http.Header{"Authorization": {"Bearer " + tok}} }

	t.Run("HS256 header", func(t *testing.T) {
		c := n.dial(t, sign(t, jwt.SigningMethodHS256, testSecret, claims("u1", []string{"r"}, hour)), "s")
		if c.hello.User != "u1" {
			t.Fatalf("hello: %s", c.hello.raw)
		}
		c.join("r")
	})
	t.Run("RS256 subprotocol", func(t *testing.T) {
		tok := sign(t, jwt.SigningMethodRS256, priv, claims("u2", []string{"r*"}, hour))
		h := http.Header{"Sec-Websocket-Protocol": {Subprotocol + ", " + TokenSubprotocolPrefix + tok}}
		c := n.dialWith(t, "session=s", h)
		if got := c.ws.Subprotocol(); got != Subprotocol {
			t.Fatalf("selected subprotocol %q, want %q (never the token)", got, Subprotocol)
		}
		if c.hello.User != "u2" {
			t.Fatalf("hello: %s", c.hello.raw)
		}
		c.join("r2")
	})
	t.Run("subprotocols without presence.v1", func(t *testing.T) {
		tok := sign(t, jwt.SigningMethodHS256, testSecret, claims("u4", []string{"r"}, hour))
		h := http.Header{"Sec-Websocket-Protocol": {"chat, " + TokenSubprotocolPrefix + tok}}
		code, body := refused(t, n, "session=s", h)
		if code != http.StatusBadRequest || !strings.Contains(body, Subprotocol) {
			t.Fatalf("got %d %q, want 400 naming %s", code, body, Subprotocol)
		}
	})
	t.Run("query parameter", func(t *testing.T) {
		tok := sign(t, jwt.SigningMethodHS256, testSecret, claims("u3", nil, hour))
		c := n.dialWith(t, "session=s&"+TokenQueryParam+"="+url.QueryEscape(tok), http.Header{})
		c.send(map[string]string{"type": "join", "room": "r", "ref": "x"})
		c.expectError(protocol.CodeForbidden, "x") // no rooms claim: no rooms
	})

	cases := []struct {
		name  string
		query string
		h     http.Header
		want  string
	}{
		{"expired", "session=s", bearer(sign(t, jwt.SigningMethodHS256, testSecret, claims("u", nil, time.Now().Add(-time.Minute)))), "token is expired"},
		{"no exp", "session=s", bearer(sign(t, jwt.SigningMethodHS256, testSecret, Claims{RegisteredClaims: jwt.RegisteredClaims{Subject: "u"}})), "no exp claim"},
		{"wrong secret", "session=s", bearer(sign(t, jwt.SigningMethodHS256, []byte("another-secret-another-secret-32b"), claims("u", nil, hour))), "signature is invalid"},
		// The public key used as an HMAC secret: the classic algorithm confusion.
		{"alg confusion", "session=s", bearer(sign(t, jwt.SigningMethodHS256, pubPEM, claims("u", nil, hour))), "signature is invalid"},
		{"alg none", "session=s", bearer(sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, claims("u", nil, hour))), "signature is invalid"},
		{"HS512", "session=s", bearer(sign(t, jwt.SigningMethodHS512, testSecret, claims("u", nil, hour))), "signature is invalid"},
		{"malformed", "session=s", bearer("not-a-jwt"), "malformed"},
		{"bad sub", "session=s", bearer(sign(t, jwt.SigningMethodHS256, testSecret, claims("a.b", nil, hour))), "sub is not a valid user id"},
		{"bad room pattern", "session=s", bearer(sign(t, jwt.SigningMethodHS256, testSecret, claims("u", []string{"team:*"}, hour))), "rooms claim"},
		{"star inside", "session=s", bearer(sign(t, jwt.SigningMethodHS256, testSecret, claims("u", []string{"a*b"}, hour))), "rooms claim"},
		{"no token", "session=s", http.Header{}, "no token"},
		{"dev user ignored", "session=s&user=u", http.Header{}, "no token"},
	}
	for _, k := range cases {
		t.Run(k.name, func(t *testing.T) {
			code, body := refused(t, n, k.query, k.h)
			if code != http.StatusUnauthorized || !strings.HasPrefix(body, "node: auth: ") || !strings.Contains(body, k.want) {
				t.Fatalf("got %d %q, want 401 mentioning %q", code, body, k.want)
			}
		})
	}
}

func TestRoomPatterns(t *testing.T) {
	id := &identity{user: "u", rooms: []string{"lobby", "team7-*"}}
	for room, want := range map[string]bool{"lobby": true, "lobby2": false, "team7-": true, "team7-x": true, "team7": false, "team8-x": false} {
		t.Run("allowed "+room, func(t *testing.T) {
			if got := id.allowed(room); got != want {
				t.Errorf("allowed(%q) = %v, want %v", room, got, want)
			}
		})
	}
	if !(&identity{rooms: []string{"*"}}).allowed("anything") {
		t.Error("* does not match everything")
	}
	for _, p := range []string{"*", "a*", "lobby", "a-b_c*"} {
		t.Run("valid "+p, func(t *testing.T) {
			if err := checkRoomPattern(p); err != nil {
				t.Errorf("checkRoomPattern(%q) = %v", p, err)
			}
		})
	}
	for _, p := range []string{"", "**", "a**", "*a", "a*b", "a.b*", "a:*"} {
		t.Run("invalid "+p, func(t *testing.T) {
			if err := checkRoomPattern(p); err == nil {
				t.Errorf("checkRoomPattern(%q) accepted", p)
			}
		})
	}
}

func TestInsecureDevMode(t *testing.T) {
	e := newEnv(t)
	var logs testkit.LockedBuffer
	n := e.newNode(func(c *Config) {
		c.Auth = AuthConfig{InsecureDev: true}
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "INSECURE") {
		t.Fatalf("no startup warning: %s", logs.String())
	}
	c := n.dialWith(t, "session=s&user=dev_user", http.Header{})
	if c.hello.User != "dev_user" {
		t.Fatalf("hello: %s", c.hello.raw)
	}
	c.join("any-room")
	if code, body := refused(t, n, "session=s", http.Header{}); code != http.StatusUnauthorized || !strings.Contains(body, "?user=") {
		t.Fatalf("dev mode without user: %d %s", code, body)
	}
}

package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/lestrrat-go/jwx/v3/jwk"

	"github.com/presence-dev/presence/internal/testkit"
)

// jwksServer is an identity provider's JWKS endpoint, a real HTTP server
// whose answer the test changes.
type jwksServer struct {
	*httptest.Server
	mu     sync.Mutex
	status int
	body   []byte
	hits   int
}

func newJWKSServer(t *testing.T) *jwksServer {
	t.Helper()
	s := &jwksServer{status: http.StatusOK, body: []byte(`{"keys":[]}`)}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.hits++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(s.status)
		_, _ = w.Write(s.body)
	}))
	t.Cleanup(s.Close)
	return s
}

// publish makes the set hold exactly these keys.
func (s *jwksServer) publish(t *testing.T, keys ...*jwksKey) {
	t.Helper()
	set := jwk.NewSet()
	for _, k := range keys {
		if err := set.AddKey(k.pub); err != nil {
			t.Fatal(err)
		}
	}
	b, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	s.answer(http.StatusOK, b)
}

func (s *jwksServer) answer(status int, body []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status, s.body = status, body
}

func (s *jwksServer) requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hits
}

// jwksKey is a signing key an identity provider publishes by kid.
type jwksKey struct {
	kid  string
	priv any
	pub  jwk.Key
}

// newJWKSKey makes a key of a kind (see newTestKey) published as kid,
// with "use":"sig" and, when alg is set, that "alg".
func newJWKSKey(t *testing.T, kind, kid string, alg jwa.SignatureAlgorithm) *jwksKey {
	t.Helper()
	k := newTestKey(t, kind)
	pub, err := jwk.Import(k.pub)
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]any{jwk.KeyIDKey: kid, jwk.KeyUsageKey: "sig"} {
		if err := pub.Set(name, v); err != nil {
			t.Fatal(err)
		}
	}
	if alg.String() != "" {
		if err := pub.Set(jwk.AlgorithmKey, alg); err != nil {
			t.Fatal(err)
		}
	}
	return &jwksKey{kid: kid, priv: k.priv, pub: pub}
}

// token signs a token for user with the key, its kid in the header.
func (k *jwksKey) token(t *testing.T, user string) string {
	t.Helper()
	s, err := Grant{User: user, Rooms: []string{"r"}, TTL: time.Hour, KeyID: k.kid}.Sign(k.priv, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// fakeClock is the JWKS rate limiter's clock, moved by the test.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// jwksAuth makes an authenticator on the server's JWKS, its refetch
// clock a fake one, and waits for the first fetch unless the server is
// meant to fail it.
func jwksAuth(t *testing.T, s *jwksServer, refresh time.Duration, waitReady bool) (*authenticator, *fakeClock) {
	t.Helper()
	a := quietAuth(t, AuthConfig{JWKSURL: s.URL + "/.well-known/jwks.json", JWKSRefresh: refresh})
	clk := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	a.jwks.now = clk.Now
	if waitReady {
		testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error { return fetched(a) })
	}
	return a, clk
}

// accepts fails the test unless the token is accepted for user.
func accepts(t *testing.T, a *authenticator, tok, user string) {
	t.Helper()
	id, err := a.parse(tok)
	if err != nil {
		t.Fatalf("token refused: %v", err)
	}
	if id.user != user {
		t.Fatalf("token for %q read as %q", user, id.user)
	}
}

// refuses fails the test unless the token is refused with an auth
// error mentioning want.
func refuses(t *testing.T, a *authenticator, tok, want string) {
	t.Helper()
	_, err := a.parse(tok)
	if _, ok := err.(*authError); !ok || !strings.Contains(err.Error(), want) {
		t.Fatalf("got %v, want an auth error mentioning %q", err, want)
	}
}

// A rotation (a new kid published, the old one removed) is followed
// without a restart: the first token with the new kid fetches the set at
// once, after which the old key's tokens are refused. A second rotation
// within the refetch interval waits for it.
func TestJWKSRotation(t *testing.T) {
	s := newJWKSServer(t)
	a1 := newJWKSKey(t, "rsa", "a1", jwa.RS256())
	b2 := newJWKSKey(t, "ec", "b2", jwa.ES256())
	c3 := newJWKSKey(t, "ed25519", "c3", jwa.EdDSA())
	s.publish(t, a1)
	a, clk := jwksAuth(t, s, time.Hour, true)
	oldTok := a1.token(t, "alice")
	accepts(t, a, oldTok, "alice")

	s.publish(t, b2)
	before := s.requests()
	accepts(t, a, b2.token(t, "bob"), "bob")
	if got := s.requests() - before; got != 1 {
		t.Fatalf("the new kid cost %d fetches, want 1", got)
	}
	refuses(t, a, oldTok, `kid "a1" is not in the JWKS`)

	s.publish(t, c3)
	clk.Add(jwksRefetchEvery - time.Second)
	refuses(t, a, c3.token(t, "carol"), `kid "c3" is not in the JWKS`)
	clk.Add(time.Second)
	accepts(t, a, c3.token(t, "carol"), "carol")
	refuses(t, a, b2.token(t, "bob"), `kid "b2" is not in the JWKS`)
}

// Without any token naming a new kid, the set is fetched again every
// refresh: a removed key's tokens are refused within it.
func TestJWKSPeriodicRefresh(t *testing.T) {
	s := newJWKSServer(t)
	a1 := newJWKSKey(t, "ec", "a1", jwa.ES256())
	s.publish(t, a1, newJWKSKey(t, "ec", "keep", jwa.ES256()))
	a, _ := jwksAuth(t, s, time.Second, true)
	tok := a1.token(t, "alice")
	accepts(t, a, tok, "alice")
	s.publish(t, newJWKSKey(t, "ec", "keep", jwa.ES256()))
	testkit.CheckFor(t, 15*time.Second, 10*time.Millisecond, func() error {
		if _, err := a.parse(tok); err == nil || !strings.Contains(err.Error(), `kid "a1" is not in the JWKS`) {
			return fmt.Errorf("a1's token after the periodic refresh: %v, want refused", err)
		}
		return nil
	})
}

// A flood of tokens with made-up kids costs the provider one fetch per
// interval, however many arrive at once.
func TestJWKSUnknownKidRateLimited(t *testing.T) {
	s := newJWKSServer(t)
	k := newJWKSKey(t, "ed25519", "k", jwa.EdDSA())
	s.publish(t, k)
	a, _ := jwksAuth(t, s, time.Hour, true)
	before := s.requests()
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for i := range 50 {
		wg.Go(func() {
			fake := &jwksKey{kid: fmt.Sprintf("made-up-%d", i), priv: k.priv}
			_, err := a.parse(fake.token(t, "mallory"))
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err == nil || !strings.Contains(err.Error(), "is not in the JWKS") {
			t.Fatalf("made-up kid: %v", err)
		}
	}
	if got := s.requests() - before; got != 1 {
		t.Fatalf("50 made-up kids cost %d fetches, want 1", got)
	}
	accepts(t, a, k.token(t, "alice"), "alice")
}

// A provider down at start, or answering garbage or 500, gets tokens
// refused with a clear error until it answers a set; once it has, a
// later failure keeps the last good keys.
func TestJWKSProviderDown(t *testing.T) {
	k := newJWKSKey(t, "rsa", "k", jwa.RS256())
	for name, fail := range map[string]func(*jwksServer){
		"500":       func(s *jwksServer) { s.answer(http.StatusInternalServerError, []byte("oops")) },
		"garbage":   func(s *jwksServer) { s.answer(http.StatusOK, []byte("<html>not json</html>")) },
		"not a set": func(s *jwksServer) { s.answer(http.StatusOK, []byte(`{"keys":[{"kty":"nope"}]}`)) },
		"too big": func(s *jwksServer) {
			s.answer(http.StatusOK, []byte(`{"keys":[],"pad":"`+strings.Repeat("x", jwksMaxBytes)+`"}`))
		},
		"404":          func(s *jwksServer) { s.answer(http.StatusNotFound, nil) },
		"many keys":    func(s *jwksServer) { s.answer(http.StatusOK, manyKeys(t, jwksMaxKeys+1)) },
		"empty answer": func(s *jwksServer) { s.answer(http.StatusOK, nil) },
	} {
		t.Run(name, func(t *testing.T) {
			s := newJWKSServer(t)
			fail(s)
			a, clk := jwksAuth(t, s, time.Hour, false)
			testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error { return testkit.AtLeast("JWKS fetches tried", s.requests(), 1) })
			refuses(t, a, k.token(t, "alice"), "no signing keys yet")

			s.publish(t, k)
			clk.Add(jwksRefetchEvery)
			accepts(t, a, k.token(t, "alice"), "alice")

			fail(s)
			clk.Add(jwksRefetchEvery)
			before := s.requests()
			refuses(t, a, (&jwksKey{kid: "other", priv: k.priv}).token(t, "alice"), `kid "other" is not in the JWKS`)
			if s.requests() == before {
				t.Fatal("the unknown kid fetched nothing")
			}
			accepts(t, a, k.token(t, "alice"), "alice")
		})
	}
}

// manyKeys is a set of n EC keys.
func manyKeys(t *testing.T, n int) []byte {
	t.Helper()
	set := jwk.NewSet()
	k := newJWKSKey(t, "ec", "x", jwa.ES256())
	for i := range n {
		c, err := k.pub.Clone()
		if err != nil {
			t.Fatal(err)
		}
		_ = c.Set(jwk.KeyIDKey, fmt.Sprintf("k%d", i))
		_ = set.AddKey(c)
	}
	b, _ := json.Marshal(set)
	return b
}

// A provider whose server is gone: refused, no panic.
func TestJWKSServerGone(t *testing.T) {
	s := newJWKSServer(t)
	s.Close()
	a, _ := jwksAuth(t, s, time.Hour, false)
	refuses(t, a, newJWKSKey(t, "ec", "k", jwa.ES256()).token(t, "alice"), "no signing keys yet")
}

// A key may verify only tokens of its own algorithm and type, for
// signatures; a JWKS never supplies an HMAC secret.
func TestJWKSKeyMismatch(t *testing.T) {
	s := newJWKSServer(t)
	wrongAlg := newJWKSKey(t, "rsa", "rs512", jwa.RS512())
	noAlg := newJWKSKey(t, "ec", "ec-no-alg", jwa.EmptySignatureAlgorithm())
	enc := newJWKSKey(t, "rsa", "enc", jwa.EmptySignatureAlgorithm())
	_ = enc.pub.Set(jwk.KeyUsageKey, "enc")
	p384 := newJWKSKey(t, "ec384", "p384", jwa.EmptySignatureAlgorithm())
	oct, err := jwk.Import(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	_ = oct.Set(jwk.KeyIDKey, "oct")
	s.publish(t, wrongAlg, noAlg, enc, p384, &jwksKey{pub: oct})
	a, _ := jwksAuth(t, s, time.Hour, true)

	accepts(t, a, noAlg.token(t, "alice"), "alice")
	rsaPriv := wrongAlg.priv
	refuses(t, a, wrongAlg.token(t, "u"), `JWKS key "rs512" is for RS512, the token is signed with RS256`)
	// An RSA key's kid on a token the EC key signed, and the reverse.
	refuses(t, a, (&jwksKey{kid: "ec-no-alg", priv: rsaPriv}).token(t, "u"), `JWKS key "ec-no-alg" verifies ES256, the token is signed with RS256`)
	refuses(t, a, enc.token(t, "u"), `JWKS key "enc" is for "enc", not signatures`)
	refuses(t, a, (&jwksKey{kid: "p384", priv: noAlg.priv}).token(t, "u"), "ES256 needs P-256")
	refuses(t, a, (&jwksKey{kid: "oct", priv: rsaPriv}).token(t, "u"), "symmetric key")
	// HS256 is not accepted at all with only a JWKS: an "oct" key is
	// never an HMAC secret.
	refuses(t, a, (&jwksKey{kid: "oct", priv: testSecret}).token(t, "u"), "algorithm is not accepted")
	refuses(t, a, (&jwksKey{priv: noAlg.priv}).token(t, "u"), "no kid header")
}

// A JWKS beside a secret and a PEM key: each token is checked with the
// key of its algorithm, and a kid the JWKS lacks falls back to the PEM
// key of the token's algorithm.
func TestJWKSBesideStaticKeys(t *testing.T) {
	s := newJWKSServer(t)
	fromIDP := newJWKSKey(t, "rsa", "idp", jwa.RS256())
	s.publish(t, fromIDP)
	pemKey := newTestKey(t, "rsa")
	a := quietAuth(t, AuthConfig{HMACSecret: testSecret, PublicKeyPEM: pemKey.pubPEM, JWKSURL: s.URL})
	accepts(t, a, fromIDP.token(t, "idp_user"), "idp_user")
	accepts(t, a, (&jwksKey{priv: pemKey.priv}).token(t, "pem_user"), "pem_user")
	accepts(t, a, (&jwksKey{kid: "backend-1", priv: pemKey.priv}).token(t, "pem_kid"), "pem_kid")
	accepts(t, a, (&jwksKey{priv: testSecret}).token(t, "hs_user"), "hs_user")
	refuses(t, a, (&jwksKey{kid: "idp", priv: pemKey.priv}).token(t, "forged"), "signature is invalid")
}

func TestJWKSConfig(t *testing.T) {
	for _, k := range []struct {
		c          AuthConfig
		field, msg string
	}{
		{AuthConfig{JWKSURL: "ftp://idp.example/jwks"}, "auth: jwks url", "http:// or https://"},
		{AuthConfig{JWKSURL: "idp.example/jwks"}, "auth: jwks url", "http:// or https://"},
		{AuthConfig{JWKSURL: "https://"}, "auth: jwks url", "http:// or https://"},
		{AuthConfig{JWKSURL: "https://idp.example/jwks", JWKSRefresh: 500 * time.Millisecond}, "auth: jwks refresh", "at least 1s"},
	} {
		err := k.c.Validate()
		if err == nil || !strings.Contains(err.Error(), "config: "+k.field+": ") || !strings.Contains(err.Error(), k.msg) {
			t.Errorf("%+v: got %v, want %s: %s", k.c, err, k.field, k.msg)
		}
	}
}

// A node on an identity provider's JWKS: a client connects with the
// provider's token and joins; after a rotation, a refresh frame with a
// token of the new key is taken on the open connection, and a new
// connection with the removed key's token is refused before the upgrade.
func TestJWKSNode(t *testing.T) {
	s := newJWKSServer(t)
	old := newJWKSKey(t, "ec", "2024-old", jwa.ES256())
	s.publish(t, old)
	e := newEnv(t)
	n := e.newNode(func(c *Config) { c.Auth = AuthConfig{JWKSURL: s.URL, JWKSRefresh: time.Hour} })
	// A handshake before the first fetch has landed fetches again, and
	// the rotation's fetch would then wait out the refetch interval.
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error { return fetched(n.auth) })
	oldTok := old.token(t, "alice")
	c := n.dial(t, oldTok, "s")
	c.join("r")

	rotated := newJWKSKey(t, "ed25519", "2025-new", jwa.EdDSA())
	s.publish(t, rotated)
	c.send(map[string]string{"type": "refresh", "token": rotated.token(t, "alice"), "ref": "r1"})
	c.expect("refreshed")
	code, body := refused(t, n, "session=s2", http.Header{"Authorization": {"Bearer " + oldTok}})
	if code != http.StatusUnauthorized || !strings.Contains(body, `kid "2024-old" is not in the JWKS`) {
		t.Fatalf("the removed key's token: %d %q", code, body)
	}
	n.dial(t, rotated.token(t, "bob"), "s3").join("r")
}

// fetched is a poll's condition: a has fetched its JWKS once.
func fetched(a *authenticator) error {
	if a.jwks.res.Resource() == nil {
		return errors.New("the JWKS not fetched yet")
	}
	return nil
}

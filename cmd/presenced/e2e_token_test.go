package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/lestrrat-go/jwx/v3/jwk"

	"github.com/presence-dev/presence/internal/testkit"
)

// mintToken runs presenced token with args and returns what it printed.
func mintToken(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(binary, append([]string{"token"}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("presenced token %v: %v\n%s", args, err, stderr.String())
	}
	if stderr.Len() != 0 || strings.Count(string(out), "\n") != 1 {
		t.Fatalf("presenced token %v printed %q, stderr %q; want the token on one line", args, out, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// writeFile writes a file in the test's directory and returns its path.
func writeFile(t *testing.T, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// ecKeyFiles writes a P-256 key pair as PEM files: the private key for
// presenced token, the public key for a node.
func ecKeyFiles(t *testing.T) (priv, pub string, key *ecdsa.PrivateKey) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p8, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	pkix, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	priv = writeFile(t, "key.pem", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: p8}))
	pub = writeFile(t, "key.pub.pem", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pkix}))
	return priv, pub, k
}

// refusedWith sends a request and waits for the error frame of its ref.
func (c *client) refusedWith(req map[string]any, code string) {
	c.t.Helper()
	c.send(req)
	f := c.expect("error")
	if f["code"] != code || f["ref"] != req["ref"] {
		c.t.Fatalf("%v: got %v, want error %s", req, f, code)
	}
}

// The token the command prints is one a node takes: the user is its
// --user, the rooms and observe claims are the ones asked for, the
// connection ends at its --ttl.
func TestE2ETokenCommand(t *testing.T) {
	skipIfShort(t, "end-to-end test")
	e := newEnv(t)
	secretFile := writeFile(t, "secret", []byte(e2eSecret+"\n")) // as an editor leaves it
	n := e.startNode("--jwt-secret-file", secretFile)

	tok := mintToken(t, "--jwt-secret-file", secretFile, "--user", "alice", "--rooms", "room42,team7-*", "--ttl", "1h")
	c := dialURL(t, "ws://"+n.addr+"/v1/ws?session=tab&access_token="+url.QueryEscape(tok), "alice", "tab")
	c.join("room42")
	c.join("team7-x")
	c.refusedWith(map[string]any{"type": "join", "room": "team8", "ref": "t8"}, "forbidden")
	c.refusedWith(map[string]any{"type": "join", "room": "team7-y", "present": false, "ref": "obs"}, "forbidden")

	obs := mintToken(t, "--jwt-secret", e2eSecret, "--user", "lobby_screen", "--rooms", "*", "--observe", "--ttl", "2s")
	o := dialURL(t, "ws://"+n.addr+"/v1/ws?session=s&access_token="+url.QueryEscape(obs), "lobby_screen", "s")
	o.send(map[string]any{"type": "join", "room": "room42", "present": false, "ref": "o"})
	if snap := o.expect("snapshot")["snapshot"].(map[string]any); snap["total"] != float64(1) {
		t.Fatalf("the observer's snapshot: %v, want alice alone", snap)
	}
	if code := o.closeCode(); code != 4002 {
		t.Fatalf("the 2s token's connection closed with %d, want 4002 (token expired)", code)
	}
}

// A token signed with a private key (ES256 here) for a node holding its
// public key, with the issuer and audience the node requires.
func TestE2ETokenCommandPrivateKey(t *testing.T) {
	skipIfShort(t, "end-to-end test")
	e := newEnv(t)
	priv, pub, _ := ecKeyFiles(t)
	n := e.startNode("--jwt-public-key-file", pub, "--jwt-issuer", "https://app.example", "--jwt-audience", "presence")
	tok := mintToken(t, "--jwt-private-key-file", priv, "--user", "bob", "--rooms", "lobby",
		"--jwt-issuer", "https://app.example", "--jwt-audience", "presence")
	dialURL(t, "ws://"+n.addr+"/v1/ws?session=s&access_token="+url.QueryEscape(tok), "bob", "s").join("lobby")

	noIss := mintToken(t, "--jwt-private-key-file", priv, "--user", "bob", "--rooms", "lobby")
	if code, body := handshake(t, n.addr, noIss); code != http.StatusUnauthorized || !strings.Contains(body, "token has no iss claim") {
		t.Fatalf("a token without the node's issuer: %d %q", code, body)
	}
}

// handshake tries a WebSocket upgrade with tok and returns the refusal's
// status and body (101 when it was accepted).
func handshake(t *testing.T, addr, tok string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/ws?session=s", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return r.StatusCode, string(b)
}

// Every mistake on presenced token's command line is a usage error
// (exit 2) naming the flag, and prints no token.
func TestTokenCommandUsageErrors(t *testing.T) {
	secret := writeFile(t, "secret", []byte(e2eSecret))
	short := writeFile(t, "short", []byte("too-short"))
	notPEM := writeFile(t, "key.pem", []byte("not a key"))
	_, pub, _ := ecKeyFiles(t)
	ok := []string{"--user", "alice", "--rooms", "room42"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{ok, "give exactly one of --jwt-secret, --jwt-secret-file and --jwt-private-key-file"},
		{append([]string{"--jwt-secret", e2eSecret, "--jwt-secret-file", secret}, ok...), "give exactly one of"},
		{append([]string{"--jwt-secret-file", filepath.Join(t.TempDir(), "none")}, ok...), "--jwt-secret-file: open"},
		{append([]string{"--jwt-secret-file", short}, ok...), "--jwt-secret-file: an HS256 secret must be at least 32 bytes, got 9"},
		{append([]string{"--jwt-private-key-file", notPEM}, ok...), "no PEM block found"},
		{append([]string{"--jwt-private-key-file", pub}, ok...), `PEM block is "PUBLIC KEY"`},
		{[]string{"--jwt-secret-file", secret, "--rooms", "r"}, "--user: required"},
		{[]string{"--jwt-secret-file", secret, "--user", "a.b", "--rooms", "r"}, `--user: presence: invalid user id "a.b"`},
		{[]string{"--jwt-secret-file", secret, "--user", "u"}, "--rooms: required"},
		{[]string{"--jwt-secret-file", secret, "--user", "u", "--rooms", "team:*"}, `--rooms: pattern "team:*"`},
		{[]string{"--jwt-secret-file", secret, "--user", "u", "--rooms", "a*b"}, `--rooms: pattern "a*b"`},
		{[]string{"--jwt-secret-file", secret, "--user", "u", "--rooms", "a,,b"}, `--rooms: pattern ""`},
		{append([]string{"--jwt-secret-file", secret, "--ttl", "0s"}, ok...), "--ttl: must be at least 1s"},
		{append([]string{"--jwt-secret-file", secret, "--ttl", "-1h"}, ok...), "--ttl: must be at least 1s"},
		{append([]string{"--jwt-secret-file", secret, "--ttl", "soon"}, ok...), `invalid value "soon" for flag -ttl`},
		{append([]string{"--jwt-secret-file", secret}, append(ok, "extra")...), `unexpected argument "extra"`},
	} {
		cmd := exec.Command(binary, append([]string{"token"}, tc.args...)...)
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		ee, isExit := err.(*exec.ExitError)
		if !isExit || ee.ExitCode() != 2 || !strings.Contains(stderr.String(), tc.want) || stdout.Len() != 0 {
			t.Errorf("token %v: %v, stdout %q, stderr %q; want exit 2 naming %q and no token", tc.args, err, stdout.String(), stderr.String(), tc.want)
		}
	}
}

// jwksProvider is an identity provider's JWKS endpoint for the e2e
// tests: it publishes the public keys the test gives it.
func jwksProvider(t *testing.T, keys ...*ecdsa.PrivateKey) *httptest.Server {
	t.Helper()
	set := jwk.NewSet()
	for i, k := range keys {
		pub, err := jwk.Import(&k.PublicKey)
		if err != nil {
			t.Fatal(err)
		}
		_ = pub.Set(jwk.KeyIDKey, []string{"k1", "k2"}[i])
		_ = pub.Set(jwk.AlgorithmKey, jwa.ES256())
		_ = set.AddKey(pub)
	}
	body, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}))
	t.Cleanup(s.Close)
	return s
}

// A node on --jwks-url takes a token signed with the key its kid names;
// a node whose provider is down starts anyway, healthy, and says why it
// refuses such tokens; bad JWKS flags are usage errors.
func TestE2EJWKS(t *testing.T) {
	skipIfShort(t, "end-to-end test")
	e := newEnv(t)
	priv, _, key := ecKeyFiles(t)
	idp := jwksProvider(t, key)
	n := e.startNode("--jwks-url", idp.URL+"/.well-known/jwks.json", "--jwks-refresh", "1m")
	tok := mintToken(t, "--jwt-private-key-file", priv, "--kid", "k1", "--user", "carol", "--rooms", "lobby")
	dialURL(t, "ws://"+n.addr+"/v1/ws?session=s&access_token="+url.QueryEscape(tok), "carol", "s").join("lobby")
	if code, body := handshake(t, n.addr, mintToken(t, "--jwt-private-key-file", priv, "--kid", "k9", "--user", "carol", "--rooms", "lobby")); code != http.StatusUnauthorized || !strings.Contains(body, `kid "k9" is not in the JWKS`) {
		t.Fatalf("an unknown kid: %d %q", code, body)
	}

	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	d := e.startNode("--jwks-url", down.URL)
	if code, body := handshake(t, d.addr, tok); code != http.StatusUnauthorized || !strings.Contains(body, "no signing keys yet") {
		t.Fatalf("a token while the provider is down: %d %q", code, body)
	}
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if !strings.Contains(d.out.String(), "JWKS fetch") {
			return errors.New("the node has not logged the failed JWKS fetch")
		}
		return nil
	})

	expectUsageError(t, []string{"node", "--jwks-url", "idp.example/jwks"}, "auth: jwks url: want an http:// or https:// URL")
	expectUsageError(t, []string{"node", "--jwks-url", "https://idp.example/jwks", "--jwks-refresh", "10ms"}, "auth: jwks refresh: must be at least 1s")
	expectUsageError(t, []string{"node", "--jwt-public-key-file", priv}, `auth: public key: PEM block is "PRIVATE KEY"`)
}

// presenced dev and node --insecure-dev serve /dev/token; a node without
// --insecure-dev does not. A dev node with the region's secret signs its
// dev tokens with it, so the region's other nodes take them.
func TestE2EDevTokenEndpoint(t *testing.T) {
	skipIfShort(t, "end-to-end test")
	devTok := func(addr, query string) (int, string) {
		code, _, body := testkit.Get(t, "http://"+addr+"/dev/token?"+query, nil)
		return code, body
	}
	dev := startDev(t)
	code, tok := devTok(dev.addr, "user=alice&rooms=room42")
	if code != http.StatusOK {
		t.Fatalf("presenced dev's /dev/token: %d %q", code, tok)
	}
	dialURL(t, "ws://"+dev.addr+"/v1/ws?session=s&access_token="+url.QueryEscape(tok), "alice", "s").join("room42")
	if !strings.Contains(dev.out.String(), "/dev/token?user=") {
		t.Fatalf("presenced dev does not show its token endpoint:\n%s", dev.out.String())
	}

	e := newEnv(t)
	prod := e.startNode()
	if code, body := devTok(prod.addr, "user=alice"); code != http.StatusNotFound {
		t.Fatalf("a node without --insecure-dev: /dev/token answers %d %q, want 404", code, body)
	}
	insecure := e.startNode("--insecure-dev")
	code, tok = devTok(insecure.addr, "user=bob&rooms=team7-*")
	if code != http.StatusOK {
		t.Fatalf("node --insecure-dev's /dev/token: %d %q", code, tok)
	}
	c := dialURL(t, "ws://"+prod.addr+"/v1/ws?session=s&access_token="+url.QueryEscape(tok), "bob", "s")
	c.join("team7-a")
	c.refusedWith(map[string]any{"type": "join", "room": "room42", "ref": "r"}, "forbidden")
}

// The command's token connects a browser client: the page's getToken
// returns it, the client opens and joins its room.
func TestBrowserTokenCommand(t *testing.T) {
	b := newBrowser(t)
	n := startSecured(t)
	pg := newTestPage(t, n.addr)
	pg.serveToken(mintToken(t, "--jwt-secret", e2eSecret, "--user", "alice", "--rooms", "br-token,team7-*"))
	tb := b.open("alice", pg.url(link(t, n.addr), pageOpts{room: "br-token", tokens: true}), true)
	v := tb.waitSynced()
	if !slices.Equal(v.users(), []string{"alice"}) || v.Tokens < 1 {
		t.Fatalf("the page's view: %s", v)
	}
	tb.noConsoleErrors()
}

// A local app on another origin needs no backend: its getToken fetches
// the dev node's /dev/token, and the client opens and joins as the user
// the token names, with the rooms it grants.
func TestBrowserDevToken(t *testing.T) {
	b := newBrowser(t)
	n := startDev(t)
	pg := newTestPage(t, n.addr)
	tokenURL := "http://" + n.addr + "/dev/token?user=dora&rooms=br-dev-*"
	tb := b.open("dora", pg.url(link(t, n.addr), pageOpts{room: "br-dev-1", tokenURL: tokenURL}), true)
	v := tb.waitSynced()
	if !slices.Equal(v.users(), []string{"dora"}) || v.Tokens < 1 {
		t.Fatalf("the page's view: %s", v)
	}
	var denied string
	tb.eval(`new Promise(ok => {
		client.on("error", e => e.code === "forbidden" && ok(e.code));
		client.room("elsewhere");
		setTimeout(() => ok("no error"), 4000);
	})`, &denied)
	if denied != "forbidden" {
		t.Fatalf("a room the dev token does not grant: %q, want forbidden", denied)
	}
	tb.noConsoleErrors()
}

package httpapi

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/presence-dev/presence/internal/apitest"
	"github.com/presence-dev/presence/internal/testkit"
)

func TestParseKeys(t *testing.T) {
	keys, err := ParseKeys("# keys\n\nreader:read:" + readSecret + "\n ops:admin:" + adminSecret + " , b:read:with:colons:in-the-secret-000\n")
	if err != nil || len(keys) != 3 || keys[0].Name != "reader" || keys[1].Scope != ScopeAdmin || keys[2].Name != "b" {
		t.Fatalf("keys %+v %v", keys, err)
	}
	for _, bad := range []string{
		"reader:read",                                      // no secret
		"reader:write:" + readSecret,                       // no such scope
		"read er:read:" + readSecret,                       // a bad name
		":read:" + readSecret,                              // no name
		"reader:read:short",                                // too short
		"reader:read:" + readSecret + "x y",                // whitespace
		"a:read:" + readSecret + "\na:read:" + adminSecret, // a name twice
		"a:read:" + readSecret + ",b:admin:" + readSecret,  // a secret twice
	} {
		if _, err := ParseKeys(bad); err == nil {
			t.Errorf("%q accepted", bad)
		} else if strings.Contains(err.Error(), "0123456789abcdef") {
			t.Errorf("%q: the error shows the secret: %v", bad, err)
		}
	}
}

// No key, an unknown one, a read key on an admin endpoint: 401, 401,
// 403, each a JSON error; the OpenAPI document needs none.
func TestKeysAndScopes(t *testing.T) {
	f := newFixture(t)
	anon := f.read.With("")
	r := anon.Get("/v1/rooms/room42/count")
	if _, msg := r.Error(t, 401); !strings.Contains(msg, "Authorization: Bearer") || !strings.HasPrefix(r.Header.Get("WWW-Authenticate"), "Bearer") {
		t.Fatalf("no key: %q %v", msg, r.Header)
	}
	r = anon.Do("GET", "/v1/rooms/room42/count", "", http.Header{"Authorization": {"Basic " + readSecret}})
	r.Error(t, 401)
	if _, msg := f.read.With(readSecret+"x").Get("/v1/rooms/room42/count").Error(t, 401); msg != "unknown API key" {
		t.Fatalf("wrong key: %q", msg)
	}
	if _, msg := f.read.Post("/v1/users/alice/disconnect", "").Error(t, 403); !strings.Contains(msg, `key "reader" has scope read; this endpoint needs admin`) {
		t.Fatalf("read key on admin: %q", msg)
	}
	if f.drops.Len() != 0 {
		t.Fatal("a refused disconnect told the nodes")
	}
	if r := f.admin.Get("/v1/rooms/room42/count"); r.Status != 200 {
		t.Fatalf("admin key on a read endpoint: %d", r.Status)
	}
	r = anon.Get(PathOpenAPI)
	if r.Status != 200 || !strings.HasPrefix(string(r.Body), "openapi: 3.1") || r.Header.Get("Content-Type") != "application/yaml" {
		t.Fatalf("openapi: %d %v", r.Status, r.Header)
	}
}

// With no key configured the API is off, and says so.
func TestNoKeysMeansTheAPIIsOff(t *testing.T) {
	f := newFixture(t, func(c *Config) {
		k, err := NewKeys("", "", quiet)
		if err != nil {
			t.Fatal(err)
		}
		c.Keys = k
	})
	for _, path := range []string{"/v1/rooms/room42/count", "/v1/rooms"} {
		if _, msg := f.read.Get(path).Error(t, 404); !strings.Contains(msg, "the HTTP API is off: no API key is configured") {
			t.Fatalf("%s: %q", path, msg)
		}
	}
	if r := f.read.Get(PathOpenAPI); r.Status != 200 {
		t.Fatalf("openapi with the API off: %d", r.Status)
	}
}

// A flood gets 429 with Retry-After; the key's bucket refills with time
// and other keys are not held back.
func TestRateLimitPerKey(t *testing.T) {
	clk := &clock{t: time.Unix(1_800_000_000, 0)}
	f := newFixture(t, func(c *Config) { c.Rate, c.Burst, c.now = 2, 3, clk.now })
	for range 3 {
		if r := f.read.Get("/v1/rooms/room42/count"); r.Status != 200 {
			t.Fatalf("within the burst: %d %s", r.Status, r.Body)
		}
	}
	r := f.read.Get("/v1/rooms/room42/count")
	if _, msg := r.Error(t, 429); r.Header.Get("Retry-After") != "1" || !strings.Contains(msg, `key "reader" is over its rate limit (2 requests/s, burst 3)`) {
		t.Fatalf("flood: %q, Retry-After %q", msg, r.Header.Get("Retry-After"))
	}
	if r := f.admin.Get("/v1/rooms/room42/count"); r.Status != 200 {
		t.Fatalf("another key: %d", r.Status)
	}
	clk.advance(500 * time.Millisecond) // one request back at 2/s
	if r := f.read.Get("/v1/rooms/room42/count"); r.Status != 200 {
		t.Fatalf("after the refill: %d", r.Status)
	}
	f.read.Get("/v1/rooms/room42/count").Error(t, 429)
}

func TestCORS(t *testing.T) {
	origin := http.Header{"Origin": {"https://console.example.com"}}
	off := newFixture(t)
	if r := off.read.Do("GET", "/v1/rooms/room42/count", "", origin); r.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatal("CORS headers with no origin configured")
	}
	f := newFixture(t, func(c *Config) { c.CORSOrigins = []string{"https://console.example.com"} })
	r := f.read.Do("GET", "/v1/rooms/room42/count", "", origin)
	if r.Status != 200 || r.Header.Get("Access-Control-Allow-Origin") != "https://console.example.com" || r.Header.Get("Vary") != "Origin" {
		t.Fatalf("allowed origin: %d %v", r.Status, r.Header)
	}
	pre := f.read.With("").Do("OPTIONS", "/v1/users/alice/disconnect", "", http.Header{"Origin": origin["Origin"], "Access-Control-Request-Method": {"POST"}})
	if pre.Status != 204 || !strings.Contains(pre.Header.Get("Access-Control-Allow-Headers"), "Authorization") || pre.Header.Get("Access-Control-Allow-Methods") != "GET, POST" {
		t.Fatalf("preflight: %d %v", pre.Status, pre.Header)
	}
	other := f.read.Do("GET", "/v1/rooms/room42/count", "", http.Header{"Origin": {"https://evil.example.com"}})
	if other.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatal("CORS headers for an origin not configured")
	}
	if _, err := New(Config{Query: f.api.cfg.Query, Disconnect: f.api.cfg.Disconnect, Keys: f.api.cfg.Keys, CORSOrigins: []string{"console.example.com"}}); err == nil {
		t.Fatal("an origin without a scheme accepted")
	}
}

// A body over the limit is refused with 413, whether it says its length
// or not.
func TestBodyOverTheLimit(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.MaxBodyBytes = 1024 })
	big := `{"rooms":["` + strings.Repeat("r", 2000) + `"]}`
	f.read.Post("/v1/rooms:batch-count", big).Error(t, 413)
	// Chunked: no Content-Length, the limit stops the read.
	req, _ := http.NewRequest("POST", f.srv.URL+"/v1/rooms:batch-count", struct{ *strings.Reader }{strings.NewReader(big)})
	req.Header.Set("Authorization", "Bearer "+readSecret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 413 || req.ContentLength != 0 {
		t.Fatalf("chunked: %d (content length %d)", resp.StatusCode, req.ContentLength)
	}
}

// A client that sends its body too slowly gets 408 and its connection
// closed once the read timeout passes.
func TestSlowBodyTimesOut(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.ReadTimeout = 300 * time.Millisecond })
	conn, err := net.Dial("tcp", strings.TrimPrefix(f.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	_, _ = conn.Write([]byte("POST /v1/rooms:batch-count HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + readSecret +
		"\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n{\"rooms\""))
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	req, _ := http.NewRequest("POST", f.srv.URL+"/v1/rooms:batch-count", nil)
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body := make([]byte, 512)
	n, _ := resp.Body.Read(body)
	took := time.Since(start)
	v := &apitest.Response{Status: resp.StatusCode, Header: resp.Header, Body: body[:n]}
	if err := f.read.Validate(req, v); err != nil {
		t.Errorf("408 not as documented: %v", err)
	}
	if _, msg := v.Error(t, 408); !strings.Contains(msg, "did not arrive within 300ms") || took < 250*time.Millisecond {
		t.Fatalf("%q after %v", msg, took)
	}
}

// The key file is read again when it changes: a new key works at once,
// the removed one no longer; a broken file keeps the keys in force.
func TestKeysFileIsReloaded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	write := func(s string) {
		if err := os.WriteFile(path+".tmp", []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil { // as a Secret's volume swaps it
			t.Fatal(err)
		}
	}
	write("old:read:" + readSecret + "\n")
	logs := &testkit.LockedBuffer{}
	keys, err := NewKeys("", path, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil || keys.Len() != 1 {
		t.Fatalf("keys: %v", err)
	}
	f := newFixture(t, func(c *Config) { c.Keys = keys })
	go keys.Watch(t.Context(), 20*time.Millisecond)
	newSecret := "rotated-secret-0123456789abcdef"
	write("new:read:" + newSecret + "\n")
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if _, ok := keys.lookup(newSecret); !ok {
			return errors.New("the new key is not in force yet")
		}
		return nil
	})
	if r := f.read.With(newSecret).Get("/v1/rooms/room42/count"); r.Status != 200 {
		t.Fatalf("new key: %d", r.Status)
	}
	f.read.Get("/v1/rooms/room42/count").Error(t, 401)
	write("broken")
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if !strings.Contains(logs.String(), "api keys file not reloaded") {
			return fmt.Errorf("no failed reload of the broken file logged; the log: %q", logs.String())
		}
		return nil
	})
	if r := f.read.With(newSecret).Get("/v1/rooms/room42/count"); r.Status != 200 {
		t.Fatalf("after a broken file: %d", r.Status)
	}
	if _, err := NewKeys("", filepath.Join(t.TempDir(), "missing"), quiet); err == nil {
		t.Fatal("a missing keys file accepted at start")
	}
	if _, err := NewKeys("x:read:"+readSecret, path, quiet); err == nil {
		t.Fatal("a broken keys file accepted at start")
	}
}

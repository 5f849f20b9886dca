package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/apitest"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/presence"
)

// Keys of the end-to-end tests.
const (
	e2eReadKey  = "e2e-read-0123456789abcdef0123"
	e2eAdminKey = "e2e-admin-0123456789abcdef0123"
)

// apiKeysFile writes a keys file holding both keys.
func apiKeysFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "api-keys")
	body := "# the end-to-end tests' keys\nbackend:read:" + e2eReadKey + "\nops:admin:" + e2eAdminKey + "\n"
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// runReadme runs the README's "From your backend" curl commands against
// base, with what they print checked against docs/openapi.yaml, and
// returns each one's response by its path. Disconnects run only with
// disconnects set.
func runReadme(t *testing.T, base string, disconnects bool) map[string]*apitest.Response {
	t.Helper()
	vars := map[string]string{"PRESENCE": base, "KEY": e2eReadKey, "ADMIN_KEY": e2eAdminKey,
		"UNTIL": time.Now().Add(time.Hour).UTC().Format(time.RFC3339)}
	cl := apitest.New(t, base, "")
	out := map[string]*apitest.Response{}
	calls := readmeCurls(t, "## From your backend", vars)
	if len(calls) != 8 {
		t.Fatalf("the README shows %d curl commands, want 8 (one per endpoint)", len(calls))
	}
	for _, c := range calls {
		path := strings.TrimPrefix(c.url, base)
		if strings.HasSuffix(path, "/disconnect") != disconnects {
			continue
		}
		r := cl.Do(c.method, path, c.body, c.header)
		if r.Status != 200 {
			t.Fatalf("README %s: %d %s", c.line, r.Status, r.Body)
		}
		out[strings.SplitN(path, "?", 2)[0]] = r
	}
	return out
}

var nodeAPIOn = regexp.MustCompile(`msg="presenced: HTTP API on" view=eu keys=2`)

// A backend with only curl and an API key: on a node (its region) and on
// the aggregator (the global view) it lists a room's members, reads a
// count, a user with last seen, lists rooms, counts several, and
// disconnects users, as the README shows; the clients are closed as
// docs/PROTOCOL.md says. Every response is checked against
// docs/openapi.yaml.
func TestE2EHTTPAPIAsTheReadmeShows(t *testing.T) {
	skipIfShort(t, "http api: a node, an aggregator and clients")
	e := newEnv(t)
	keys := apiKeysFile(t)
	agg := e.start([]string{"aggregator", "--nats", e.nats, "--cadence", "300ms", "--regions", "eu", "--listen", "127.0.0.1:0",
		"--api-keys-file", keys}, false)
	aggAddr := waitAggregatorOK(t, agg)
	a := e.startNode("--global", "--global-cadence", "300ms", "--api-keys-file", keys)
	b := e.startEnv([]string{"node", "--region", "eu", "--redis", e.redis, "--nats", e.nats, "--listen", "127.0.0.1:0",
		"--jwt-secret", e2eSecret, "--session-ttl", e2eTTL.String(), "--heartbeat", e2eBeat.String(),
		"--offline-grace", e2eGrace.String(), "--reap-interval", e2eReap.String(), "--global", "--global-cadence", "300ms"},
		[]string{"PRESENCE_API_KEYS=backend:read:" + e2eReadKey + ",ops:admin:" + e2eAdminKey}, true)
	for _, p := range []*proc{a, b} {
		if !nodeAPIOn.MatchString(p.out.String()) {
			t.Fatalf("a node with keys does not say its API is on:\n%s", p.out.String())
		}
	}

	alice := dial(t, a.addr, "alice", "tab1")
	alice.join("room42")
	alice.join("lobby")
	alice.send(map[string]any{"type": "state", "room": "room42", "state": map[string]string{"status": "away"}, "ref": "s"})
	alice.expect("state_set")
	bob := dial(t, b.addr, "bob", "phone")
	bob.join("room42")

	// The node's regional view, through node b: alice is on node a.
	got := runReadme(t, "http://"+b.addr, false)
	var snap presence.Snapshot
	got["/v1/rooms/room42/members"].JSON(t, &snap)
	if snap.Region != "eu" || snap.Total != 2 || snap.Members[0].User != "alice" || string(snap.Members[0].Sessions[0].State) != `{"status":"away"}` || snap.StreamSeq == 0 {
		t.Fatalf("members: %s", got["/v1/rooms/room42/members"].Body)
	}
	var u bus.UserReply
	got["/v1/rooms/room42/users/alice"].JSON(t, &u)
	if !u.Online || u.LastSeen == nil {
		t.Fatalf("alice: %+v", u)
	}
	var rooms bus.RoomsReply
	got["/v1/rooms"].JSON(t, &rooms)
	if len(rooms.Rooms) != 1 || rooms.Rooms[0] != (presence.RoomCount{Room: "room42", Count: 2}) {
		t.Fatalf("rooms: %+v", rooms)
	}
	var counts bus.CountsReply
	got["/v1/rooms:batch-count"].JSON(t, &counts)
	if len(counts.Rooms) != 2 || counts.Rooms[0].Count != 2 || counts.Rooms[1].Count != 1 {
		t.Fatalf("counts: %+v", counts)
	}

	// The global view, on the aggregator, once the region has published.
	global := apitest.New(t, "http://"+aggAddr, e2eReadKey)
	testkit.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		var c bus.CountReply
		r := global.Get("/v1/rooms/room42/count")
		r.JSON(t, &c)
		if r.Status != 200 || c.Count != 2 {
			return fmt.Errorf("the global count of room42: %d %d, want 200 and 2", r.Status, c.Count)
		}
		return nil
	})
	got = runReadme(t, "http://"+aggAddr, false)
	got["/v1/rooms/room42/users/alice"].JSON(t, &u)
	if u.Region != "global" || !u.Online || u.LastSeen == nil || strings.Join(u.Regions, ",") != "eu" {
		t.Fatalf("alice, globally: %s", got["/v1/rooms/room42/users/alice"].Body)
	}

	// Disconnects, as the README shows them, through the aggregator:
	// bob out of room42 (4003), alice out of everything until an hour
	// from now (4004), on whichever node they are.
	runReadme(t, "http://"+aggAddr, true)
	if code, _ := closeWith(t, bob); code != 4003 {
		t.Fatalf("bob closed with %d, want 4003", code)
	}
	if code, text := closeWith(t, alice); code != 4004 || !strings.HasPrefix(text, "revoked until ") {
		t.Fatalf("alice closed with %d %q, want 4004", code, text)
	}
	// alice is refused on both nodes; bob, disconnected without a
	// revocation, is back in room42.
	for _, p := range []*proc{a, b} {
		w := testkit.DialWS(t, "ws://"+p.addr+"/v1/ws?session=tab2&access_token="+token(t, "alice", "*"), nil, decodeMap)
		if code, _ := w.End(10 * time.Second); code != 4004 {
			t.Fatalf("alice reconnecting: %d, want 4004", code)
		}
	}
	bob = dial(t, b.addr, "bob", "phone")
	bob.join("room42")
}

// closeWith waits for c's close and returns its code and reason.
func closeWith(t *testing.T, c *client) (int, string) {
	t.Helper()
	_, err := c.w.End(10 * time.Second)
	if ce, ok := err.(*websocket.CloseError); ok {
		return ce.Code, ce.Text
	}
	t.Fatalf("%s ended with %v, no close frame", c.user, err)
	return 0, ""
}

// Hostile callers of a node's API: no key, a wrong one, a read key on an
// admin endpoint, a flood, bad input, a slow client; a node without keys
// says at start that its API is off, and answers so.
func TestE2EHTTPAPIRefusesHostileCallers(t *testing.T) {
	skipIfShort(t, "http api: two nodes")
	e := newEnv(t)
	n := e.startNode("--api-keys-file", apiKeysFile(t), "--api-rate", "1", "--api-burst", "3", "--http-header-timeout", "500ms")
	off := e.startNode()
	if !strings.Contains(off.out.String(), "HTTP API off: no API key configured") {
		t.Fatalf("a node without keys does not say its API is off:\n%s", off.out.String())
	}
	if _, msg := apitest.New(t, "http://"+off.addr, e2eReadKey).Get("/v1/rooms/room42/count").Error(t, 404); !strings.Contains(msg, "the HTTP API is off") {
		t.Fatalf("off: %q", msg)
	}

	base := "http://" + n.addr
	read, admin := apitest.New(t, base, e2eReadKey), apitest.New(t, base, e2eAdminKey)
	read.With("").Get("/v1/rooms/room42/count").Error(t, 401)
	read.With("not-a-key-0123456789abcdef").Get("/v1/rooms/room42/count").Error(t, 401)
	read.Post("/v1/users/alice/disconnect", "").Error(t, 403)
	admin.Post("/v1/users/a.b/disconnect", "").Error(t, 400)
	read.Get("/v1/rooms/a.b/count").Error(t, 400)
	read.Get("/v1/rooms/room42/members?limit=5000").Error(t, 400)
	read.Post("/v1/rooms:batch-count", `{"rooms":["`+strings.Repeat("r", 70_000)+`"]}`).Error(t, 413)
	// The read key spent its burst of 3 on the three calls above (the
	// refused keys and scope spend none): the fourth, at 1/s, waits.
	r := read.Get("/v1/rooms/room42/count")
	if _, msg := r.Error(t, 429); r.Header.Get("Retry-After") == "" || !strings.Contains(msg, "rate limit") {
		t.Fatalf("flood: %q %v", msg, r.Header)
	}

	// A client that never finishes its headers is cut off at the header
	// timeout, not held.
	conn, err := net.Dial("tcp", n.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	_, _ = conn.Write([]byte("GET /v1/rooms/room42/count HTTP/1.1\r\nHost: x\r\nAuthor"))
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = io.ReadAll(conn) // until the server closes it
	if took := time.Since(start); err != nil || took > 5*time.Second || took < 400*time.Millisecond {
		t.Fatalf("a slow client was cut off after %v (%v), want about 500ms", took, err)
	}
}

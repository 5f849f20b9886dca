package webhook

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

func TestParseConfigYAMLAndJSON(t *testing.T) {
	yaml := `
sources: [eu, global]
endpoints:
  - name: billing
    url: https://billing.example.com/presence
    secrets: [` + testSecret + `]
    rooms: ["support-*"]
    kinds: [online, offline]
    batch_size: 50
    max_wait: 250ms
`
	c, err := ParseConfig([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	e := c.Endpoint("billing")
	if e.BatchSize != 50 || time.Duration(e.MaxWait) != 250*time.Millisecond || time.Duration(e.Timeout) != DefaultTimeout {
		t.Fatalf("%+v", e)
	}
	if got := c.Lanes(); len(got) != 2 || got[0] != (LaneID{"billing", "eu"}) || got[1] != (LaneID{"billing", "global"}) {
		t.Fatalf("lanes %v", got)
	}
	json := `{"endpoints":[{"name":"a","url":"http://h/x","secrets":["` + testSecret + `"],"sources":["eu"]}]}`
	if _, err := ParseConfig([]byte(json)); err != nil {
		t.Fatalf("JSON: %v", err)
	}
}

// Bad files are refused with the field named; nothing of them is used.
func TestParseConfigRefusesBadFiles(t *testing.T) {
	ok := `name: a
    url: https://h/x
    secrets: [` + testSecret + `]
    sources: [eu]`
	for name, tc := range map[string]struct{ body, want string }{
		"unknown field":   {"endpoints:\n  - " + ok + "\n    retries: 3", "field retries not found"},
		"no secret":       {"endpoints:\n  - name: a\n    url: https://h/x\n    sources: [eu]", "secrets"},
		"bad secret":      {"endpoints:\n  - " + strings.Replace(ok, testSecret, "whsec_short", 1), "secret"},
		"bad url":         {"endpoints:\n  - " + strings.Replace(ok, "https://h/x", "ftp://h/x", 1), "url"},
		"twice":           {"endpoints:\n  - " + ok + "\n  - " + ok, "used twice"},
		"bad kind":        {"endpoints:\n  - " + ok + "\n    kinds: [joined]", "kinds"},
		"bad batch":       {"endpoints:\n  - " + ok + "\n    batch_size: 5000", "batch_size"},
		"bad duration":    {"endpoints:\n  - " + ok + "\n    timeout: soon", `line 6: time: invalid duration "soon"`},
		"bad network":     {"endpoints:\n  - " + ok + "\n    allow_networks: [10.0.0.0]", "allow_networks"},
		"no source":       {"endpoints:\n  - name: a\n    url: https://h/x\n    secrets: [" + testSecret + "]", "sources"},
		"missing ca":      {"endpoints:\n  - " + ok + "\n    ca_file: /nonexistent/ca.pem", "ca_file"},
		"bad name":        {"endpoints:\n  - " + strings.Replace(ok, "name: a", "name: a.b", 1), "name"},
		"bad region":      {"sources: [eu.x]\nendpoints: []", "sources"},
		"not yaml at all": {"{", "config"},
	} {
		if _, err := ParseConfig([]byte(tc.body)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want one naming %q", name, err, tc.want)
		}
	}
}

func TestSignatureIsStandardWebhooks(t *testing.T) {
	// The vector docs/WEBHOOKS.md and its Node and Python recipes verify.
	s, err := ParseSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"test": 2432232314}`)
	if got := s.Sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body); got != "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=" {
		t.Fatalf("signature %s", got)
	}
	old, _ := ParseSecret(testSecret)
	h := SignatureHeader([]Secret{old, s}, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body)
	if err := Verify(s, "msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", h, body, time.Unix(1614265330, 0), 5*time.Minute); err != nil {
		t.Fatalf("rotation header %q: %v", h, err)
	}
	if Verify(s, "msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", h, body, time.Unix(1614265330+600, 0), 5*time.Minute) == nil {
		t.Fatal("an old timestamp verified")
	}
	if Verify(s, "msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", h, []byte(`{"test": 1}`), time.Unix(1614265330, 0), 5*time.Minute) == nil {
		t.Fatal("a changed body verified")
	}
}

func TestAddressAllowed(t *testing.T) {
	lo := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	for addr, want := range map[string]bool{
		"93.184.215.14": true, "2606:2800:21f:cb07:6820:80da:af6b:8b2c": true,
		"127.0.0.1": false, "::1": false, "10.1.2.3": false, "172.16.0.1": false, "192.168.1.1": false,
		"169.254.169.254": false, "fe80::1": false, "fc00::1": false, "0.0.0.0": false, "::": false,
		"100.64.0.1": false, "::ffff:127.0.0.1": false, "::ffff:10.0.0.1": false, "64:ff9b::a00:1": false, "224.0.0.1": false,
	} {
		if got := addressAllowed(netip.MustParseAddr(addr), nil); got != want {
			t.Errorf("%s: allowed %v, want %v", addr, got, want)
		}
	}
	if !addressAllowed(netip.MustParseAddr("127.0.0.1"), lo) || addressAllowed(netip.MustParseAddr("10.0.0.1"), lo) {
		t.Error("allow_networks")
	}
}

func TestRetryDelayDoublesWithJitterUpToTheCap(t *testing.T) {
	for n, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 10: 8 * time.Second} {
		lo, hi := retryDelay(n, time.Second, 8*time.Second, 0, 0), retryDelay(n, time.Second, 8*time.Second, 0, 0.999999)
		if lo != want/2 || hi < want*99/100 || hi > want {
			t.Errorf("retry %d: [%v, %v], want [%v, %v)", n, lo, hi, want/2, want)
		}
	}
	if d := retryDelay(1, time.Second, 8*time.Second, 5*time.Second, 0); d != 5*time.Second {
		t.Errorf("Retry-After 5s: %v", d)
	}
	if d := retryDelay(1, time.Second, 8*time.Second, time.Hour, 0); d != 8*time.Second {
		t.Errorf("Retry-After past the cap: %v", d)
	}
}

package main

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/webhook"
)

// The receivers of docs/webhooks (Node and Python, written from
// docs/WEBHOOKS.md alone) take a real dispatcher's deliveries while users
// join and leave a real node: each verifies the signature with its own
// key of a secret that rotates (the dispatcher signs with both), dedupes
// by id and folds each room in seq order, and ends with exactly the
// members the HTTP API's snapshot shows.
func TestE2EWebhookReceiversFoldToTheSnapshot(t *testing.T) {
	skipIfShort(t, "webhooks: the Node and Python receivers against real processes")
	e := newEnv(t)
	n := e.startNode("--api-keys-file", apiKeysFile(t), "--api-rate", "1000", "--api-burst", "1000")
	api := "http://" + n.addr
	oldKey := webhook.SecretPrefix + base64.StdEncoding.EncodeToString([]byte("rotating-out-key-0123456789abcde"))
	newKey := webhook.SecretPrefix + base64.StdEncoding.EncodeToString([]byte("rotating-in-key-0123456789abcdef"))
	recv := map[string]string{
		"node":   startReceiver(t, []string{"node", "../../docs/webhooks/receiver.mjs"}, newKey, api),
		"python": startReceiver(t, []string{"python3", "../../docs/webhooks/receiver.py"}, oldKey, api),
	}
	var eps strings.Builder
	for name, u := range recv {
		fmt.Fprintf(&eps, "  - name: %s\n    url: %s\n    secrets: [%s, %s]\n    batch_size: 5\n    max_wait: 20ms\n"+
			"    timeout: 1s\n    min_backoff: 50ms\n    max_backoff: 300ms\n    allow_networks: [127.0.0.0/8]\n", name, u, oldKey, newKey)
	}
	cfg := filepath.Join(t.TempDir(), "webhooks.yaml")
	if err := os.WriteFile(cfg, []byte("sources: [eu]\nendpoints:\n"+eps.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	e.start([]string{"webhooks", "--nats", e.nats, "--config", cfg, "--listen", "127.0.0.1:0", "--lease-ttl", "2s"}, false)
	js, err := jetstream.New(e.nc)
	if err != nil {
		t.Fatal(err)
	}
	for name := range recv {
		testkit.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
			_, err := js.Consumer(t.Context(), "PRESENCE_eu", webhook.ConsumerName(name))
			return err
		})
	}
	rooms := []string{"lobby", "room-2", "room=3@x"}
	truth := churn(t, n.addr, rooms, rand.New(rand.NewPCG(22, 7)), 40)
	for _, room := range rooms {
		// Leavers are announced offline after the grace: until then the
		// snapshot and the receivers still count them.
		testkit.CheckFor(t, 60*time.Second, 10*time.Millisecond, func() error {
			return testkit.WantSlice("the snapshot of "+room+" (who is connected)", snapshotUsers(t, api, room), truth[room])
		})
		testkit.CheckFor(t, 60*time.Second, 10*time.Millisecond, func() error {
			want := snapshotUsers(t, api, room)
			for _, u := range recv {
				if got := receiverState(t, u); !slices.Equal(got.Rooms[room], want) {
					return fmt.Errorf("a receiver folds %s to %v, the snapshot has %v", room, got.Rooms[room], want)
				}
			}
			return nil
		})
	}
	for name, u := range recv {
		st := receiverState(t, u)
		t.Logf("%s: %d deliveries, %d duplicates skipped, %d resyncs", name, st.Deliveries, st.Duplicates, st.Resyncs)
		if st.Rejected != 0 || st.Deliveries == 0 {
			t.Errorf("%s: %d deliveries, %d rejected: the signature of its key did not verify", name, st.Deliveries, st.Rejected)
		}
	}
}

// churn joins and leaves users in rooms over a seeded random schedule of
// n steps, and returns who stays connected, per room, sorted.
func churn(t *testing.T, addr string, rooms []string, rnd *rand.Rand, n int) map[string][]string {
	t.Helper()
	type joined struct {
		m    *member
		room string
	}
	var in []joined
	for i := range n {
		if len(in) > 0 && rnd.IntN(3) == 0 {
			k := rnd.IntN(len(in))
			in[k].m.leave()
			in = slices.Delete(in, k, k+1)
			continue
		}
		room := rooms[rnd.IntN(len(rooms))]
		m, err := join(t, addr, fmt.Sprintf("u%d", i), room, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		in = append(in, joined{m, room})
	}
	truth := map[string][]string{}
	for _, j := range in {
		truth[j.room] = append(truth[j.room], j.m.user)
	}
	for _, users := range truth {
		slices.Sort(users)
	}
	return truth
}

// startReceiver runs a receiver recipe and returns its URL.
func startReceiver(t *testing.T, argv []string, secret, api string) string {
	t.Helper()
	if _, err := exec.LookPath(argv[0]); err != nil {
		t.Fatalf("%s is needed for the webhook receiver recipes (make deps installs it)", argv[0])
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "WEBHOOK_SECRET="+secret, "PRESENCE_API="+api, "PRESENCE_KEY="+e2eReadKey, "PORT=0")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	port, ok := strings.CutPrefix(strings.TrimSpace(line), "listening ")
	if err != nil || !ok {
		t.Fatalf("%v: %q, %v", argv, line, err)
	}
	return "http://127.0.0.1:" + port + "/hooks"
}

type receiverStatus struct {
	Rooms                                     map[string][]string
	Deliveries, Rejected, Resyncs, Duplicates int
}

func receiverState(t *testing.T, u string) receiverStatus {
	t.Helper()
	var st receiverStatus
	r, err := http.Get(u)
	if err != nil {
		return st
	}
	defer r.Body.Close()
	_ = json.NewDecoder(r.Body).Decode(&st)
	return st
}

// snapshotUsers reads room's members from the HTTP API, every page.
func snapshotUsers(t *testing.T, api, room string) []string {
	t.Helper()
	var users []string
	for offset := 0; ; {
		req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("%s/v1/rooms/%s/members?offset=%d&limit=2", api, url.PathEscape(room), offset), nil)
		req.Header.Set("Authorization", "Bearer "+e2eReadKey)
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var page struct {
			Total   int
			Members []struct{ User string }
		}
		err = json.NewDecoder(r.Body).Decode(&page)
		r.Body.Close()
		if err != nil || r.StatusCode != http.StatusOK {
			t.Fatalf("members of %s: %d %v", room, r.StatusCode, err)
		}
		for _, m := range page.Members {
			users = append(users, m.User)
		}
		offset += len(page.Members)
		if len(page.Members) == 0 || offset >= page.Total {
			break
		}
	}
	slices.Sort(users)
	return users
}

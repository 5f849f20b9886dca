package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.yaml.in/yaml/v3"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/internal/testkit"
	"github.com/presence-dev/presence/internal/testredis"
)

// compose is the part of docker-compose.yml this test reads.
type compose struct {
	Services map[string]composeService `yaml:"services"`
}

type composeService struct {
	Image       string            `yaml:"image"`
	Build       string            `yaml:"build"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Ports       []string          `yaml:"ports"`
	DependsOn   []string          `yaml:"depends_on"`
}

// No Docker engine runs here, so docker-compose.yml is checked as far as
// it can be without one: each presenced service runs as the binary, with
// the command and environment the file gives it, each on a loopback
// address of its own (as each container has its own address) so the
// file's ports are used as they are, and each Redis service is a local
// redis-server. Every PRESENCE_ variable must name a flag of its
// command. The two regions must come up as one supercluster of embedded
// nats-servers (each region's stream in its own cluster), every node
// healthy and serving the demo page, the aggregator leading with both
// regions live, and clients of both regions must see each other through
// the global view.
func TestE2EComposeServices(t *testing.T) {
	skipIfShort(t, "compose: every service of docker-compose.yml")
	c := readCompose(t)
	checkImages(t, c)
	e := &env{t: t}

	// Each presenced service gets 127.A.B.n; A and B are random so that
	// two runs of this test on one machine do not share addresses.
	base := fmt.Sprintf("127.%d.%d.", 1+rand.IntN(254), rand.IntN(255))
	ips := map[string]string{}
	hosts := map[string]string{} // service:port -> address
	names := slices.Sorted(maps.Keys(c.Services))
	for _, name := range names {
		svc := c.Services[name]
		switch {
		case svc.Build != "":
			ips[name] = base + fmt.Sprint(len(ips)+1)
		case strings.HasPrefix(svc.Image, "redis:"):
			hosts[name+":6379"] = testredis.Start(t).Addr
		default:
			t.Fatalf("%s: image %q: only redis and presenced (build) services are known to this test", name, svc.Image)
		}
	}
	flags := map[string]map[string]bool{"node": commandFlags(t, "node"), "aggregator": commandFlags(t, "aggregator")}

	procs := map[string]*proc{}
	for _, name := range startOrder(t, c) {
		svc := c.Services[name]
		if svc.Build == "" {
			continue
		}
		if len(svc.Command) == 0 || flags[svc.Command[0]] == nil {
			t.Fatalf("%s: command %v: want node or aggregator", name, svc.Command)
		}
		var environ []string
		for k, v := range svc.Environment {
			flag := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(k, "PRESENCE_"), "_", "-"))
			if !strings.HasPrefix(k, "PRESENCE_") || !flags[svc.Command[0]][flag] {
				t.Fatalf("%s: %s names no flag of presenced %s", name, k, svc.Command[0])
			}
			if k == "PRESENCE_NATS_STORE_DIR" {
				v = filepath.Join(t.TempDir(), "nats") // each container has its own volume
			}
			environ = append(environ, k+"="+localAddrs(t, name, v, ips, hosts))
		}
		// As compose does with depends_on, a service starts after what it
		// depends on started, not once it is healthy: a region's nodes
		// are healthy only once all the supercluster's servers elect
		// JetStream's leader.
		procs[name] = e.startEnv(svc.Command, environ, false)
	}
	for _, name := range names {
		if p := procs[name]; p != nil {
			waitHealthy(t, name, p, healthURL(ips[name], c.Services[name]))
		}
	}

	// Each region's stream is in its own NATS cluster: the embedded
	// servers are clustered and joined, and the nodes found JetStream.
	nc, err := nats.Connect(fmt.Sprintf("nats://%s:4222", ips["eu-1"]))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	for _, region := range []string{"eu", "us"} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		st, err := js.Stream(ctx, bus.StreamName(region))
		cancel()
		if err != nil {
			t.Fatalf("stream of %s through eu-1's nats-server: %v", region, err)
		}
		if cl := st.CachedInfo().Cluster; cl == nil || cl.Name != region {
			t.Fatalf("stream of %s placed in %+v, want cluster %s", region, cl, region)
		}
	}

	// The demo page, on every node.
	for _, name := range []string{"eu-1", "eu-2", "us-1", "us-2"} {
		page := httpGet(t, "http://"+ips[name]+":8080/")
		if !strings.Contains(page, "/v1/client.js") {
			t.Fatalf("%s: / is not the demo page:\n%.300s", name, page)
		}
	}

	// The aggregator leads and hears both regions.
	testkit.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		var h struct {
			Status  string `json:"status"`
			Leader  bool   `json:"leader"`
			Regions []struct{ Region, State string }
		}
		if tryJSON("http://"+ips["aggregator"]+":9090/healthz", &h) != nil || h.Status != "ok" || !h.Leader {
			return fmt.Errorf("the aggregator's health %+v, want ok and leading", h)
		}
		live := map[string]bool{}
		for _, r := range h.Regions {
			live[r.Region] = r.State == "live"
		}
		if !live["eu"] || !live["us"] {
			return fmt.Errorf("the aggregator's regions %+v, want eu and us live", h.Regions)
		}
		return nil
	})

	// Users of both regions, on three nodes, see each other.
	ws := func(node, user string) *client {
		return dialURL(t, fmt.Sprintf("ws://%s:8080/v1/ws?session=tab&user=%s", ips[node], user), user, "tab")
	}
	alice, bob, carol := ws("eu-1", "alice"), ws("us-2", "bob"), ws("eu-2", "carol")
	aliceView := seen(alice.join("lobby"))
	bobView := seen(bob.join("lobby"))
	carol.join("lobby")
	all := func(v *seenRoom) bool { return v.is(bus.GlobalRegion, "alice", "bob", "carol") }
	aliceView.follow(t, alice, 30*time.Second, "bob of us and carol of eu in the global view", all)
	bobView.follow(t, bob, 30*time.Second, "alice and carol of eu in the global view", all)
}

func readCompose(t *testing.T) compose {
	t.Helper()
	raw, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var c compose
	if err := yaml.Unmarshal(raw, &c); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	for _, want := range []string{"redis-eu", "redis-us", "eu-1", "eu-2", "us-1", "us-2", "aggregator"} {
		if _, ok := c.Services[want]; !ok {
			t.Fatalf("docker-compose.yml has no service %q", want)
		}
	}
	return c
}

// checkImages: every image is one anybody can pull: the official Redis
// image in the compose file, the official Go image and a distroless or
// scratch base in the Dockerfile.
func checkImages(t *testing.T, c compose) {
	t.Helper()
	for name, svc := range c.Services {
		if svc.Image != "" && !regexp.MustCompile(`^redis:[0-9.]+(-[a-z]+)?$`).MatchString(svc.Image) {
			t.Errorf("%s: image %q is not the official redis image", name, svc.Image)
		}
		if svc.Build != "" && svc.Build != "." {
			t.Errorf("%s: builds %q, want the repository's Dockerfile", name, svc.Build)
		}
	}
	f, err := os.Open("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	official := regexp.MustCompile(`^(golang:[0-9.]+(-[a-z]+)?|gcr\.io/distroless/static[a-z0-9-]*(:[a-z0-9.-]+)?|scratch)$`)
	froms := 0
	for sc := bufio.NewScanner(f); sc.Scan(); {
		if fs := strings.Fields(sc.Text()); len(fs) >= 2 && strings.EqualFold(fs[0], "FROM") {
			froms++
			if !official.MatchString(fs[1]) {
				t.Errorf("Dockerfile: FROM %s: want golang, distroless static or scratch", fs[1])
			}
		}
	}
	if froms == 0 {
		t.Error("Dockerfile: no FROM")
	}
}

// hostRef is a host:port inside a value: a service's name and a port.
var hostRef = regexp.MustCompile(`(^|[^A-Za-z0-9_.-])([A-Za-z][A-Za-z0-9_.-]*):(\d+)`)

// localAddrs rewrites a value of service svc for this machine: service
// host names become their loopback addresses, a Redis service the local
// redis-server, and a listen address on every interface (":8080",
// "0.0.0.0") the service's own address. A host that names no service
// fails the test.
func localAddrs(t *testing.T, svc, v string, ips, hosts map[string]string) string {
	t.Helper()
	if strings.HasPrefix(v, ":") {
		v = ips[svc] + v
	}
	v = strings.ReplaceAll(v, "0.0.0.0", ips[svc])
	return hostRef.ReplaceAllStringFunc(v, func(m string) string {
		sm := hostRef.FindStringSubmatch(m)
		if a, ok := hosts[sm[2]+":"+sm[3]]; ok {
			return sm[1] + a
		}
		if ip, ok := ips[sm[2]]; ok {
			return sm[1] + ip + ":" + sm[3]
		}
		if strings.Count(sm[2], ".") == 3 { // an address already
			return m
		}
		t.Fatalf("%s: %q names host %q, which is no service", svc, v, sm[2])
		return m
	})
}

// startOrder sorts the services so that each comes after what it
// depends on; a cycle or an unknown service fails the test.
func startOrder(t *testing.T, c compose) []string {
	t.Helper()
	var order []string
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(string)
	visit = func(n string) {
		svc, ok := c.Services[n]
		if !ok {
			t.Fatalf("depends_on names no service %q", n)
		}
		switch state[n] {
		case 1:
			t.Fatalf("depends_on cycle through %s", n)
		case 2:
			return
		}
		state[n] = 1
		for _, d := range svc.DependsOn {
			visit(d)
		}
		state[n] = 2
		order = append(order, n)
	}
	for _, n := range slices.Sorted(maps.Keys(c.Services)) {
		visit(n)
	}
	return order
}

// healthURL is a presenced service's /healthz: the node's --listen, the
// aggregator's --listen flag, at the service's address.
func healthURL(ip string, svc composeService) string {
	port := "8080"
	if l := svc.Environment["PRESENCE_LISTEN"]; l != "" {
		port = l[strings.LastIndex(l, ":")+1:]
	}
	for i, a := range svc.Command {
		if a == "--listen" && i+1 < len(svc.Command) {
			port = svc.Command[i+1][strings.LastIndex(svc.Command[i+1], ":")+1:]
		}
	}
	return "http://" + ip + ":" + port + "/healthz"
}

// waitHealthy waits until the process answers 200 on url; it must not
// exit meanwhile. A region's nodes are healthy once their servers found
// each other and JetStream elected its leaders.
func waitHealthy(t *testing.T, name string, p *proc, url string) {
	t.Helper()
	testkit.CheckFor(t, 60*time.Second, 10*time.Millisecond, func() error {
		select {
		case <-p.done:
			t.Fatalf("%s exited: %v\n%s", name, p.err, p.out.String())
		default:
		}
		r, err := http.Get(url)
		if err != nil {
			return fmt.Errorf("%s at %s: %w", name, url, err)
		}
		r.Body.Close()
		return testkit.Want(name+" health at "+url, r.StatusCode, http.StatusOK)
	})
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	r, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	if r.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, r.Status)
	}
	return string(b)
}

// commandFlags returns the names of a presenced command's flags, from
// its -h.
func commandFlags(t *testing.T, command string) map[string]bool {
	t.Helper()
	out, _ := exec.Command(binary, command, "-h").CombinedOutput()
	flags := map[string]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(line, "  -") {
			flags[strings.TrimLeft(f[0], "-")] = true
		}
	}
	if !flags["nats"] || !flags["listen"] {
		t.Fatalf("cannot read presenced %s -h:\n%s", command, out)
	}
	return flags
}

package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// compose is the part of docker-compose.yml this test reads.
type compose struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
		Build       string            `yaml:"build"`
		Command     []string          `yaml:"command"`
		Environment map[string]string `yaml:"environment"`
		Ports       []string          `yaml:"ports"`
		DependsOn   []string          `yaml:"depends_on"`
	} `yaml:"services"`
}

// No Docker engine runs here, so docker-compose.yml is checked as far as
// it can be without one: each presenced service is run as the binary,
// with the command and environment the file gives it and the other
// services' host names pointed at local servers. It must come up healthy
// and serve a client, and every PRESENCE_ variable must name a flag.
func TestE2EComposeServices(t *testing.T) {
	skipIfShort(t, "compose: every service of docker-compose.yml")
	raw, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var c compose
	if err := yaml.Unmarshal(raw, &c); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	for _, want := range []string{"redis", "nats", "node1", "node2"} {
		if _, ok := c.Services[want]; !ok {
			t.Fatalf("docker-compose.yml has no service %q", want)
		}
	}
	flags := nodeFlags(t)
	e := newEnv(t)
	natsHost := strings.TrimPrefix(e.nats, "nats://")
	names := make([]string, 0, len(c.Services))
	for name := range c.Services {
		names = append(names, name)
	}
	sort.Strings(names)
	var totals []any
	for _, name := range names {
		svc := c.Services[name]
		if svc.Build == "" {
			continue // redis, nats: images
		}
		var environ []string
		for k, v := range svc.Environment {
			flag := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(k, "PRESENCE_"), "_", "-"))
			if !strings.HasPrefix(k, "PRESENCE_") || !flags[flag] {
				t.Fatalf("%s: %s names no flag of presenced node", name, k)
			}
			v = strings.ReplaceAll(v, "redis:6379", e.redis)
			v = strings.ReplaceAll(v, "nats:4222", natsHost)
			if k == "PRESENCE_LISTEN" {
				v = "127.0.0.1:0" // in containers each service has its own address
			}
			environ = append(environ, k+"="+v)
		}
		p := e.startEnv(svc.Command, environ, true)
		_, port, _ := net.SplitHostPort(p.addr)
		user := "c-" + name
		cl := dialURL(t, fmt.Sprintf("ws://127.0.0.1:%s/v1/ws?session=s&user=%s", port, user), user, "s")
		snap := cl.join("lobby")["snapshot"].(map[string]any)
		if snap["region"] != "local" {
			t.Fatalf("%s: snapshot %v", name, snap)
		}
		totals = append(totals, snap["total"])
	}
	// Two nodes of one region: the second one's client sees the first's.
	if len(totals) != 2 || totals[0] != float64(1) || totals[1] != float64(2) {
		t.Fatalf("room totals seen by each node's client: %v, want [1 2]", totals)
	}
}

// nodeFlags returns the names of presenced node's flags, from its -h.
func nodeFlags(t *testing.T) map[string]bool {
	t.Helper()
	out, _ := exec.Command(binary, "node", "-h").CombinedOutput()
	flags := map[string]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(line, "  -") {
			flags[strings.TrimPrefix(f[0], "-")] = true
		}
	}
	if !flags["redis"] || !flags["listen"] {
		t.Fatalf("cannot read presenced node -h:\n%s", out)
	}
	return flags
}

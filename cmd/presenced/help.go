package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// flagGroup is one heading of a command's --help and the flags under it,
// in the order shown.
type flagGroup struct {
	title string
	flags []string
}

// helpGroups are the headings every command's flags fall under; a
// command shows the groups that hold one of its flags. Every flag of
// every command is in exactly one group (TestHelpGroupsEveryFlag).
var helpGroups = []flagGroup{
	{"Region and listener", []string{"region", "listen", "http-header-timeout", "drain-timeout", "demo"}},
	{"Auth (client tokens)", []string{"jwt-secret-file", "jwt-secret", "jwt-public-key-file", "jwks-url", "jwks-refresh",
		"jwt-issuer", "jwt-audience", "allowed-origins"}},
	{"HTTP server API (off without keys)", []string{"api-keys-file", "api-keys", "api-keys-reload", "api-rate", "api-burst", "api-cors-origins"}},
	{"Timing (rules below)", []string{"session-ttl", "heartbeat", "offline-grace", "reap-interval", "last-seen-interval"}},
	{"Redis (the region's store)", []string{"redis", "redis-cluster", "redis-prefix"}},
	{"NATS", []string{"nats", "nats-creds", "nats-ca", "stream-max-age", "stream-cluster", "replicas"}},
	{"Embedded NATS (when --nats is empty)", []string{"nats-port", "nats-host", "nats-store-dir", "nats-server-name",
		"nats-cluster-listen", "nats-routes", "nats-gateway-listen", "nats-gateways"}},
	{"Limits", []string{"max-connections", "max-rooms", "max-watch-users", "max-inflight", "join-rate", "join-rate-min",
		"join-latency", "max-retry-after"}},
	{"Big rooms", []string{"fanout-tick", "fanout-budget", "batch-from", "compression"}},
	{"Global (several regions)", []string{"global", "global-cadence", "cadence", "grace", "down-after", "drop-after",
		"regions", "max-full-bytes"}},
	{"TLS", []string{"tls-cert-file", "tls-key-file"}},
	{"Logs and profiling", []string{"log-level", "log-format", "pprof-listen"}},
	{"Webhooks", []string{"config", "config-poll", "instance", "lease-ttl", "state-max-age", "dead-letter-max-age"}},
	{"The token (presenced token)", []string{"user", "rooms", "ttl", "observe", "jwt-private-key-file", "kid"}},
	{"The switch (presenced upgrade)", []string{"finish"}},
	{"Development", []string{"insecure-dev"}},
}

// commandIntro is the line under a command's usage line.
var commandIntro = map[string]string{
	"presenced node":       "Runs an edge node: WebSocket clients, the region's Redis, NATS.",
	"presenced dev":        "Runs everything on this machine: an embedded nats-server, a throwaway redis-server\n(or REDIS_URL), one node with --insecure-dev and the demo page.",
	"presenced aggregator": "Runs a cross-region aggregator: the global view (run two or more).",
	"presenced webhooks":   "Runs a webhook dispatcher: the region and global streams, delivered to HTTP endpoints\n(docs/WEBHOOKS.md).",
	"presenced upgrade":    "Shows the region's data format and the format of each node holding a lease; --finish\nswitches the region to this release's format once none of an older one is left\n(region/doc.go, Upgrading).",
	"presenced token":      "Prints a client token (JWT) for a user and rooms, signed as the nodes check it\n(docs/TOKENS.md).",
}

// flagExamples are the values --help shows a flag with; flags whose
// default says enough have none. Paths and names, never secrets.
var flagExamples = map[string]string{ //nolint:gosec // G101 reads the jwt-secret-file path as a credential
	"region":              "eu",
	"listen":              "0.0.0.0:8080",
	"jwt-secret-file":     "/etc/presence/jwt-secret",
	"jwt-public-key-file": "/etc/presence/jwt-rs256.pub",
	"jwt-issuer":          "https://auth.example.com/",
	"jwks-url":            "https://auth.example.com/.well-known/jwks.json",
	"api-keys-file":       "/etc/presence/api-keys",
	"api-cors-origins":    "https://admin.example.com",
	"jwt-audience":        "presence",
	"allowed-origins":     "https://app.example.com,https://admin.example.com",
	"session-ttl":         "45s",
	"offline-grace":       "12s",
	"redis":               "redis://10.0.0.5:6379/0",
	"redis-prefix":        "presence-v3",
	"nats":                "nats://nats-eu-1:4222,nats://nats-eu-2:4222",
	"nats-creds":          "/etc/presence/node.creds",
	"nats-ca":             "/etc/presence/nats-ca.pem",
	"nats-store-dir":      "/var/lib/presence/nats",
	"nats-server-name":    "eu-1",
	"nats-cluster-listen": "0.0.0.0:6222",
	"nats-routes":         "nats-route://eu-1:6222,nats-route://eu-2:6222",
	"nats-gateway-listen": "0.0.0.0:7222",
	"nats-gateways":       "eu=nats://eu-1:7222,us=nats://us-1:7222",
	"max-connections":     "15000",
	"regions":             "eu,us",
	"config":              "/etc/presence/webhooks.yaml",
	"user":                "alice",
	"rooms":               "'room42,team7-*'",
	"ttl":                 "1h",
	"tls-cert-file":       "/etc/presence/tls.crt",
	"tls-key-file":        "/etc/presence/tls.key",
	"pprof-listen":        "127.0.0.1:6060",
}

// groupedUsage returns a FlagSet's Usage: its flags under helpGroups'
// headings, each with its environment variable, default and example,
// then tail.
func groupedUsage(fs *flag.FlagSet, intro, tail string) func() {
	return func() {
		w := fs.Output()
		fmt.Fprintf(w, "usage: %s [flags]\n%s\nEvery flag can also be set with the environment variable named beside it.\n", fs.Name(), intro)
		shown := map[string]bool{}
		for _, g := range helpGroups {
			var fl []*flag.Flag
			for _, name := range g.flags {
				if f := fs.Lookup(name); f != nil {
					fl = append(fl, f)
				}
			}
			printGroup(w, g.title, fl, shown)
		}
		var rest []*flag.Flag
		fs.VisitAll(func(f *flag.Flag) {
			if !shown[f.Name] {
				rest = append(rest, f)
			}
		})
		printGroup(w, "Other", rest, shown)
		fmt.Fprint(w, tail)
	}
}

func printGroup(w io.Writer, title string, fl []*flag.Flag, shown map[string]bool) {
	if len(fl) == 0 {
		return
	}
	fmt.Fprintf(w, "\n%s:\n", title)
	for _, f := range fl {
		shown[f.Name] = true
		kind, usage := flag.UnquoteUsage(f)
		head := "  --" + f.Name
		if kind != "" {
			head += " " + kind
		}
		fmt.Fprintf(w, "%-36s %s\n", head, EnvName(f.Name))
		fmt.Fprintf(w, "        %s", usage)
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && f.DefValue != "0s" {
			fmt.Fprintf(w, " (default %s)", quoteDefault(f))
		}
		fmt.Fprintln(w)
		if ex, ok := flagExamples[f.Name]; ok {
			fmt.Fprintf(w, "        e.g. --%s %s\n", f.Name, ex)
		}
	}
}

// quoteDefault quotes string defaults, as the flag package does.
func quoteDefault(f *flag.Flag) string {
	if kind, _ := flag.UnquoteUsage(f); kind == "string" {
		return fmt.Sprintf("%q", f.DefValue)
	}
	return strings.TrimSpace(f.DefValue)
}

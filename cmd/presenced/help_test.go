package main

import (
	"bytes"
	"context"
	"io"
	"regexp"
	"strings"
	"testing"
)

// Every flag of every command is under a heading of its --help, with its
// environment variable; every flag a heading names exists.
func TestHelpGroupsEveryFlag(t *testing.T) {
	seen := map[string]bool{}
	flagLine := regexp.MustCompile(`(?m)^  --([a-z0-9-]+)(?: \S+)?\s+(PRESENCE_[A-Z0-9_]+)$`)
	for _, cmd := range []string{"node", "dev", "aggregator", "webhooks", "token", "upgrade"} {
		var out bytes.Buffer
		if err := Run(context.Background(), []string{cmd, "-h"}, io.Discard, &out); err != nil {
			t.Fatalf("%s -h: %v", cmd, err)
		}
		help := out.String()
		if strings.Contains(help, "\nOther:\n") {
			t.Errorf("%s -h has flags under no heading:\n%s", cmd, help[strings.Index(help, "\nOther:\n"):])
		}
		ms := flagLine.FindAllStringSubmatch(help, -1)
		if len(ms) < 10 && cmd != "upgrade" || len(ms) < 4 {
			t.Fatalf("%s -h lists %d flags:\n%s", cmd, len(ms), help)
		}
		for _, m := range ms {
			if m[2] != EnvName(m[1]) {
				t.Errorf("%s: --%s shows %s", cmd, m[1], m[2])
			}
			seen[m[1]] = true
		}
		if (cmd == "node" || cmd == "dev") && !strings.Contains(help, "heartbeat <= session-ttl / 3") {
			t.Errorf("%s -h lacks the timing rules", cmd)
		}
	}
	for _, g := range helpGroups {
		for _, f := range g.flags {
			if !seen[f] {
				t.Errorf("heading %q names --%s, which no command has", g.title, f)
			}
		}
	}
	for f := range flagExamples {
		if !seen[f] {
			t.Errorf("an example for --%s, which no command has", f)
		}
	}
}

package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/presence-dev/presence/presence"
)

// The timing rules are one list, presence.TimingRules, which Validate
// checks (presence's TestTimingRulesAreWhatValidateChecks): the README's
// table and the --help of every command with the timing flags show that
// list, in its order, and nothing else.
func TestTimingRulesOneList(t *testing.T) {
	var want []string
	for _, r := range presence.TimingRules {
		want = append(want, r.Rule+" | "+r.Why)
	}
	if got := readmeTimingRules(t); !slices.Equal(got, want) {
		t.Errorf("README's timing rules:\n%s\nwant presence.TimingRules:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, cmd := range []string{"node", "dev"} {
		var out bytes.Buffer
		if err := Run(context.Background(), []string{cmd, "-h"}, io.Discard, &out); err != nil {
			t.Fatalf("%s -h: %v", cmd, err)
		}
		_, rules, ok := strings.Cut(out.String(), "The timing must keep these rules (the error names the one broken):\n")
		if !ok {
			t.Fatalf("%s -h has no timing rules:\n%s", cmd, out.String())
		}
		var got []string
		for _, line := range strings.Split(strings.TrimRight(rules, "\n"), "\n") {
			rule, why, _ := strings.Cut(strings.TrimSpace(line), "   ")
			got = append(got, strings.TrimSpace(rule)+" | "+strings.TrimSpace(why))
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s -h's timing rules:\n%s\nwant:\n%s", cmd, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
}

// readmeTimingRules reads the rows of the README's timing table as
// "rule | why", the rule without its backquotes.
func readmeTimingRules(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(b), "| rule (in flag names) | why |\n|---|---|\n")
	if !ok {
		t.Fatal("README has no timing rules table")
	}
	var rows []string
	for _, line := range strings.Split(table, "\n") {
		if !strings.HasPrefix(line, "| ") {
			break
		}
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if len(cells) != 2 {
			t.Fatalf("README timing row %q: want two cells", line)
		}
		rows = append(rows, strings.Trim(cells[0], "`")+" | "+cells[1])
	}
	return rows
}

package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"strings"
	"testing"
)

// Every mode that reads flags registers them (a bad tag panics) and
// answers -h; the children refuse to start without their input.
func TestEveryModeParsesItsFlags(t *testing.T) {
	stderr := os.Stderr
	os.Stderr, _ = os.Open(os.DevNull) // -h prints the flags there
	defer func() { os.Stderr = stderr }()
	var modes []string
	for m := range shared {
		modes = append(modes, m)
	}
	modes = append(modes, "region", "reconnect", "versus")
	for _, m := range modes {
		if err := run(context.Background(), []string{m, "-h"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
			t.Errorf("%s -h: %v, want flag.ErrHelp", m, err)
		}
		if err := run(context.Background(), []string{m, "--no-such-flag"}, io.Discard); err == nil {
			t.Errorf("%s took an unknown flag", m)
		}
	}
	if err := run(context.Background(), []string{"region-driver", "{"}, io.Discard); err == nil || !strings.Contains(err.Error(), "spec as JSON") {
		t.Errorf("region-driver with a bad spec: %v", err)
	}
	for _, args := range [][]string{nil, {"nope"}} {
		if err := run(context.Background(), args, io.Discard); err == nil || !strings.Contains(err.Error(), "usage:") {
			t.Errorf("%q: %v, want the usage", args, err)
		}
	}
}

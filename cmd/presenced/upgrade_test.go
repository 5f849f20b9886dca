package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/presence-dev/presence/internal/testredis"
	"github.com/presence-dev/presence/region"
)

// presenced upgrade on what it cannot judge: a flag it does not know is
// a usage error; a region with no format marker (no node ever started)
// and a marker of a format this release cannot read are errors that say
// so; none of them writes a marker.
func TestUpgradeCommandRefusals(t *testing.T) {
	ctx := context.Background()
	rdb, srv := testredis.Client(t)
	addr := srv.Addr
	var out, errb bytes.Buffer
	var ue *usageError
	if err := Run(ctx, []string{"upgrade", "--finsh"}, &out, &errb); !errors.As(err, &ue) {
		t.Fatalf("a misspelt flag: %v, want a usage error", err)
	}
	err := Run(ctx, []string{"upgrade", "--redis", addr, "--finish"}, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "a node's start writes it") {
		t.Fatalf("a region with no marker: %v", err)
	}
	if n, _ := rdb.Exists(ctx, "presence:schema").Result(); n != 0 {
		t.Fatal("presenced upgrade wrote a marker")
	}
	if err := rdb.Set(ctx, "presence:schema", "9", 0).Err(); err != nil {
		t.Fatal(err)
	}
	var se *region.SchemaError
	if err := Run(ctx, []string{"upgrade", "--redis", addr, "--finish"}, &out, &errb); !errors.As(err, &se) || se.Found != "9" {
		t.Fatalf("a region of format 9: %v, want a SchemaError", err)
	}
	if v := rdb.Get(ctx, "presence:schema").Val(); v != "9" {
		t.Fatalf("marker %q after a refusal", v)
	}
	// A region of this release's format: nothing to switch, said so.
	if err := rdb.Set(ctx, "presence:schema", region.FormatVersion, 0).Err(); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := Run(ctx, []string{"upgrade", "--redis", addr, "--finish"}, &out, &errb); err != nil || !strings.Contains(out.String(), "nothing to switch") {
		t.Fatalf("a region of this release's format: %v\n%s", err, out.String())
	}
}

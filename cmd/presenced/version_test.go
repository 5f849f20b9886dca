package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/presence-dev/presence/region"
)

func TestVersionCommandNamesEverythingItSpeaks(t *testing.T) {
	var out bytes.Buffer
	if err := Run(context.Background(), []string{"version"}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	want := regexp.MustCompile(`^presenced \S+ \(commit \S+, ` + regexp.QuoteMeta(runtime.Version()) +
		`, protocol v1, bus events v1, data format ` + region.FormatVersion + `\)\n$`)
	if !want.MatchString(out.String()) {
		t.Fatalf("version printed %q", out.String())
	}
}

// A running node shows its build in /healthz and as presence_build_info.
func TestE2EBuildInHealthAndMetrics(t *testing.T) {
	e := newEnv(t)
	n := e.startNode()
	r, err := http.Get("http://" + n.addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	var h struct {
		Build map[string]string `json:"build"`
	}
	err = json.NewDecoder(r.Body).Decode(&h)
	r.Body.Close()
	if err != nil || h.Build["version"] != version || h.Build["go"] != runtime.Version() ||
		h.Build["protocol"] != "1" || h.Build["data_format"] != region.FormatVersion || h.Build["commit"] == "" {
		t.Fatalf("health build %v (%v)", h.Build, err)
	}
	r, err = http.Get("http://" + n.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(r.Body)
	r.Body.Close()
	line := regexp.MustCompile(`(?m)^presence_build_info\{[^}]*\} 1$`).Find(body)
	if line == nil || !strings.Contains(string(line), `data_format="`+region.FormatVersion+`"`) ||
		!strings.Contains(string(line), `version="`+version+`"`) {
		t.Fatalf("presence_build_info: %q", line)
	}
}

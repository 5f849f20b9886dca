package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/protocol"
	"github.com/presence-dev/presence/region"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "0.1.0-dev"

// buildInfo is what this binary is: its release, the commit it was built
// from (with "-dirty" for uncommitted changes; "unknown" where the go
// command recorded none, as under go run or go test), the Go that built
// it, and the versions of what it speaks and stores.
func buildInfo() map[string]string {
	b := map[string]string{
		"version":     version,
		"commit":      "unknown",
		"go":          runtime.Version(),
		"protocol":    strconv.Itoa(protocol.Version),
		"bus_event":   strconv.Itoa(bus.EventVersion),
		"data_format": region.FormatVersion,
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	var rev, dirty string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "-dirty"
			}
		}
	}
	if rev != "" {
		b["commit"] = rev[:min(12, len(rev))] + dirty
	}
	return b
}

// versionLine is what `presenced version` prints.
func versionLine(b map[string]string) string {
	return fmt.Sprintf("presenced %s (commit %s, %s, protocol v%s, bus events v%s, data format %s)",
		b["version"], b["commit"], b["go"], b["protocol"], b["bus_event"], b["data_format"])
}

// registerBuildInfo exports presence_build_info, always 1, labelled with
// buildInfo: a dashboard shows which release each process runs.
func registerBuildInfo(reg prometheus.Registerer) error {
	b := buildInfo()
	return reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "presence", Name: "build_info",
		Help:        "Always 1; the labels say which build this process runs.",
		ConstLabels: prometheus.Labels(b),
	}, func() float64 { return 1 }))
}

package main

import (
	"context"
	"flag"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/presence-dev/presence/bus"
	"github.com/presence-dev/presence/console"
	"github.com/presence-dev/presence/httpapi"
)

// apiFlags are the HTTP server API's flags, the same on node, dev and
// aggregator.
type apiFlags struct {
	keys, keysFile, cors string
	reload               time.Duration
	rate                 float64
	burst                int
	headerTimeout        time.Duration
}

func (f *apiFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.keysFile, "api-keys-file", "", "HTTP API keys, one name:scope:secret a line (scope read or admin; # comments); re-read when it changes")
	fs.StringVar(&f.keys, "api-keys", "", "HTTP API keys, comma-separated name:scope:secret (prefer PRESENCE_API_KEYS or --api-keys-file: flags show in ps); none: the API is off")
	fs.DurationVar(&f.reload, "api-keys-reload", 10*time.Second, "how often --api-keys-file is checked for changes (0: never)")
	fs.Float64Var(&f.rate, "api-rate", httpapi.DefaultRate, "HTTP API requests per second per key; past it 429 (negative: no limit)")
	fs.IntVar(&f.burst, "api-burst", httpapi.DefaultBurst, "HTTP API requests a key may make at once before --api-rate applies")
	fs.StringVar(&f.cors, "api-cors-origins", "", "comma-separated origins browsers may call the HTTP API from (* for any); none: no CORS")
	fs.DurationVar(&f.headerTimeout, "http-header-timeout", 10*time.Second, "a client must send its request headers within this (slow clients are cut off)")
}

// keys reads the API keys; bad ones are a usage error.
func (f *apiFlags) loadKeys(lg *slog.Logger) (*httpapi.Keys, error) {
	if f.headerTimeout <= 0 {
		return nil, &usageError{"--http-header-timeout must be positive"}
	}
	k, err := httpapi.NewKeys(f.keys, f.keysFile, lg)
	if err != nil {
		return nil, &usageError{err.Error()}
	}
	return k, nil
}

// mount serves the API of one view on mux, its keys file watched until
// ctx is done, and says at start whether the API is on.
func (f *apiFlags) mount(ctx context.Context, mux *http.ServeMux, keys *httpapi.Keys, q *bus.Query, d bus.Disconnecter, ops *bus.Operations, lg *slog.Logger) error {
	cfg := httpapi.Config{Query: q, Disconnect: d, Ops: ops, Keys: keys, Rate: f.rate, Burst: f.burst, Logger: lg}
	if f.cors != "" {
		cfg.CORSOrigins = strings.Split(f.cors, ",")
	}
	a, err := httpapi.New(cfg)
	if err != nil {
		return &usageError{"--api-cors-origins: " + err.Error()}
	}
	a.Mount(mux)
	console.Mount(mux)
	go keys.Watch(ctx, f.reload)
	if keys.Len() == 0 {
		lg.Info("presenced: HTTP API off: no API key configured (--api-keys-file, --api-keys or PRESENCE_API_KEYS); its endpoints answer 404", "view", q.Region())
		return nil
	}
	lg.Info("presenced: HTTP API on", "view", q.Region(), "keys", keys.Len(), "keys_file", f.keysFile, "rate", f.rate, "burst", f.burst, "cors", f.cors, "console", console.Path)
	return nil
}

package main

import (
	"context"
	_ "embed"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/redis/go-redis/v9"
)

//go:embed demo.html
var demoPage []byte

// favicon is the demo's icon, so that a browser's request for
// /favicon.ico gets an answer and not a 404 in the console.
const favicon = `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><circle cx="8" cy="8" r="6" fill="#2a9d4b"/></svg>`

func runDevCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("presenced dev", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c commonFlags
	c.register(fs, "127.0.0.1:8080")
	if err := parseFlags(fs, args); err != nil {
		if err == flag.ErrHelp {
			return nil
		}
		return err
	}
	c.insecureDev = true
	cfg, err := c.config(stderr)
	if err != nil {
		return err
	}
	// Redis: REDIS_URL, else a throwaway redis-server of our own.
	if url := os.Getenv("REDIS_URL"); url != "" {
		cfg.Redis = url
	} else {
		url, stop, err := startRedis(ctx)
		if err != nil {
			return err
		}
		defer stop()
		cfg.Redis = url
		cfg.Log.Info("presenced dev: started redis-server", "url", url)
	}
	if cfg.NATSStoreDir == "" {
		dir, err := os.MkdirTemp("", "presenced-dev-nats-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		cfg.NATSStoreDir = dir
	}
	cfg.logEvents = true
	cfg.routes = demoRoutes
	cfg.ready = func(addr, natsURL string) { fmt.Fprint(stdout, devBanner(cfg, addr, natsURL)) }
	return serve(ctx, cfg)
}

// devBanner is what dev prints once it runs: where everything is, and
// the command that follows its transitions from another terminal.
func devBanner(cfg serverConfig, addr, natsURL string) string {
	t := cfg.Timing.WithDefaults()
	return fmt.Sprintf(`
presenced dev is running (region %q).
  demo:      http://%[2]s/  (open it in several tabs; ?room=NAME picks a room)
  websocket: ws://%[2]s/v1/ws?session=SID&user=UID
  tokens:    http://%[2]s/dev/token?user=UID&rooms=ROOM,PREFIX-*  (for getToken; docs/TOKENS.md)
  nats:      %[3]s  (embedded nats-server; every transition is logged below)
             nats sub --server %[3]s 'presence.>'
  timing:    session TTL %[4]v, heartbeat %[5]v, offline grace %[6]v
Ctrl-C stops it.

`, cfg.Region, addr, natsURL, t.SessionTTL, t.Heartbeat, t.OfflineGrace)
}

// demoRoutes serves the demo page at / (dev, node --demo).
func demoRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write(demoPage)
	})
	mux.HandleFunc("GET /favicon.ico", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "image/svg+xml")
		w.Header().Set("Cache-Control", "max-age=86400")
		_, _ = io.WriteString(w, favicon)
	})
}

// startRedis runs redis-server on a unix socket in a temporary directory,
// without persistence, until stop is called. A socket, not a TCP port:
// nothing else can take it between choosing and binding, and nothing else
// can answer on it.
func startRedis(ctx context.Context) (url string, stop func(), err error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", nil, fmt.Errorf("dev needs Redis: set REDIS_URL=redis://host:6379, or install redis-server (Debian: apt-get install -y redis-server)")
	}
	dir, err := os.MkdirTemp("", "presenced-dev-redis-")
	if err != nil {
		return "", nil, err
	}
	sock := filepath.Join(dir, "redis.sock")
	cmd := exec.Command(bin, "--port", "0", "--unixsocket", sock, "--unixsocketperm", "700", "--dir", dir, "--save", "", "--appendonly", "no", "--loglevel", "warning")
	dieWithUs(cmd)
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("start redis-server: %w", err)
	}
	stop = func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); os.RemoveAll(dir) }
	url = "unix://" + sock
	c := redis.NewClient(&redis.Options{Network: "unix", Addr: sock})
	defer c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for c.Ping(ctx).Err() != nil {
		if time.Now().After(deadline) || ctx.Err() != nil {
			stop()
			return "", nil, fmt.Errorf("redis-server on %s did not answer", sock)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return url, stop, nil
}

package main

import (
	"context"
	_ "embed"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

//go:embed demo.html
var demoPage []byte

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
		addr, stop, err := startRedis(ctx)
		if err != nil {
			return err
		}
		defer stop()
		cfg.Redis = addr
		cfg.Log.Info("presenced dev: started redis-server", "addr", addr)
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
	cfg.routes = func(mux *http.ServeMux) {
		mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			_, _ = w.Write(demoPage)
		})
	}
	cfg.ready = func(addr string) {
		fmt.Fprintf(stdout, "\npresenced dev is running (region %q).\n  demo:      http://%s/  (open it in several tabs; ?room=NAME picks a room)\n  websocket: ws://%s/v1/ws?session=SID&user=UID\n  nats:      every transition on presence.> (logged below)\nCtrl-C stops it.\n\n", cfg.Region, addr, addr)
	}
	return serve(ctx, cfg)
}

// startRedis runs redis-server on a free loopback port in a temporary
// directory, without persistence, until stop is called.
func startRedis(ctx context.Context) (addr string, stop func(), err error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", nil, fmt.Errorf("dev needs Redis: set REDIS_URL=redis://host:6379, or install redis-server (Debian: apt-get install -y redis-server)")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir, err := os.MkdirTemp("", "presenced-dev-redis-")
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir, "--save", "", "--appendonly", "no", "--loglevel", "warning")
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("start redis-server: %w", err)
	}
	stop = func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); os.RemoveAll(dir) }
	addr = fmt.Sprintf("127.0.0.1:%d", port)
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for c.Ping(ctx).Err() != nil {
		if time.Now().After(deadline) || ctx.Err() != nil {
			stop()
			return "", nil, fmt.Errorf("redis-server on %s did not answer", addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return addr, stop, nil
}

// Package embedded runs the in-process nats-server presenced starts when
// no NATS URL is configured. It lives apart from package bus so that only
// the command links nats-server: bus, node and global are clients.
package embedded

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/presence-dev/presence/presence"
)

// Server defaults.
const (
	DefaultHost = "127.0.0.1"
	DefaultPort = 4222
)

// DefaultStoreDir is where an embedded server keeps JetStream data when
// Config.StoreDir is empty. Two servers must not share it.
func DefaultStoreDir() string { return filepath.Join(os.TempDir(), "presence-nats") }

// Config configures the in-process nats-server used when no NATS
// URL is configured. Zero fields take their defaults.
type Config struct {
	Host       string       // default 127.0.0.1
	Port       int          // default 4222; -1 picks a free port
	StoreDir   string       // JetStream storage; default DefaultStoreDir()
	ServerName string       // default: chosen by the server
	Logger     *slog.Logger // the server's log goes here; nil logs nothing
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Host == "" {
		c.Host = DefaultHost
	}
	if c.Port == 0 {
		c.Port = DefaultPort
	}
	if c.StoreDir == "" {
		c.StoreDir = DefaultStoreDir()
	}
	return c
}

// Validate checks c as given: call WithDefaults first to fill zero fields.
func (c Config) Validate() error {
	if c.Host == "" {
		return &presence.ConfigError{Field: "host", Rule: "must not be empty"}
	}
	if c.Port < -1 || c.Port == 0 || c.Port > 65535 {
		return &presence.ConfigError{Field: "port", Rule: fmt.Sprintf("must be -1 (any free port) or 1 to 65535, got %d", c.Port)}
	}
	if c.StoreDir == "" {
		return &presence.ConfigError{Field: "store dir", Rule: "must not be empty"}
	}
	return nil
}

// Start starts an in-process nats-server with JetStream and
// returns once it accepts clients. The caller owns it: Shutdown, then
// WaitForShutdown. Connect with s.ClientURL().
func Start(cfg Config) (*server.Server, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.StoreDir, 0o750); err != nil {
		return nil, fmt.Errorf("embedded: store dir: %w", err)
	}
	opts := &server.Options{
		ServerName: cfg.ServerName,
		Host:       cfg.Host,
		Port:       cfg.Port,
		JetStream:  true,
		StoreDir:   cfg.StoreDir,
		NoSigs:     true, // signals belong to the host process
		NoLog:      cfg.Logger == nil,
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded: %w", err)
	}
	if cfg.Logger != nil {
		s.SetLogger(slogAdapter{cfg.Logger}, false, false)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		s.WaitForShutdown()
		return nil, fmt.Errorf("embedded: nats-server on %s:%d not ready in 10s", cfg.Host, cfg.Port)
	}
	if !s.JetStreamEnabled() {
		s.Shutdown()
		s.WaitForShutdown()
		return nil, fmt.Errorf("embedded: JetStream did not start (store dir %s)", cfg.StoreDir)
	}
	return s, nil
}

// slogAdapter writes the server's log to a slog.Logger. Fatal is logged
// as an error: the host process decides whether to exit.
type slogAdapter struct{ l *slog.Logger }

func (a slogAdapter) log(level slog.Level, format string, v []any) {
	if ctx := context.Background(); a.l.Enabled(ctx, level) {
		a.l.Log(ctx, level, fmt.Sprintf(format, v...), "component", "nats-server")
	}
}

func (a slogAdapter) Noticef(format string, v ...any) { a.log(slog.LevelInfo, format, v) }
func (a slogAdapter) Warnf(format string, v ...any)   { a.log(slog.LevelWarn, format, v) }
func (a slogAdapter) Fatalf(format string, v ...any)  { a.log(slog.LevelError, format, v) }
func (a slogAdapter) Errorf(format string, v ...any)  { a.log(slog.LevelError, format, v) }
func (a slogAdapter) Debugf(format string, v ...any)  { a.log(slog.LevelDebug, format, v) }
func (a slogAdapter) Tracef(format string, v ...any)  { a.log(slog.LevelDebug, format, v) }

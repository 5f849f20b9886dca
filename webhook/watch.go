package webhook

import (
	"context"
	"fmt"
	"os"
	"time"
)

// LoadConfigFile reads and parses a configuration file.
func LoadConfigFile(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("webhook: config: %w", err)
	}
	c, err := ParseConfig(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// WatchConfig reloads path into d when the file's modification time or
// size changes (looked at every interval) and whenever reload receives
// (SIGHUP), until ctx ends. A file that does not load is logged and
// counted (config_reloads_total{result="error"}); d keeps the
// configuration it has.
func WatchConfig(ctx context.Context, path string, every time.Duration, reload <-chan struct{}, d *Dispatcher) {
	last := stamp(path)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-reload:
		case <-t.C:
			s := stamp(path)
			if s == last {
				continue
			}
		}
		last = stamp(path)
		c, err := LoadConfigFile(path)
		if err != nil {
			d.ReloadFailed()
		} else {
			err = d.Reload(c)
		}
		if err != nil {
			d.lg.Error("webhook: configuration not reloaded; the previous one stays", "err", err)
			continue
		}
		d.lg.Info("webhook: configuration reloaded", "path", path, "endpoints", len(c.Endpoints), "lanes", len(c.Lanes()))
	}
}

type fileStamp struct {
	mod  time.Time
	size int64
}

func stamp(path string) fileStamp {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}
	}
	return fileStamp{fi.ModTime(), fi.Size()}
}

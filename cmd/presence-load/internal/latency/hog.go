package latency

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/presence-dev/presence/cmd/presence-load/internal/load"
	"github.com/presence-dev/presence/cmd/presence-load/internal/measure"
)

// Hog busy-loops o.threads goroutines (GOMAXPROCS = o.threads) until it
// is stopped, o.duration passes (if set), or its parent goes away. It is
// its own process, so the kernel schedules it beside the node as it would
// any other tenant of the machine.
func Hog(ctx context.Context, o load.Options, out io.Writer) error {
	if !o.Given["duration"] {
		o.Duration = 0 // until stopped, not the latency runs' 10 s
	}
	if o.Threads < 1 {
		return errors.New("--threads must be at least 1")
	}
	runtime.GOMAXPROCS(o.Threads)
	if o.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.Duration)
		defer cancel()
	}
	parent := os.Getppid()
	var stop atomic.Bool
	var sink atomic.Uint64
	for range o.Threads {
		go func() {
			var x uint64
			for !stop.Load() {
				for i := range 1 << 20 {
					x += uint64(i) ^ x>>3
				}
			}
			sink.Add(x)
		}()
	}
	fmt.Fprintf(out, "hog: %d busy goroutines (pid %d)\n", o.Threads, os.Getpid())
	// Stop with the parent too: a latency run's hog must not outlive it.
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for ctx.Err() == nil && os.Getppid() == parent {
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}
	stop.Store(true)
	return nil
}

// hogProcess is a `presence-load hog` child of this process.
type hogProcess struct {
	cmd *exec.Cmd
}

// startHog starts `presence-load hog --threads n` and returns once it is
// burning CPU (polled from /proc, at most 5 s).
func startHog(ctx context.Context, n int) (*hogProcess, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "hog", "--threads", strconv.Itoa(n))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	// Killed if this process dies first; the hog also watches its parent.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	h := &hogProcess{cmd: cmd}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if s, err := measure.ProcCPU(cmd.Process.Pid); err == nil && s >= 0.1 {
			return h, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			h.stop()
			return nil, errors.New("the hog did not start burning CPU within 5s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (h *hogProcess) meter() measure.Meter { return measure.ProcMeter("hog", h.cmd.Process.Pid) }

func (h *hogProcess) stop() {
	_ = h.cmd.Process.Kill()
	_ = h.cmd.Wait()
}

package worker

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"time"
)

// workerProc is a bigroom-worker child process.
type WorkerProc struct {
	Cmd *exec.Cmd
	enc *json.Encoder
	dec *json.Decoder
	mu  sync.Mutex
}

func StartWorker() (*WorkerProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "bigroom-worker")
	stdin, stdout, err := StartPiped(cmd)
	if err != nil {
		return nil, err
	}
	return &WorkerProc{Cmd: cmd, enc: json.NewEncoder(stdin), dec: json.NewDecoder(bufio.NewReaderSize(stdout, 1<<20))}, nil
}

// call sends req (a workerReq, or a cfWorkerReq to a centrifugo-worker)
// and decodes the reply's "ok" into res.
func (p *WorkerProc) Call(req any, res any) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.enc.Encode(req); err != nil {
		return fmt.Errorf("worker %d: %w", p.Cmd.Process.Pid, err)
	}
	var reply struct {
		OK  json.RawMessage `json:"ok"`
		Err string          `json:"err"`
	}
	if err := p.dec.Decode(&reply); err != nil {
		return fmt.Errorf("worker %d: %w", p.Cmd.Process.Pid, err)
	}
	if reply.Err != "" {
		return fmt.Errorf("worker %d: %s", p.Cmd.Process.Pid, reply.Err)
	}
	if res == nil {
		return nil
	}
	return json.Unmarshal(reply.OK, res)
}

func (p *WorkerProc) Stop() {
	_ = p.Call(struct {
		Op string `json:"op"`
	}{"close"}, nil)
	done := make(chan struct{})
	go func() { _ = p.Cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = p.Cmd.Process.Kill()
		<-done
	}
}

package worker

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
)

// startChild starts this executable as a worker of the given mode (see
// startWorker).
func StartChild(mode string) (*WorkerProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, mode)
	stdin, stdout, err := StartPiped(cmd)
	if err != nil {
		return nil, err
	}
	return &WorkerProc{Cmd: cmd, enc: json.NewEncoder(stdin), dec: json.NewDecoder(bufio.NewReaderSize(stdout, 1<<20))}, nil
}

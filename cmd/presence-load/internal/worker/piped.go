package worker

import (
	"io"
	"os"
	"os/exec"
	"syscall"
)

// startPiped starts cmd, one of this tool's child processes, with pipes to
// its stdin and stdout and its stderr on ours. The kernel kills it when
// this process dies, however it dies.
func StartPiped(cmd *exec.Cmd) (io.WriteCloser, io.ReadCloser, error) {
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	return in, out, cmd.Start()
}

package main

import (
	"os/exec"
	"syscall"
)

// dieWithUs has the kernel kill cmd when presenced dies, however it dies:
// a SIGKILLed `presenced dev` must not leave its redis-server behind.
func dieWithUs(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

//go:build !linux

package main

import "os/exec"

// dieWithUs: only Linux can tie a child's life to ours; elsewhere a
// SIGKILLed `presenced dev` leaves its redis-server running.
func dieWithUs(*exec.Cmd) {}

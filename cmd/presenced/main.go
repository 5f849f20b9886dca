// Command presenced runs the presence service: an edge node (node), an
// all-in-one development setup (dev), the cross-region aggregator
// (aggregator), the webhook dispatcher (webhooks). main only maps
// signals and errors to exit codes; the work is in Run.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, cancel := context.WithCancel(context.Background())
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-sig
		fmt.Fprintf(os.Stderr, "presenced: %v: shutting down gracefully (again to exit at once)\n", s)
		cancel()
		<-sig
		fmt.Fprintln(os.Stderr, "presenced: second signal: exiting now")
		os.Exit(1)
	}()
	err := Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	var ue *usageError
	switch {
	case err == nil:
	case errors.As(err, &ue):
		fmt.Fprintln(os.Stderr, "presenced:", err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "presenced:", err)
		os.Exit(1)
	}
}

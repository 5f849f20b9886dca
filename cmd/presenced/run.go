package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// usageError is a bad command line: exit code 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

const usage = `usage: presenced <command> [flags]

commands:
  node        run an edge node (WebSocket + regional Redis + NATS)
  aggregator  run a cross-region aggregator (the global view)
  token       print a client token (JWT) for a user and rooms, signed with
              the nodes' secret or key (docs/TOKENS.md)
  webhooks    run a webhook dispatcher: the streams to HTTP endpoints
  dev         run everything on this machine: embedded NATS, a local
              redis-server, one node and a demo page
  upgrade     show the region's data format and its nodes' formats; with
              --finish, switch it to this release's (region/doc.go, Upgrading)
  version     print the version, commit, Go, protocol and data format

Run 'presenced <command> -h' for the command's flags. Every flag can also
be set with an environment variable: --session-ttl is PRESENCE_SESSION_TTL.
`

// Run runs one subcommand until ctx is done (a graceful stop) or it fails.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return &usageError{"no command given"}
	}
	switch args[0] {
	case "node":
		return runNodeCommand(ctx, args[1:], stdout, stderr)
	case "dev":
		return runDevCommand(ctx, args[1:], stdout, stderr)
	case "aggregator":
		return runAggregatorCommand(ctx, args[1:], stderr)
	case "token":
		return runTokenCommand(args[1:], stdout, stderr)
	case "webhooks":
		return runWebhooksCommand(ctx, args[1:], stderr)
	case "upgrade":
		return runUpgradeCommand(ctx, args[1:], stdout, stderr)
	case "version", "-version", "--version":
		fmt.Fprintln(stdout, versionLine(buildInfo()))
		return nil
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return &usageError{fmt.Sprintf("unknown command %q", args[0])}
}

// command is a long-running command: it parses its flags, runs until
// its context is done, and closes whatever its run started.
type command interface {
	parse(args []string, stderr io.Writer) error
	run(ctx context.Context) error
	close()
}

// runCommand parses c's flags and runs it: --help is no error, and what
// the run started is closed however it ends.
func runCommand(ctx context.Context, c command, args []string, stderr io.Writer) error {
	if err := c.parse(args, stderr); err != nil {
		if err == flag.ErrHelp {
			return nil
		}
		return err
	}
	defer c.close()
	return c.run(ctx)
}

// parseFlags parses args, then fills every flag not given on the command
// line from PRESENCE_<NAME> (dashes as underscores, upper case).
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return err
		}
		return &usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		return &usageError{fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		env := EnvName(f.Name)
		if v, ok := os.LookupEnv(env); ok {
			if e := f.Value.Set(v); e != nil {
				err = &usageError{fmt.Sprintf("%s=%q: %v", env, v, e)}
			}
		}
	})
	return err
}

// EnvName is the environment variable that sets a flag.
func EnvName(flagName string) string {
	return "PRESENCE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// durationFlag registers a duration flag whose zero value means "default".
func durationFlag(fs *flag.FlagSet, p *time.Duration, name, help string) {
	fs.DurationVar(p, name, 0, help)
}

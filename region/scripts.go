package region

import (
	"context"
	"embed"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

//go:embed lua/*.lua
var luaFS embed.FS

// load builds a script from lib.lua and the named body. The shebang makes
// Redis check memory once before a writing script starts, so a script
// either runs whole or not at all; read-only ones run on replicas too.
func load(name string, readOnly bool) *redis.Script { return loadFlags(name, readOnly, "") }

func loadFlags(name string, readOnly bool, extra string) *redis.Script {
	lib, err := luaFS.ReadFile("lua/lib.lua")
	if err != nil {
		panic(err) // embedded at build time
	}
	body, err := luaFS.ReadFile("lua/" + name + ".lua")
	if err != nil {
		panic(err)
	}
	var flags []string
	if readOnly {
		flags = append(flags, "no-writes")
	}
	if extra != "" {
		flags = append(flags, extra)
	}
	head := "#!lua\n"
	if len(flags) > 0 {
		head = "#!lua flags=" + strings.Join(flags, ",") + "\n"
	}
	// FORMAT, the newest data format this release reads, tells lib.lua's
	// state_read which encodings it knows.
	return redis.NewScript(head + "local FORMAT = " + strconv.Itoa(newestFormat) + "\n" + string(lib) + string(body))
}

var (
	scriptTouch    = load("touch", false)
	scriptRelease  = load("release", false)
	scriptReap     = load("reap", false)
	scriptClock    = load("clock", false)
	scriptAck      = load("ack", false)
	scriptSeen     = load("seen", false)
	scriptDue      = load("due", true)
	scriptDueAll   = loadFlags("dueall", true, "allow-cross-slot-keys")
	scriptSnapshot = load("snapshot", true)
	scriptState    = load("state", false)
	scriptCount    = load("count", true)
	scriptSessions = load("sessions", true)
	scriptRoster   = load("roster", true)
	scriptUsers    = load("users", true)
	scriptExtend   = load("extend", false)
	scriptHold     = load("hold", false)
	scriptRenumber = load("renumber", false)
	scriptUnhold   = load("unhold", false)
	scriptRegistry = load("registry", true)
	scriptSwitch   = load("switch", false)
	scriptFence    = load("fence", false)
)

var allScripts = []*redis.Script{scriptTouch, scriptRelease, scriptReap, scriptClock, scriptAck, scriptSeen, scriptDue, scriptDueAll, scriptSnapshot, scriptState, scriptCount, scriptSessions, scriptRoster, scriptUsers, scriptExtend, scriptHold, scriptRenumber, scriptUnhold, scriptRegistry, scriptSwitch, scriptFence}

type call struct {
	script *redis.Script
	keys   []string
	args   []any
}

// runAll sends calls in one pipeline (split per node on a cluster). Calls
// that find their script missing from a node's cache are sent again with
// EVAL, which also caches it there.
func runAll(ctx context.Context, rdb redis.UniversalClient, calls []call) ([]*redis.Cmd, error) {
	cmds := make([]*redis.Cmd, len(calls))
	send := func(idx []int, eval bool) {
		_, _ = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, i := range idx {
				c := calls[i]
				if eval {
					cmds[i] = c.script.Eval(ctx, p, c.keys, c.args...)
				} else {
					cmds[i] = c.script.EvalSha(ctx, p, c.keys, c.args...)
				}
			}
			return nil
		})
	}
	all := make([]int, len(calls))
	for i := range all {
		all[i] = i
	}
	send(all, false)
	var again []int
	for i, c := range cmds {
		if err := c.Err(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		send(again, true)
	}
	for _, c := range cmds {
		if err := c.Err(); err != nil && err != redis.Nil {
			return cmds, err
		}
	}
	return cmds, nil
}

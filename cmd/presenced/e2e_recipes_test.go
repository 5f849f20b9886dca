package main

import (
	"bufio"
	"go/ast"
	"go/parser"
	gotoken "go/token"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/presence-dev/presence/internal/testkit"
)

// The server recipes of docs/TOKENS.md, run as a backend would run them
// (Node.js and Python from the PATH, as `make deps` installs them), mint
// tokens a real node takes; the document shows them verbatim.

const (
	recipesDoc = "../../docs/TOKENS.md"
	recipeNode = "../../docs/recipes/presence-token.mjs"
	recipePy   = "../../docs/recipes/presence_token.py"
	recipeGo   = "../../node/example_test.go"
)

// need returns the path of a program the test runs, failing with the
// command that installs it.
func need(t *testing.T, program, install string) string {
	t.Helper()
	p, err := exec.LookPath(program)
	if err != nil {
		t.Fatalf("%s is not on the PATH (Debian: %s; make deps installs it)", program, install)
	}
	return p
}

// nodeRecipeServer is the Node.js recipe's handler on node:http; the
// logged-in user is the X-User header, their team X-Team.
const nodeRecipeServer = `
import { createServer } from "node:http";
const { presenceTokenHandler } = await import(process.env.RECIPE_URL);
const handler = presenceTokenHandler((req) => req.headers["x-user"] ? { id: req.headers["x-user"], team: req.headers["x-team"] } : null);
const srv = createServer((req, res) => (req.url === "/presence-token" ? handler(req, res) : res.writeHead(404).end()));
srv.listen(0, "127.0.0.1", () => console.log("listening " + srv.address().port));
`

// startNodeRecipe runs the Node.js recipe's endpoint and returns its
// address.
func startNodeRecipe(t *testing.T) string {
	t.Helper()
	abs, err := filepath.Abs(recipeNode)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(need(t, "node", "apt-get install -y nodejs"), "--input-type=module", "-e", nodeRecipeServer)
	cmd.Env = append(os.Environ(), "PRESENCE_JWT_SECRET="+e2eSecret, "RECIPE_URL="+(&url.URL{Scheme: "file", Path: abs}).String())
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	port := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		port <- strings.TrimPrefix(strings.TrimSpace(line), "listening ")
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case p := <-port:
		if p == "" {
			t.Fatal("the Node.js recipe's server exited before listening")
		}
		return "127.0.0.1:" + p
	case <-time.After(15 * time.Second):
		t.Fatal("the Node.js recipe's server did not start")
	}
	return ""
}

// fetchToken asks a /presence-token endpoint as user (none: "").
func fetchToken(t *testing.T, addr, user, team string) (int, http.Header, string) {
	t.Helper()
	h := http.Header{}
	if user != "" {
		h.Set("X-User", user)
		h.Set("X-Team", team)
	}
	return testkit.Get(t, "http://"+addr+"/presence-token", h)
}

// The Node.js recipe's endpoint answers the logged-in user's token, 401
// without a login, and its token joins the rooms it grants.
func TestRecipeNodeJS(t *testing.T) {
	skipIfShort(t, "end-to-end test")
	n := newEnv(t).startNode()
	addr := startNodeRecipe(t)
	if code, _, body := fetchToken(t, addr, "", ""); code != http.StatusUnauthorized {
		t.Fatalf("without a login: %d %q", code, body)
	}
	code, h, tok := fetchToken(t, addr, "alice", "7")
	if code != http.StatusOK || h.Get("Cache-Control") != "no-store" || !strings.HasPrefix(h.Get("Content-Type"), "text/plain") {
		t.Fatalf("the token answer: %d %v %q", code, h, tok)
	}
	c := dialURL(t, "ws://"+n.addr+"/v1/ws?session=s&access_token="+url.QueryEscape(tok), "alice", "s")
	c.join("team7-design")
	c.join("lobby")
	c.refusedWith(map[string]any{"type": "join", "room": "team8-design", "ref": "x"}, "forbidden")
}

// The Python recipe's presence_token mints a token a node takes,
// observe claim included.
func TestRecipePython(t *testing.T) {
	skipIfShort(t, "end-to-end test")
	n := newEnv(t).startNode()
	dir, err := filepath.Abs(filepath.Dir(recipePy))
	if err != nil {
		t.Fatal(err)
	}
	script := "import sys; sys.path.insert(0, sys.argv[1]); from presence_token import presence_token; " +
		`print(presence_token("bob", ["team7-*"], ttl_seconds=120, observe=True))`
	cmd := exec.Command(need(t, "python3", "apt-get install -y python3"), "-c", script, dir)
	cmd.Env = append(os.Environ(), "PRESENCE_JWT_SECRET="+e2eSecret)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python3: %v", err)
	}
	tok := strings.TrimSpace(string(out))
	c := dialURL(t, "ws://"+n.addr+"/v1/ws?session=s&access_token="+url.QueryEscape(tok), "bob", "s")
	c.join("team7-a")
	c.send(map[string]any{"type": "join", "room": "team7-b", "present": false, "ref": "o"})
	c.expect("snapshot")
	c.refusedWith(map[string]any{"type": "join", "room": "lobby", "ref": "x"}, "forbidden")
}

// docs/TOKENS.md shows the tested recipes as they are: the Node.js and
// Python files whole, the Go handler of node's example.
func TestTokensDocShowsTheRecipes(t *testing.T) {
	doc, err := os.ReadFile(recipesDoc)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{recipeNode, recipePy} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(doc), string(b)) {
			t.Errorf("%s does not show %s as it is", recipesDoc, f)
		}
	}
	src, err := os.ReadFile(recipeGo)
	if err != nil {
		t.Fatal(err)
	}
	fset := gotoken.NewFileSet()
	file, err := parser.ParseFile(fset, recipeGo, src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var handler string
	for _, d := range file.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Name.Name == "presenceTokenHandler" {
			handler = string(src[fset.Position(fd.Pos()).Offset:fset.Position(fd.End()).Offset])
		}
	}
	if handler == "" || !strings.Contains(string(doc), handler) {
		t.Errorf("%s does not show presenceTokenHandler of %s as it is", recipesDoc, recipeGo)
	}
}

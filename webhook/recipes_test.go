package webhook

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The receiver recipes in docs/WEBHOOKS.md are the tested files,
// verbatim: the Node one runs with node --test, the Python one with
// unittest, the Go one is Example_verifyWebhook.
func TestWebhookRecipesAreTheTestedCode(t *testing.T) {
	doc := read(t, "../docs/WEBHOOKS.md")
	goSrc := read(t, "example_test.go")
	start, end := strings.Index(goSrc, "// recipe: go\n"), strings.Index(goSrc, "// end recipe")
	if start < 0 || end < start {
		t.Fatal("example_test.go: no recipe markers")
	}
	for name, code := range map[string]string{
		"go":     goSrc[start+len("// recipe: go\n") : end],
		"node":   read(t, "../docs/webhooks/verify.mjs"),
		"python": read(t, "../docs/webhooks/verify.py"),
	} {
		if !strings.Contains(doc, strings.TrimSpace(code)) {
			t.Errorf("docs/WEBHOOKS.md does not hold the %s recipe as tested", name)
		}
	}
}

func TestWebhookRecipesRun(t *testing.T) {
	for _, c := range []struct {
		tool, install string
		args          []string
	}{
		{"node", "apt-get install -y nodejs", []string{"--test", "../docs/webhooks/"}},
		{"python3", "apt-get install -y python3", []string{"-m", "unittest", "discover", "-s", "../docs/webhooks"}},
	} {
		if _, err := exec.LookPath(c.tool); err != nil {
			t.Fatalf("%s is needed for the receiver recipes: %s (make deps installs it)", c.tool, c.install)
		}
		out, err := exec.Command(c.tool, c.args...).CombinedOutput()
		if err != nil {
			t.Errorf("%s %v: %v\n%s", c.tool, c.args, err, out)
		}
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

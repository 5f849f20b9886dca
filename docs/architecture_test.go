package docs

import (
	"io/fs"
	"os"
	"regexp"
	"strings"
	"testing"
)

// The map in ARCHITECTURE.md names files and tests: every file it names
// exists, and every test of its invariants table is a test function of
// the file named beside it, so the map cannot rot as the code moves.
func TestArchitectureMapExists(t *testing.T) {
	b, err := os.ReadFile("ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	repo := os.DirFS("..")
	paths := 0
	for _, p := range backquotedPaths(doc) {
		if _, err := fs.Stat(repo, strings.TrimSuffix(p, "/")); err != nil {
			t.Errorf("ARCHITECTURE.md names %s: %v", p, err)
		}
		paths++
	}
	rows := invariantRows(t, doc)
	tests := 0
	for _, r := range rows {
		if len(r.tests) == 0 {
			t.Errorf("invariant %q names no test", r.invariant)
		}
		for file, names := range r.tests {
			src, err := fs.ReadFile(repo, file)
			if err != nil {
				t.Errorf("invariant %q: %v", r.invariant, err)
				continue
			}
			for _, name := range names {
				if !regexp.MustCompile(`(?m)^func ` + name + `\(t \*testing\.T\)`).Match(src) {
					t.Errorf("invariant %q: %s has no func %s", r.invariant, file, name)
				}
				tests++
			}
		}
	}
	if len(rows) < 20 || tests < 40 || paths < 60 {
		t.Fatalf("read %d invariants, %d tests, %d paths: is the table's format the one this test reads?", len(rows), tests, paths)
	}
}

// backquotedPaths are the `quoted` words of doc that name a file or a
// directory of the repository: a path with a slash or a file extension
// of ours, without the shapes of subjects, keys and commands.
func backquotedPaths(doc string) []string {
	var out []string
	for _, m := range regexp.MustCompile("`([^` ]+)`").FindAllStringSubmatch(doc, -1) {
		w := m[1]
		if strings.ContainsAny(w, "<>{}:*") || strings.HasPrefix(w, "go ") {
			continue
		}
		if strings.Contains(w, "/") || strings.HasSuffix(w, ".go") || strings.HasSuffix(w, ".lua") || strings.HasSuffix(w, ".txt") {
			out = append(out, w)
		}
	}
	return out
}

type invariantRow struct {
	invariant string
	tests     map[string][]string // test file -> test names
}

// invariantRows reads the table under "| invariant | where | tests |":
// its tests cell lists `file`: `TestA`, `TestB`; `file2`: `TestC`.
func invariantRows(t *testing.T, doc string) []invariantRow {
	t.Helper()
	_, table, ok := strings.Cut(doc, "| invariant | where | tests |\n|---|---|---|\n")
	if !ok {
		t.Fatal("ARCHITECTURE.md has no invariants table")
	}
	quoted := regexp.MustCompile("`([^`]+)`")
	var rows []invariantRow
	for _, line := range strings.Split(table, "\n") {
		if !strings.HasPrefix(line, "| ") {
			break
		}
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if len(cells) != 3 {
			t.Fatalf("invariants row %q: want three cells", line)
		}
		r := invariantRow{invariant: cells[0], tests: map[string][]string{}}
		for _, part := range strings.Split(cells[2], "; ") {
			file, names, ok := strings.Cut(part, ": ")
			if !ok {
				t.Fatalf("invariant %q: %q is not `file`: `Test...`", cells[0], part)
			}
			file = strings.Trim(file, "`")
			for _, m := range quoted.FindAllStringSubmatch(names, -1) {
				r.tests[file] = append(r.tests[file], m[1])
			}
		}
		rows = append(rows, r)
	}
	return rows
}

package protocol

import (
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The page and the code name the same codes: every error code, close code
// and frame type declared in protocol.go is in PROTOCOL.md's tables (or,
// for node-to-client frames, its examples), and every one the page names
// is declared. Adding a code on either side alone fails here.

// declared returns protocol.go's constants, by const block: the block's
// doc comment's first word, then name -> value.
func declared(t *testing.T) map[string]map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "protocol.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST || g.Doc == nil {
			continue
		}
		block := strings.Fields(g.Doc.Text())[0]
		if out[block] == nil {
			out[block] = map[string]string{}
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			for i, n := range vs.Names {
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok {
					t.Fatalf("%s is not a literal", n.Name)
				}
				v := lit.Value
				if lit.Kind == token.STRING {
					v, _ = strconv.Unquote(v)
				}
				out[block][n.Name] = v
			}
		}
	}
	return out
}

// section returns the text of doc from the line that is heading up to the
// next heading of the same or a higher level.
func section(t *testing.T, doc, heading string) string {
	t.Helper()
	i := strings.Index(doc, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("PROTOCOL.md has no %q", heading)
	}
	rest := doc[i+len(heading)+2:]
	level := strings.SplitN(heading, " ", 2)[0]
	for j := 0; j < len(rest); {
		k := strings.Index(rest[j:], "\n#")
		if k < 0 {
			break
		}
		line := rest[j+k+1:]
		if h := strings.SplitN(line, " ", 2)[0]; strings.Trim(h, "#") == "" && len(h) <= len(level) {
			return rest[:j+k]
		}
		j += k + 2
	}
	return rest
}

// firstCells returns the first cell of each row of the first table in
// text after the line that starts with after, matched by re (one group).
func firstCells(t *testing.T, text, after string, re *regexp.Regexp) []string {
	t.Helper()
	i := strings.Index(text, after)
	if i < 0 {
		t.Fatalf("PROTOCOL.md has no %q", after)
	}
	var cells []string
	inTable := false
	for _, line := range strings.Split(text[i:], "\n") {
		if !strings.HasPrefix(line, "|") {
			if inTable {
				break
			}
			continue
		}
		inTable = true
		cell := strings.TrimSpace(strings.Split(line, "|")[1])
		if m := re.FindStringSubmatch(cell); m != nil {
			cells = append(cells, m[1])
		}
	}
	return cells
}

func readDoc(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../docs/PROTOCOL.md")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// sameSet compares the values the doc names with the declared ones; a
// table (repeats false) names each once.
func sameSet(t *testing.T, what string, doc []string, repeats bool, code map[string]string) {
	t.Helper()
	got := slices.Sorted(maps.Values(code))
	want := slices.Clone(doc)
	slices.Sort(want)
	if !repeats && len(slices.Compact(slices.Clone(want))) != len(want) {
		t.Errorf("PROTOCOL.md lists a %s twice: %v", what, want)
	}
	if !slices.Equal(slices.Compact(want), got) {
		t.Errorf("%ss: PROTOCOL.md %v, protocol.go %v", what, want, got)
	}
}

func TestErrorCodesAreThoseOfTheDoc(t *testing.T) {
	doc := section(t, readDoc(t), "## Errors")
	cells := firstCells(t, doc, "| code |", regexp.MustCompile("^`([a-z_]+)`$"))
	if len(cells) < 10 {
		t.Fatalf("read %d error codes from PROTOCOL.md: the table's shape changed", len(cells))
	}
	sameSet(t, "error code", cells, false, declared(t)["Error"])
}

func TestCloseCodesAreThoseOfTheDoc(t *testing.T) {
	doc := readDoc(t)
	cells := firstCells(t, doc, "Close codes the node sends:", regexp.MustCompile(`^([0-9]{4})$`))
	if len(cells) < 8 {
		t.Fatalf("read %d close codes from PROTOCOL.md: the table's shape changed", len(cells))
	}
	sameSet(t, "close code", cells, false, declared(t)["Close"])
}

func TestFrameTypesAreThoseOfTheDoc(t *testing.T) {
	doc := readDoc(t)
	requests := firstCells(t, section(t, doc, "### Client to node"), "| type |", regexp.MustCompile("^`([a-z_]+)`$"))
	c := declared(t)
	sameSet(t, "request type", requests, false, c["Client-to-node"])
	// The unknown_type row counts the request types in words.
	words := []string{"zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"}
	if n := len(requests); n >= len(words) || !strings.Contains(doc, "`type` is not one of the "+words[n]+" above") {
		t.Errorf("the unknown_type row does not say %d request types", n)
	}
	// Every frame the examples show, either way, is a declared type.
	var shown []string
	for _, m := range regexp.MustCompile(`\{"type":"([a-z_]+)"`).FindAllStringSubmatch(doc, -1) {
		shown = append(shown, m[1])
	}
	all := maps.Clone(c["Client-to-node"])
	maps.Copy(all, c["Node-to-client"])
	sameSet(t, "frame type", shown, true, all)
}

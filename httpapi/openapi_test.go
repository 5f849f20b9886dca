package httpapi

import (
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/presence-dev/presence/internal/apitest"
)

// The document describes exactly the endpoints served, with their
// methods and scopes: admin for the disconnects, read for the rest.
func TestTheDocumentListsEveryEndpoint(t *testing.T) {
	doc, err := apitest.Document()
	if err != nil {
		t.Fatal(err)
	}
	table := (&handlers{}).table()
	var served, documented []string
	for p, rt := range table {
		served = append(served, rt.method+" "+p)
	}
	served = append(served, "GET "+PathOpenAPI)
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			documented = append(documented, method+" "+path)
			if rt, ok := table[path]; ok && (rt.scope == ScopeAdmin) != slices.Contains(op.Tags, "admin") {
				t.Errorf("%s %s: scope %s, tags %v", method, path, rt.scope, op.Tags)
			}
		}
	}
	sort.Strings(served)
	sort.Strings(documented)
	if strings.Join(served, "\n") != strings.Join(documented, "\n") {
		t.Fatalf("served:\n%s\ndocumented:\n%s", strings.Join(served, "\n"), strings.Join(documented, "\n"))
	}
	// Each pattern the mux routes is one of the Prefixes a server mounts.
	for p := range table {
		ok := false
		for _, pre := range Prefixes {
			ok = ok || p == pre || (strings.HasSuffix(pre, "/") && strings.HasPrefix(p, pre))
		}
		if !ok {
			t.Errorf("%s is under none of %v", p, Prefixes)
		}
	}
}

// docs/openapi.yaml is an OpenAPI 3.1 document kin-openapi loads and
// validates whole (apitest.Document checks the version and runs its
// validator).
func TestOpenAPIDocumentIsValid(t *testing.T) {
	doc, err := apitest.Document()
	if err != nil {
		t.Fatal(err)
	}
	if doc.OpenAPI != "3.1.0" || doc.Components.SecuritySchemes["apiKey"] == nil {
		t.Fatalf("openapi %s, security schemes %v", doc.OpenAPI, doc.Components.SecuritySchemes)
	}
}

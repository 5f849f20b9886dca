package deploy

import (
	"bufio"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

// rules is a Prometheus rule file, decoded strictly: a misspelt field
// fails as promtool check rules would.
type rules struct {
	Groups []struct {
		Name     string `json:"name"`
		Interval string `json:"interval,omitempty"`
		Rules    []struct {
			Alert       string            `json:"alert,omitempty"`
			Record      string            `json:"record,omitempty"`
			Expr        string            `json:"expr"`
			For         string            `json:"for,omitempty"`
			Labels      map[string]string `json:"labels,omitempty"`
			Annotations map[string]string `json:"annotations,omitempty"`
		} `json:"rules"`
	} `json:"groups"`
}

// query is one PromQL expression and where it is.
type query struct{ where, expr string }

// grafanaVars stand for what Grafana substitutes before a query reaches
// Prometheus.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")

// Every query of the dashboard and every rule's expression parses with
// Prometheus's own PromQL parser, and the metrics they select are
// exactly deploy/grafana/metrics.txt, which cmd/presenced's
// TestDashboardMetricsAreExported finds in a running node's and
// aggregator's /metrics. The alerts the issue asks for are there.
func TestDashboardQueries(t *testing.T) {
	qs := dashboardQueries(t)
	alerts := map[string]bool{}
	qs = append(qs, ruleQueries(t, alerts)...)
	for _, want := range []string{"PresenceFlapping", "PresenceHeartbeatNearTTL", "PresenceRegionDown", "PresenceWebhookStalled"} {
		if !alerts[want] {
			t.Errorf("presence-alerts.yml: no alert %s", want)
		}
	}
	used := map[string]bool{}
	p := parser.NewParser(parser.Options{})
	for _, q := range qs {
		expr, err := p.ParseExpr(grafanaVars.Replace(q.expr))
		if err != nil {
			t.Errorf("%s: %q: %v", q.where, q.expr, err)
			continue
		}
		n := 0
		parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
			if vs, ok := node.(*parser.VectorSelector); ok {
				if vs.Name == "" {
					t.Errorf("%s: %q: a selector without a metric name", q.where, q.expr)
				}
				used[vs.Name] = true
				n++
			}
			return nil
		})
		if n == 0 && !strings.Contains(q.expr, "vector(") {
			t.Errorf("%s: %q selects no metric", q.where, q.expr)
		}
	}
	listed := metricList(t)
	for name := range used {
		if !slices.Contains(listed, name) {
			t.Errorf("a query selects %s, which grafana/metrics.txt does not list (so no test checks it is exported)", name)
		}
	}
	for _, name := range listed {
		if !used[name] {
			t.Errorf("grafana/metrics.txt lists %s, which no query selects", name)
		}
	}
}

// dashboardQueries returns every target's expression, checking the
// dashboard's shape on the way: unique panel ids, each target with a
// refId unique in its panel and the datasource variable.
func dashboardQueries(t *testing.T) []query {
	t.Helper()
	raw, err := os.ReadFile("grafana/presence.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID        string `json:"uid"`
		Title      string `json:"title"`
		Templating struct {
			List []struct {
				Name, Type string
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			ID      int    `json:"id"`
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				RefID      string `json:"refId"`
				Expr       string `json:"expr"`
				Datasource struct {
					Type, UID string
				} `json:"datasource"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("presence.json: %v", err)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("presence.json: uid %q title %q", d.UID, d.Title)
	}
	if !slices.ContainsFunc(d.Templating.List, func(v struct{ Name, Type string }) bool {
		return v.Name == "datasource" && v.Type == "datasource"
	}) {
		t.Errorf("presence.json: no datasource variable: the dashboard would need editing to import")
	}
	var qs []query
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel %q: id %d taken", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if tg.RefID == "" || refs[tg.RefID] {
				t.Errorf("panel %q: refId %q empty or taken", p.Title, tg.RefID)
			}
			refs[tg.RefID] = true
			if tg.Datasource.Type != "prometheus" || tg.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q: datasource %+v, want the ${datasource} variable", p.Title, tg.Datasource)
			}
			qs = append(qs, query{"panel " + p.Title, tg.Expr})
		}
	}
	return qs
}

// ruleQueries returns every rule's expression, checking each rule:
// an alert or a record, durations Prometheus reads, a severity and a
// summary on every alert.
func ruleQueries(t *testing.T, alerts map[string]bool) []query {
	t.Helper()
	raw, err := os.ReadFile("grafana/presence-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var r rules
	if err := yaml.UnmarshalStrict(raw, &r); err != nil {
		t.Fatalf("presence-alerts.yml: %v", err)
	}
	var qs []query
	for _, g := range r.Groups {
		for _, rule := range g.Rules {
			name := rule.Alert + rule.Record
			if (rule.Alert == "") == (rule.Record == "") {
				t.Errorf("group %s: rule %q: want exactly one of alert and record", g.Name, name)
			}
			if rule.For != "" {
				if _, err := model.ParseDuration(rule.For); err != nil {
					t.Errorf("%s: for %q: %v", name, rule.For, err)
				}
			}
			if rule.Alert != "" {
				alerts[rule.Alert] = true
				if rule.Labels["severity"] == "" || rule.Annotations["summary"] == "" {
					t.Errorf("%s: want a severity label and a summary", name)
				}
			}
			qs = append(qs, query{"rule " + name, rule.Expr})
		}
	}
	return qs
}

func metricList(t *testing.T) []string {
	t.Helper()
	f, err := os.Open("grafana/metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var names []string
	for sc := bufio.NewScanner(f); sc.Scan(); {
		if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasPrefix(l, "#") {
			names = append(names, l)
		}
	}
	return names
}

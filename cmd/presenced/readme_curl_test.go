package main

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
)

// curlCall is one curl command of the README, its variables expanded.
type curlCall struct {
	line, method, url, body string
	header                  http.Header
}

// readmeCurls returns the curl commands of the README section heading,
// in order, expanded with vars.
func readmeCurls(t *testing.T, heading string, vars map[string]string) []curlCall {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("README has no %q", heading)
	}
	s = s[i+len(heading)+2:]
	if j := strings.Index(s, "\n## "); j >= 0 {
		s = s[:j]
	}
	var out []curlCall
	for _, line := range strings.Split(s, "\n") {
		if !strings.HasPrefix(line, "curl ") {
			continue
		}
		c, err := parseCurl(line, vars)
		if err != nil {
			t.Fatalf("README: %q: %v", line, err)
		}
		out = append(out, c)
	}
	return out
}

// parseCurl reads the curl options the README uses: -s, -H, -d, -X and
// the URL.
func parseCurl(line string, vars map[string]string) (curlCall, error) {
	words, err := shellWords(line, vars)
	if err != nil {
		return curlCall{}, err
	}
	c := curlCall{line: line, method: http.MethodGet, header: http.Header{}}
	for i := 1; i < len(words); i++ {
		w := words[i]
		next := func() (string, error) {
			if i+1 >= len(words) {
				return "", fmt.Errorf("%s without a value", w)
			}
			i++
			return words[i], nil
		}
		var v string
		switch w {
		case "-s":
		case "-H":
			if v, err = next(); err == nil {
				k, val, _ := strings.Cut(v, ":")
				c.header.Add(strings.TrimSpace(k), strings.TrimSpace(val))
			}
		case "-d":
			if v, err = next(); err == nil {
				c.body, c.method = v, http.MethodPost
			}
		case "-X":
			c.method, err = next()
		default:
			if strings.HasPrefix(w, "-") || c.url != "" {
				return curlCall{}, fmt.Errorf("option or argument %q not understood", w)
			}
			c.url = w
		}
		if err != nil {
			return curlCall{}, err
		}
	}
	return c, nil
}

// shellWords splits a command line as sh would for what the README
// writes: single quotes, double quotes, $NAME in double quotes and bare.
func shellWords(line string, vars map[string]string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord, quote := false, byte(0)
	for i := 0; i < len(line); i++ {
		ch := line[i]
		switch {
		case quote == '\'' && ch == '\'', quote == '"' && ch == '"':
			quote = 0
		case quote == '\'':
			cur.WriteByte(ch)
		case ch == '$' && quote != '\'':
			j := i + 1
			for j < len(line) && (line[j] == '_' || line[j] >= 'A' && line[j] <= 'Z') {
				j++
			}
			name := line[i+1 : j]
			v, ok := vars[name]
			if !ok {
				return nil, fmt.Errorf("variable $%s not set by the test", name)
			}
			cur.WriteString(v)
			inWord, i = true, j-1
		case quote == '"':
			cur.WriteByte(ch)
		case ch == '\'' || ch == '"':
			quote, inWord = ch, true
		case ch == ' ':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteByte(ch)
			inWord = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unclosed %c", quote)
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

func TestShellWords(t *testing.T) {
	w, err := shellWords(`curl -s -H "Authorization: Bearer $KEY" -d '{"a":"'"$UNTIL"'"}' "$P/x?a=1&b=2"`, map[string]string{"KEY": "k", "UNTIL": "u", "P": "http://h"})
	if err != nil || strings.Join(w, "|") != `curl|-s|-H|Authorization: Bearer k|-d|{"a":"u"}|http://h/x?a=1&b=2` {
		t.Fatalf("%q %v", w, err)
	}
	if _, err := shellWords(`curl "$NOPE"`, nil); err == nil {
		t.Fatal("an unset variable expanded")
	}
}

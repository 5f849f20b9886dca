package apitest

import (
	"net/http"
	"strings"
	"testing"
)

// The validator catches a drifted answer: a field the document does not
// have, one it requires missing, a wrong type, an undocumented code.
func TestValidateCatchesDrift(t *testing.T) {
	c := New(t, "http://127.0.0.1:1", "")
	req, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1:1/v1/rooms/room42/count", nil)
	h := http.Header{"Content-Type": {"application/json"}}
	for _, x := range []struct {
		status int
		body   string
		ok     bool
	}{
		{200, `{"region":"eu","room":"room42","count":3}`, true},
		{200, `{"region":"eu","room":"room42","count":3,"extra":1}`, false},
		{200, `{"region":"eu","room":"room42"}`, false},
		{200, `{"region":"eu","room":"room42","count":"3"}`, false},
		{200, `{"region":"eu","room":"room.42","count":3}`, false},
		{400, `{"code":"400","error":"bad"}`, true},
		{400, `{"code":"418","error":"bad"}`, false},
		{400, `{"error":"bad"}`, false},
	} {
		err := c.Validate(req, &Response{Status: x.status, Header: h, Body: []byte(x.body)})
		if (err == nil) != x.ok {
			t.Errorf("%d %s: %v, want valid %t", x.status, x.body, err, x.ok)
		}
	}
	// A path the document has not: only a 404 or 405 error body passes.
	req, _ = http.NewRequest(http.MethodGet, "http://127.0.0.1:1/v1/nowhere", nil)
	if err := c.Validate(req, &Response{Status: 404, Header: h, Body: []byte(`{"code":"404","error":"no"}`)}); err != nil {
		t.Errorf("404 of an unknown path: %v", err)
	}
	if err := c.Validate(req, &Response{Status: 200, Header: h, Body: []byte(`{}`)}); err == nil || !strings.Contains(err.Error(), "no operation") {
		t.Errorf("200 of an unknown path: %v", err)
	}
}

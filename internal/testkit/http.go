package testkit

import (
	"io"
	"net/http"
	"testing"
)

// Get requests url with the headers h (nil: none) and returns the
// answer's status, headers and body; a request that fails fails the test.
func Get(tb testing.TB, url string, h http.Header) (int, http.Header, string) {
	tb.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		tb.Fatal(err)
	}
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

package measure

import (
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
)

func TestHistogramsReadsBucketsAndQuantilesAreBucketBounds(t *testing.T) {
	page := func(c1, c2, c3, inf int) string {
		return "# HELP x_seconds x\n# TYPE x_seconds histogram\n" +
			"x_seconds_bucket{le=\"0.001\"} " + itoa(c1) + "\n" +
			"x_seconds_bucket{le=\"0.005\"} " + itoa(c2) + "\n" +
			"x_seconds_bucket{le=\"0.01\"} " + itoa(c3) + "\n" +
			"x_seconds_bucket{le=\"+Inf\"} " + itoa(inf) + "\n" +
			"x_seconds_sum 1\nx_seconds_count " + itoa(inf) + "\n" +
			"other_bucket{le=\"1\"} 5\n" +
			"x_seconds_bucket{le=\"2\"} \n" // no value: skipped, not a panic
	}
	body := page(10, 20, 30, 30)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(body)) }))
	defer srv.Close()
	before, err := Histograms(srv.URL, "x_seconds")
	if err != nil {
		t.Fatal(err)
	}
	body = page(10, 110, 128, 130)
	after, err := Histograms(srv.URL, "x_seconds")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := after["other"]; ok {
		t.Fatal("read a histogram not asked for")
	}
	d := after["x_seconds"].Sub(before["x_seconds"])
	// 100 new observations: none <= 1 ms, 90 <= 5 ms, 98 <= 10 ms, 2 above.
	for _, c := range []struct{ q, want float64 }{{0.5, 0.005}, {0.9, 0.005}, {0.98, 0.01}, {0.99, math.Inf(1)}} {
		if got, n := d.Quantile(c.q); got != c.want || n != 100 {
			t.Errorf("q%.2f = %v of %v, want %v of 100", c.q, got, n, c.want)
		}
	}
	if got, n := (Histogram{}).Quantile(0.5); !math.IsNaN(got) || n != 0 {
		t.Errorf("empty: %v of %v, want NaN of 0", got, n)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

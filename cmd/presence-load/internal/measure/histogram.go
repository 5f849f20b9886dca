package measure

import (
	"math"
	"slices"
	"strconv"
	"strings"
)

// Histogram is one Prometheus histogram as scraped: cumulative counts by
// upper bound, in bound order (the last +Inf).
type Histogram struct {
	Bounds []float64
	Counts []float64
}

// Histograms reads the named histograms (without their _bucket suffix,
// series without labels other than le) from a Prometheus text page.
func Histograms(u string, names ...string) (map[string]Histogram, error) {
	out := map[string]Histogram{}
	err := scrapeLines(u, func(line string) {
		name, rest, ok := strings.Cut(line, `_bucket{le="`)
		if !ok || !slices.Contains(names, name) {
			return
		}
		le, val, ok := strings.Cut(rest, `"} `)
		if !ok {
			return
		}
		fields := strings.Fields(val)
		if len(fields) == 0 {
			return
		}
		b, err1 := strconv.ParseFloat(le, 64)
		c, err2 := strconv.ParseFloat(fields[0], 64)
		if err1 != nil || err2 != nil {
			return
		}
		h := out[name]
		h.Bounds, h.Counts = append(h.Bounds, b), append(h.Counts, c)
		out[name] = h
	})
	return out, err
}

// Sub is what h counted since before (the same histogram, read earlier).
func (h Histogram) Sub(before Histogram) Histogram {
	out := Histogram{Bounds: h.Bounds, Counts: slices.Clone(h.Counts)}
	if len(before.Counts) == len(h.Counts) {
		for i := range out.Counts {
			out.Counts[i] -= before.Counts[i]
		}
	}
	return out
}

// Quantile is the upper bound of the bucket holding the q-th observation
// (+Inf past the last finite bound), and the count: a bucket's bound, not
// an interpolation.
func (h Histogram) Quantile(q float64) (float64, float64) {
	if len(h.Counts) == 0 || h.Counts[len(h.Counts)-1] == 0 {
		return math.NaN(), 0
	}
	n := h.Counts[len(h.Counts)-1]
	rank := math.Ceil(q * n)
	for i, c := range h.Counts {
		if c >= rank {
			return h.Bounds[i], n
		}
	}
	return math.Inf(1), n
}

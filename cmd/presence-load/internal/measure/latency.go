package measure

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Never ranks a join whose online never arrived on a path (missing, or
// replaced by a resync snapshot) above every measured latency, so that a
// percentile covering it cannot look good.
const Never = time.Duration(math.MaxInt64)

// Percentile is the nearest-rank percentile (q in (0,1]): the smallest
// value with at least q of the values at or below it. Empty: 0.
func Percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(q * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

// Codes formats a count per code, sorted by code.
func Codes(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

// FmtDur prints a latency with a precision that suits its size.
func FmtDur(d time.Duration) string {
	switch {
	case d == Never:
		return "never"
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
	case d < time.Second:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.2fs", d.Seconds())
	}
}

package webhook

import "time"

// retryDelay is the wait before retry n (1 for the first): minB doubled
// per retry up to maxB, with equal jitter (a uniform pick in the upper
// half, rnd in [0, 1)) so receivers that fail together are not retried
// together. A receiver's Retry-After lengthens it, never past maxB.
func retryDelay(n int, minB, maxB, retryAfter time.Duration, rnd float64) time.Duration {
	d := minB
	for i := 1; i < n && d < maxB; i++ {
		d *= 2
	}
	d = min(d, maxB)
	d = d/2 + time.Duration(rnd*float64(d/2))
	return min(max(d, retryAfter), maxB)
}

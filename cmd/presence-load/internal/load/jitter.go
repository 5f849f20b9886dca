package load

import (
	"math/rand/v2"
	"time"
)

// Jitter is a client's own jitter on a hint: ±25 %, as the JS client's.
func Jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.75 + 0.5*rand.Float64()))
}

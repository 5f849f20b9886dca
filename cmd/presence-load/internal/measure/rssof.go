package measure

// RSSOf is procRSS as a float.
func RSSOf(pid int) (float64, error) {
	b, err := procRSS(pid)
	return float64(b), err
}

package measure

// rssOf is procRSS as a float.
func RssOf(pid int) (float64, error) {
	b, err := procRSS(pid)
	return float64(b), err
}

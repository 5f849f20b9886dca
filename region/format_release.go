//go:build !presenceformat3

package region

// newestFormat is the newest data format this release reads, and the one
// it writes once the region has switched to it (see schema.go).
const newestFormat = 2

// FormatVersion is the newest data format this store reads, and writes
// once the region is in it.
const FormatVersion = "2"

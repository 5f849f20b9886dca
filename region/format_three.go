//go:build presenceformat3

package region

// A build with the presenceformat3 tag is the next release of a test
// format, 3, that proves the rolling format change (doc.go, "Upgrading"):
// it reads formats 2 and 3, and once the region is in 3 it stores a
// session's state in st behind a '~' (state_write in lua/lib.lua), which
// a release of format 2 cannot read. No real release is built with it.
const newestFormat = 3

// FormatVersion is the newest data format this store reads, and writes
// once the region is in it.
const FormatVersion = "3"

package global

// ReadRegion lets the external tests and benchmarks read a region's
// truth as a publisher does.
var ReadRegion = readRegion

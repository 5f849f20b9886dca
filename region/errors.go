package region

import "errors"

// Errors a caller may test for with errors.Is.
var (
	ErrEmptyBatch    = errors.New("empty batch")
	ErrBatchTooLarge = errors.New("batch too large")
)

// OpError is returned by every store operation that fails: Op names the
// operation, Err the cause (an *presence.IDError, a batch error, or the
// Redis error). A failed operation wrote nothing.
type OpError struct {
	Op  string
	Err error
}

func (e *OpError) Error() string { return "region: " + e.Op + ": " + e.Err.Error() }
func (e *OpError) Unwrap() error { return e.Err }

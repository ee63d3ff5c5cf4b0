package batch

import "fmt"

// The service's error codes this package produces.
const (
	CodeInvalidInput        = "InvalidInput"
	CodeRequestBodyTooLarge = "RequestBodyTooLarge"
)

// Messages the service sends with those codes.
const (
	msgTooManyOps   = "The batch request operation exceeds the maximum 100 changes per change set."
	msgBodyTooLarge = "The request body is too large and exceeds the maximum permissible limit."
)

// Error is a batch the service refuses. Code and Status are what the
// service answers (Code goes in the odata.error body and the
// x-ms-error-code header); Message is its text.
//
// The service reports most refusals as a plain error response. A few it
// reports inside a 202 batch response, as if operation Index had failed:
// those have Batched set, and the gateway writes them with WriteFailure.
type Error struct {
	Code    string
	Status  int
	Message string
	Batched bool // answer 202 with WriteFailure at Index
	Index   int  // the operation blamed when Batched
}

func (e *Error) Error() string {
	return fmt.Sprintf("batch: %s (%d): %s", e.Code, e.Status, e.Message)
}

func invalid(format string, args ...any) *Error {
	return &Error{Code: CodeInvalidInput, Status: 400, Message: fmt.Sprintf(format, args...)}
}

package odata

import (
	"errors"
	"fmt"
)

// Sentinel errors, one per query option. Every error this package returns
// wraps exactly one of them (errors.Is); the gateway answers all three with
// 400 InvalidInput.
var (
	ErrInvalidFilter = errors.New("odata: invalid $filter")
	ErrInvalidSelect = errors.New("odata: invalid $select")
	ErrInvalidTop    = errors.New("odata: invalid $top")
)

// SyntaxError says what is wrong with a query option and where: Offset is
// the byte offset in the option's (URL-decoded) text. Its message is meant
// for the user who wrote the query, e.g. "$filter: expected a literal
// after 'eq' at offset 12".
type SyntaxError struct {
	Option string // "$filter", "$select" or "$top"
	Offset int
	Msg    string
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("%s: %s at offset %d", e.Option, e.Msg, e.Offset)
}

// Unwrap is the option's sentinel error.
func (e *SyntaxError) Unwrap() error {
	switch e.Option {
	case "$select":
		return ErrInvalidSelect
	case "$top":
		return ErrInvalidTop
	}
	return ErrInvalidFilter
}

func filterErr(off int, format string, args ...any) *SyntaxError {
	return &SyntaxError{Option: "$filter", Offset: off, Msg: fmt.Sprintf(format, args...)}
}

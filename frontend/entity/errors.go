package entity

import (
	"errors"
	"fmt"
)

// Error is a failure the Azure Table service reports with an error code:
// the gateway sends Status, Code (the x-ms-error-code header and the
// odata.error code) and Message (the service's own text) to the client.
// Detail says what exactly was wrong, for logs and tests; it is not part
// of the service's message.
//
// Two Errors match under errors.Is when their codes are equal, so
// errors.Is(err, ErrEntityTooLarge) holds for every EntityTooLarge
// failure; errors.As(err, &e) yields the code and status to send.
//
// An Error is immutable and safe for concurrent use.
type Error struct {
	Code    string // the service's error code, e.g. "EntityTooLarge"
	Status  int    // the HTTP status the service answers with
	Message string // the service's user message
	Detail  string // what was wrong, e.g. "property \"Big\": 32769 UTF-16 code units"
}

func (e *Error) Error() string {
	if e.Detail == "" {
		return "entity: " + e.Code + ": " + e.Message
	}
	return "entity: " + e.Code + ": " + e.Detail
}

// Is matches any *Error with the same Code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// with is a copy of the sentinel e carrying a detail.
func (e *Error) with(format string, args ...any) *Error {
	c := *e
	c.Detail = fmt.Sprintf(format, args...)
	return &c
}

// The codes this package reports, with the service's status and user
// message (Learn: "Table Storage error codes"; the messages the service
// sends for codes that page does not list are marked in doc.go).
var (
	ErrInvalidInput = &Error{Code: "InvalidInput", Status: 400,
		Message: "One of the request inputs is not valid."}
	ErrInvalidValueType = &Error{Code: "InvalidValueType", Status: 400,
		Message: "The value specified is invalid."}
	ErrDuplicatePropertiesSpecified = &Error{Code: "DuplicatePropertiesSpecified", Status: 400,
		Message: "A property is specified more than one time."}
	ErrPropertiesNeedValue = &Error{Code: "PropertiesNeedValue", Status: 400,
		Message: "Values have not been specified for all properties in the entity."}
	ErrPropertyNameInvalid = &Error{Code: "PropertyNameInvalid", Status: 400,
		Message: "The property name is invalid."}
	ErrPropertyNameTooLong = &Error{Code: "PropertyNameTooLong", Status: 400,
		Message: "The property name exceeds the maximum allowed length."}
	ErrPropertyValueTooLarge = &Error{Code: "PropertyValueTooLarge", Status: 400,
		Message: "The property value is larger than the maximum size permitted."}
	ErrTooManyProperties = &Error{Code: "TooManyProperties", Status: 400,
		Message: "The entity contains more properties than allowed."}
	ErrEntityTooLarge = &Error{Code: "EntityTooLarge", Status: 400,
		Message: "The entity is larger than the maximum size permitted."}
	ErrOutOfRangeInput = &Error{Code: "OutOfRangeInput", Status: 400,
		Message: "One of the request inputs is out of range."}
	ErrInvalidResourceName = &Error{Code: "InvalidResourceName", Status: 400,
		Message: "The specified resource name contains invalid characters."}
	ErrAtomFormatNotSupported = &Error{Code: "AtomFormatNotSupported", Status: 415,
		Message: "Atom format is not supported."}
	ErrJsonFormatNotSupported = &Error{Code: "JsonFormatNotSupported", Status: 415,
		Message: "JSON format is not supported."}
	ErrUpdateConditionNotSatisfied = &Error{Code: "UpdateConditionNotSatisfied", Status: 412,
		Message: "The update condition specified in the request was not satisfied."}
)

// ErrCorrupt is wrapped by every DecodeBinary and SplitKey failure: the
// stored bytes are not what AppendBinary or Key wrote.
var ErrCorrupt = errors.New("entity: corrupt stored entity")

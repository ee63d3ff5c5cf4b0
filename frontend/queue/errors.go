package queue

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/frontend/sharedkey"
)

// svcError is an error with the Queue service's status and code.
type svcError struct {
	status int
	code   string
	msg    string
	detail string // AuthenticationErrorDetail, if any
	cause  error
}

func (e *svcError) Error() string { return fmt.Sprintf("queue: %s (%d): %s", e.code, e.status, e.msg) }
func (e *svcError) Unwrap() error { return e.cause }

func newErr(status int, code, msg string) *svcError {
	return &svcError{status: status, code: code, msg: msg}
}

// The service's errors, as Azurite and the service word them.
var (
	errQueueNotFound      = newErr(http.StatusNotFound, "QueueNotFound", "The specified queue does not exist.")
	errQueueExists        = newErr(http.StatusConflict, "QueueAlreadyExists", "The specified queue already exists.")
	errMessageNotFound    = newErr(http.StatusNotFound, "MessageNotFound", "The specified message does not exist.")
	errPopReceiptMismatch = newErr(http.StatusBadRequest, "PopReceiptMismatch", "The specified pop receipt did not match the pop receipt for a dequeued message.")
	errInvalidXML         = newErr(http.StatusBadRequest, "InvalidXmlDocument", "XML specified is not syntactically valid.")
	errBodyTooLarge       = newErr(http.StatusRequestEntityTooLarge, "RequestBodyTooLarge", "The request body is too large and exceeds the maximum permissible limit.")
	errInvalidName        = newErr(http.StatusBadRequest, "InvalidResourceName", "The specified resource name contains invalid characters.")
	errNameLength         = newErr(http.StatusBadRequest, "OutOfRangeInput", "The specified resource name length is not within the permissible limits.")
	errMethod             = newErr(http.StatusMethodNotAllowed, "UnsupportedHttpVerb", "The resource doesn't support the specified HTTP verb.")
	errResourceNotFound   = newErr(http.StatusNotFound, "ResourceNotFound", "The specified resource does not exist.")
)

func errQueryValue(name, value, reason string) *svcError {
	return newErr(http.StatusBadRequest, "InvalidQueryParameterValue",
		fmt.Sprintf("Value for one of the query parameters specified in the request URI is invalid. (%s=%q: %s)", name, value, reason))
}

func errQueryRange(name, value string, lo, hi int64) *svcError {
	return newErr(http.StatusBadRequest, "OutOfRangeQueryParameterValue",
		fmt.Sprintf("One of the query parameters specified in the request URI is outside the permissible range. (%s=%q, want %d to %d)", name, value, lo, hi))
}

func errMissingQuery(name string) *svcError {
	return newErr(http.StatusBadRequest, "MissingRequiredQueryParameter",
		fmt.Sprintf("A query parameter that's mandatory for this request is not specified (%s).", name))
}

func errInvalidURI(path string) *svcError {
	return newErr(http.StatusBadRequest, "InvalidUri", fmt.Sprintf("The requested URI does not represent any resource on the server: %q.", path))
}

// toSvc maps any error to the service's status and code: the stable code
// a client acts on.
func toSvc(err error) *svcError {
	var se *svcError
	if errors.As(err, &se) {
		return se
	}
	var ke *sharedkey.Error
	if errors.As(err, &ke) {
		return &svcError{status: ke.Status, code: ke.Code, msg: ke.Message, detail: ke.Detail, cause: err}
	}
	switch {
	case errors.Is(err, ErrCorrupt):
		return &svcError{status: http.StatusInternalServerError, code: "InternalError", msg: "The server encountered an internal error: " + err.Error(), cause: err}
	case errors.Is(err, context.DeadlineExceeded):
		return &svcError{status: http.StatusInternalServerError, code: "OperationTimedOut", msg: "The operation could not be completed within the permitted time.", cause: err}
	case errors.Is(err, client.ErrOutcomeUnknown):
		return &svcError{status: http.StatusInternalServerError, code: "InternalError", msg: "The outcome of the operation is unknown; retry it: " + err.Error(), cause: err}
	}
	switch api.CodeOf(err) {
	case api.ErrorCode_ERROR_CODE_UNAVAILABLE, api.ErrorCode_ERROR_CODE_SERVER_BUSY, api.ErrorCode_ERROR_CODE_QUOTA_EXCEEDED, api.ErrorCode_ERROR_CODE_NOT_OWNER:
		return &svcError{status: http.StatusServiceUnavailable, code: "ServerBusy", msg: "The server is currently unable to receive requests. Please retry your request.", cause: err}
	case api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT:
		return &svcError{status: http.StatusBadRequest, code: "InvalidInput", msg: "One of the request inputs is not valid: " + err.Error(), cause: err}
	}
	return &svcError{status: http.StatusInternalServerError, code: "InternalError", msg: "The server encountered an internal error: " + err.Error(), cause: err}
}

// errorXML is an error's body as the service sends it.
func errorXML(e *svcError, requestID string, now time.Time) []byte {
	var b bytes.Buffer
	b.WriteString(`<?xml version="1.0" encoding="utf-8"?><Error><Code>`)
	_ = xml.EscapeText(&b, []byte(e.code))
	b.WriteString("</Code><Message>")
	_ = xml.EscapeText(&b, []byte(e.msg+"\nRequestId:"+requestID+"\nTime:"+now.UTC().Format("2006-01-02T15:04:05.0000000Z")))
	b.WriteString("</Message>")
	if e.detail != "" {
		b.WriteString("<AuthenticationErrorDetail>")
		_ = xml.EscapeText(&b, []byte(e.detail))
		b.WriteString("</AuthenticationErrorDetail>")
	}
	b.WriteString("</Error>")
	return b.Bytes()
}

package sharedkey

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"net/http"
)

// The service's error codes this package produces.
const (
	CodeAuthenticationFailed              = "AuthenticationFailed"
	CodeAuthorizationFailure              = "AuthorizationFailure"
	CodeAuthorizationPermissionMismatch   = "AuthorizationPermissionMismatch"
	CodeAuthorizationResourceTypeMismatch = "AuthorizationResourceTypeMismatch"
	CodeAuthorizationServiceMismatch      = "AuthorizationServiceMismatch"
	CodeAuthorizationProtocolMismatch     = "AuthorizationProtocolMismatch"
	CodeAuthorizationSourceIPMismatch     = "AuthorizationSourceIPMismatch"
)

// ErrStoredPolicy is the cause of refusing a SAS that names a stored
// access policy (si) when the Keys given to Verify do not implement
// Policies.
var ErrStoredPolicy = errors.New("sharedkey: stored access policies are not supported")

// Error is a refused request, as the service reports it. Detail is the
// service's AuthenticationErrorDetail (why a credential failed: the
// string it signed, the time window); it is "" for authorization
// errors.
type Error struct {
	Code    string
	Status  int
	Message string
	Detail  string
	Err     error // the cause, if any (e.g. ErrStoredPolicy)
}

func (e *Error) Error() string {
	s := fmt.Sprintf("sharedkey: %s (%d): %s", e.Code, e.Status, e.Message)
	if e.Detail != "" {
		s += " " + e.Detail
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

// XML is the error's body as the service sends it:
// <?xml ...?><Error><Code>..</Code><Message>..</Message>
// [<AuthenticationErrorDetail>..</AuthenticationErrorDetail>]</Error>.
// The gateway appends "\nRequestId:..\nTime:.." to Message first, as
// the service does, if it wants them.
func (e *Error) XML() []byte {
	var b bytes.Buffer
	b.WriteString(`<?xml version="1.0" encoding="utf-8"?><Error><Code>`)
	xml.EscapeText(&b, []byte(e.Code))
	b.WriteString("</Code><Message>")
	xml.EscapeText(&b, []byte(e.Message))
	b.WriteString("</Message>")
	if e.Detail != "" {
		b.WriteString("<AuthenticationErrorDetail>")
		xml.EscapeText(&b, []byte(e.Detail))
		b.WriteString("</AuthenticationErrorDetail>")
	}
	b.WriteString("</Error>")
	return b.Bytes()
}

const msgAuthenticationFailed = "Server failed to authenticate the request. Make sure the value of Authorization header is formed correctly including the signature."

func authFailed(format string, args ...any) *Error {
	return &Error{Code: CodeAuthenticationFailed, Status: http.StatusForbidden, Message: msgAuthenticationFailed, Detail: fmt.Sprintf(format, args...)}
}

func denied(code, msg string) *Error {
	return &Error{Code: code, Status: http.StatusForbidden, Message: msg}
}

func errFailure() *Error {
	return denied(CodeAuthorizationFailure, "This request is not authorized to perform this operation.")
}

func errPermission() *Error {
	return denied(CodeAuthorizationPermissionMismatch, "This request is not authorized to perform this operation using this permission.")
}

func errResourceType() *Error {
	return denied(CodeAuthorizationResourceTypeMismatch, "This request is not authorized to perform this operation using this resource type.")
}

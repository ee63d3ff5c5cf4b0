package frontend

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/frontend/batch"
	"github.com/tabuladb/tabula/frontend/entity"
	"github.com/tabuladb/tabula/frontend/odata"
	"github.com/tabuladb/tabula/frontend/sharedkey"
)

// svcError is an error as the service reports it: an HTTP status, one of
// its error codes, and its message.
type svcError struct {
	status int
	code   string
	msg    string
}

func (e *svcError) Error() string { return e.code + ": " + e.msg }

var (
	errTableNotFound    = &svcError{status: http.StatusNotFound, code: "TableNotFound", msg: "The table specified does not exist."}
	errResourceNotFound = &svcError{status: http.StatusNotFound, code: "ResourceNotFound", msg: "The specified resource does not exist."}
	errTableExists      = &svcError{status: http.StatusConflict, code: "TableAlreadyExists", msg: "The table specified already exists."}
	errEntityExists     = &svcError{status: http.StatusConflict, code: "EntityAlreadyExists", msg: "The specified entity already exists."}
	errCondition        = &svcError{status: http.StatusPreconditionFailed, code: "UpdateConditionNotSatisfied", msg: "The update condition specified in the request was not satisfied."}
)

// toSvc maps err to what the service would answer.
func toSvc(err error) *svcError {
	var (
		se  *svcError
		ee  *entity.Error
		be  *batch.Error
		sye *odata.SyntaxError
	)
	switch {
	case errors.As(err, &se):
		return se
	case errors.As(err, &ee):
		return &svcError{status: ee.Status, code: ee.Code, msg: ee.Message}
	case errors.As(err, &be):
		return &svcError{status: be.Status, code: be.Code, msg: be.Message}
	case errors.As(err, &sye):
		return &svcError{status: http.StatusBadRequest, code: "InvalidInput", msg: sye.Error()}
	case errors.Is(err, odata.ErrInvalidFilter), errors.Is(err, odata.ErrInvalidSelect), errors.Is(err, odata.ErrInvalidTop):
		return &svcError{status: http.StatusBadRequest, code: "InvalidInput", msg: err.Error()}
	case errors.Is(err, entity.ErrCorrupt), errors.Is(err, ErrSettingsCorrupt):
		return &svcError{status: http.StatusInternalServerError, code: "InternalError", msg: "A stored entity is corrupt: " + err.Error()}
	}
	d := api.DetailOf(err)
	switch d.GetCode() {
	case api.ErrorCode_ERROR_CODE_NOT_FOUND:
		return errResourceNotFound
	case api.ErrorCode_ERROR_CODE_ALREADY_EXISTS:
		return errTableExists
	case api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT:
		return &svcError{status: http.StatusBadRequest, code: "InvalidInput", msg: "One of the request inputs is not valid: " + err.Error()}
	case api.ErrorCode_ERROR_CODE_SERVER_BUSY, api.ErrorCode_ERROR_CODE_UNAVAILABLE:
		return &svcError{status: http.StatusServiceUnavailable, code: "ServerBusy", msg: "The server is currently unable to receive requests. Please retry your request."}
	case api.ErrorCode_ERROR_CODE_QUOTA_EXCEEDED:
		return &svcError{status: http.StatusForbidden, code: "AccountLimitExceeded", msg: "The account is over its quota: " + err.Error()}
	case api.ErrorCode_ERROR_CODE_PERMISSION_DENIED, api.ErrorCode_ERROR_CODE_UNAUTHENTICATED:
		return &svcError{status: http.StatusForbidden, code: "AuthorizationFailure", msg: "This request is not authorized to perform this operation."}
	case api.ErrorCode_ERROR_CODE_DATA_LOSS:
		return &svcError{status: http.StatusInternalServerError, code: "InternalError", msg: "Data of this table was lost: " + err.Error()}
	}
	return &svcError{status: http.StatusInternalServerError, code: "InternalError", msg: "The server encountered an internal error: " + err.Error()}
}

// fail answers the request with err: authentication and service-level
// errors as XML, the rest in OData JSON, as the service does.
func (q *request) fail(err error) {
	h := q.w.Header()
	var ae *sharedkey.Error
	if errors.As(err, &ae) {
		e := *ae
		e.Message += "\nRequestId:" + q.id + "\nTime:" + q.g.opts.Now().UTC().Format("2006-01-02T15:04:05.0000000Z")
		h.Set("Content-Type", "application/xml")
		h.Set("x-ms-error-code", ae.Code)
		q.w.WriteHeader(ae.Status)
		_, _ = q.w.Write(e.XML())
		return
	}
	se := toSvc(err)
	if se.status >= 500 {
		q.g.log.Error("request failed", "method", q.r.Method, "path", q.r.URL.Path, "status", se.status, "err", err)
	}
	if q.xmlErrors {
		e := sharedkey.Error{Code: se.code, Status: se.status,
			Message: se.msg + "\nRequestId:" + q.id + "\nTime:" + q.g.opts.Now().UTC().Format("2006-01-02T15:04:05.0000000Z")}
		h.Set("Content-Type", "application/xml")
		h.Set("x-ms-error-code", se.code)
		q.w.WriteHeader(se.status)
		_, _ = q.w.Write(e.XML())
		return
	}
	h.Set("Content-Type", "application/json;odata=minimalmetadata;streaming=true;charset=utf-8")
	h.Set("x-ms-error-code", se.code)
	q.w.WriteHeader(se.status)
	_, _ = q.w.Write(q.errorBody(se, ""))
}

// errorBody is se in the OData JSON error format; prefix (a batch
// operation's "index:") starts the message.
func (q *request) errorBody(se *svcError, prefix string) []byte {
	type message struct {
		Lang  string `json:"lang"`
		Value string `json:"value"`
	}
	type odataErr struct {
		Code    string  `json:"code"`
		Message message `json:"message"`
	}
	b, _ := json.Marshal(map[string]odataErr{"odata.error": {Code: se.code, Message: message{Lang: "en-US",
		Value: prefix + se.msg + "\nRequestId:" + q.id + "\nTime:" + q.g.opts.Now().UTC().Format("2006-01-02T15:04:05.0000000Z")}}})
	return b
}

// writeJSON answers status with a JSON body at the given metadata level.
func (q *request) writeJSON(status int, m entity.Metadata, body []byte) {
	h := q.w.Header()
	h.Set("Content-Type", m.ContentType())
	h.Set("Content-Length", strconv.Itoa(len(body)))
	q.w.WriteHeader(status)
	_, _ = q.w.Write(body)
}

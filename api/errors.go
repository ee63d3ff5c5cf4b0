package api

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// grpcCode is the gRPC status code each ErrorCode travels under.
func grpcCode(c ErrorCode) codes.Code {
	switch c {
	case ErrorCode_ERROR_CODE_NOT_OWNER, ErrorCode_ERROR_CODE_STALE_EPOCH, ErrorCode_ERROR_CODE_WRONG_KIND:
		return codes.FailedPrecondition
	case ErrorCode_ERROR_CODE_NOT_FOUND:
		return codes.NotFound
	case ErrorCode_ERROR_CODE_ALREADY_EXISTS:
		return codes.AlreadyExists
	case ErrorCode_ERROR_CODE_INVALID_ARGUMENT:
		return codes.InvalidArgument
	case ErrorCode_ERROR_CODE_SERVER_BUSY:
		return codes.ResourceExhausted
	case ErrorCode_ERROR_CODE_UNAVAILABLE:
		return codes.Unavailable
	case ErrorCode_ERROR_CODE_UNIMPLEMENTED:
		return codes.Unimplemented
	case ErrorCode_ERROR_CODE_VERSION_GONE:
		return codes.Aborted
	case ErrorCode_ERROR_CODE_DATA_LOSS:
		return codes.DataLoss
	case ErrorCode_ERROR_CODE_UNAUTHENTICATED:
		return codes.Unauthenticated
	case ErrorCode_ERROR_CODE_PERMISSION_DENIED:
		return codes.PermissionDenied
	case ErrorCode_ERROR_CODE_FAILED_PRECONDITION:
		return codes.FailedPrecondition
	case ErrorCode_ERROR_CODE_QUOTA_EXCEEDED:
		return codes.ResourceExhausted
	default:
		return codes.Internal
	}
}

// Status makes the gRPC status error for d; msg is the human-readable text.
func Status(d *ErrorDetail, msg string) error {
	st := status.New(grpcCode(d.Code), msg)
	if withDetail, err := st.WithDetails(d); err == nil {
		st = withDetail
	}
	return st.Err()
}

// Errorf makes a status error with code, machine-readable reason and a
// formatted message.
func Errorf(code ErrorCode, reason string, format string, args ...any) error {
	return Status(&ErrorDetail{Code: code, Reason: reason}, fmt.Sprintf(format, args...))
}

// InvalidArgument makes an INVALID_ARGUMENT error naming the field and, when
// the problem is a size, the limit.
func InvalidArgument(field, reason string, limit uint64, format string, args ...any) error {
	return Status(&ErrorDetail{
		Code:   ErrorCode_ERROR_CODE_INVALID_ARGUMENT,
		Reason: reason,
		Field:  field,
		Limit:  limit,
	}, fmt.Sprintf(format, args...))
}

// DetailOf returns the ErrorDetail carried by err (wrapped or not). An error
// that is not a Tabula status gets a detail derived from its gRPC code, so
// transport failures read as UNAVAILABLE; nil gives nil.
func DetailOf(err error) *ErrorDetail {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		var se interface{ GRPCStatus() *status.Status }
		if errors.As(err, &se) {
			st = se.GRPCStatus()
		} else {
			return &ErrorDetail{Code: ErrorCode_ERROR_CODE_UNSPECIFIED, Reason: "unknown"}
		}
	}
	for _, d := range st.Details() {
		if ed, ok := d.(*ErrorDetail); ok {
			return ed
		}
	}
	switch st.Code() {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted:
		return &ErrorDetail{Code: ErrorCode_ERROR_CODE_UNAVAILABLE, Reason: "transport"}
	case codes.ResourceExhausted:
		// Tabula's own SERVER_BUSY always carries a detail; a bare
		// ResourceExhausted is gRPC refusing a message over the size limit,
		// which no retry fixes.
		return &ErrorDetail{Code: ErrorCode_ERROR_CODE_INVALID_ARGUMENT, Reason: "message_too_large"}
	case codes.InvalidArgument:
		return &ErrorDetail{Code: ErrorCode_ERROR_CODE_INVALID_ARGUMENT, Reason: "transport"}
	case codes.NotFound:
		return &ErrorDetail{Code: ErrorCode_ERROR_CODE_NOT_FOUND, Reason: "transport"}
	case codes.Unimplemented:
		return &ErrorDetail{Code: ErrorCode_ERROR_CODE_UNIMPLEMENTED, Reason: "transport"}
	case codes.DataLoss:
		return &ErrorDetail{Code: ErrorCode_ERROR_CODE_DATA_LOSS, Reason: "transport"}
	case codes.Unauthenticated:
		return &ErrorDetail{Code: ErrorCode_ERROR_CODE_UNAUTHENTICATED, Reason: "transport"}
	case codes.PermissionDenied:
		return &ErrorDetail{Code: ErrorCode_ERROR_CODE_PERMISSION_DENIED, Reason: "transport"}
	}
	return &ErrorDetail{Code: ErrorCode_ERROR_CODE_UNSPECIFIED, Reason: "unknown"}
}

// CodeOf is DetailOf(err).GetCode().
func CodeOf(err error) ErrorCode { return DetailOf(err).GetCode() }

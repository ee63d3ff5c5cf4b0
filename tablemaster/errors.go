package tablemaster

import (
	"errors"

	"google.golang.org/grpc/status"

	"github.com/tabuladb/tabula/api"
)

// Sentinel errors. Every error Apply or an RPC returns for a refused command
// wraps exactly one of the first group (errors.Is works) and carries the api
// status the wire sends (status.FromError and api.DetailOf work).
var (
	ErrInvalidArgument = errors.New("tablemaster: invalid argument")
	ErrUnimplemented   = errors.New("tablemaster: not implemented")
	ErrTenantNotFound  = errors.New("tablemaster: tenant not found")
	ErrTableNotFound   = errors.New("tablemaster: table not found")
	ErrServerNotFound  = errors.New("tablemaster: server not found")
	ErrTenantExists    = errors.New("tablemaster: tenant already exists")
	ErrQuotaExceeded   = errors.New("tablemaster: over a tenant quota")
	ErrTableExists     = errors.New("tablemaster: table already exists")
	// ErrServerInUse: a registration names the id of a live server with
	// another process identity (see OpRegisterServer).
	ErrServerInUse = errors.New("tablemaster: server id in use by another process")

	// ErrCorrupt is returned by Open when the snapshot or the command log
	// fails its checksum or framing anywhere but in a torn final record.
	ErrCorrupt = errors.New("tablemaster: corrupt state file")
	// ErrUnsupportedVersion is returned by Open for a state file written by
	// a format version this build does not read.
	ErrUnsupportedVersion = errors.New("tablemaster: unsupported state file version")
	// ErrClosed is returned by calls on a closed Master.
	ErrClosed = errors.New("tablemaster: closed")
)

// Error is a refused command or request: a sentinel (Unwrap) plus the gRPC
// status with its api.ErrorDetail (GRPCStatus). Safe for concurrent reads.
type Error struct {
	// Kind is one of the sentinel errors above.
	Kind   error
	status *status.Status
}

func (e *Error) Error() string              { return e.status.Message() }
func (e *Error) Unwrap() error              { return e.Kind }
func (e *Error) GRPCStatus() *status.Status { return e.status }

// wrapStatus pairs an api status error with its sentinel.
func wrapStatus(kind, apiErr error) *Error {
	st, _ := status.FromError(apiErr)
	return &Error{Kind: kind, status: st}
}

func errInvalid(field, reason string, limit uint64, format string, args ...any) *Error {
	return wrapStatus(ErrInvalidArgument, api.InvalidArgument(field, reason, limit, format, args...))
}

func errValidateName(field, name string) error {
	if err := api.ValidateName(field, name); err != nil {
		return wrapStatus(ErrInvalidArgument, err)
	}
	return nil
}

func errCode(kind error, code api.ErrorCode, reason, format string, args ...any) *Error {
	return wrapStatus(kind, api.Errorf(code, reason, format, args...))
}

func errTenantNotFound(tenant string) *Error {
	return errCode(ErrTenantNotFound, api.ErrorCode_ERROR_CODE_NOT_FOUND, "tenant_not_found", "tenant %q does not exist", tenant)
}

func errTableNotFound(tenant, table string) *Error {
	return errCode(ErrTableNotFound, api.ErrorCode_ERROR_CODE_NOT_FOUND, "table_not_found", "table %s/%s does not exist", tenant, table)
}

func errServerNotFound(id string) *Error {
	return errCode(ErrServerNotFound, api.ErrorCode_ERROR_CODE_NOT_FOUND, "server_not_found", "server %q is not registered", id)
}

// rpcError turns any error into what an RPC returns: refusals keep their
// status; anything else (an I/O failure, a closed master) is UNAVAILABLE, so
// a client retries with backoff.
func rpcError(what string, err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	if errors.Is(err, ErrClosed) {
		return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "master_closed", "%s: master is closed", what)
	}
	return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "master_failed", "%s: %v", what, err)
}

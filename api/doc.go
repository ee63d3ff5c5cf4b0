// Package api holds Tabula's wire API: the protobuf messages and gRPC
// services of the Table Master and the table servers (generated from
// tabula.proto, checked in), plus the hand-written pieces every side shares:
// the error model (errors.go) and the request limits (limits.go).
//
// # Errors
//
// Every error a Tabula server returns is a gRPC status with exactly one
// ErrorDetail, whose ErrorCode a client acts on:
//
//	NOT_OWNER        FailedPrecondition  refresh the partition map, retry
//	STALE_EPOCH      FailedPrecondition  refresh the partition map, retry
//	NOT_FOUND        NotFound            tenant or table does not exist
//	ALREADY_EXISTS   AlreadyExists
//	INVALID_ARGUMENT InvalidArgument     field and limit say what is wrong
//	WRONG_KIND       FailedPrecondition  operation not for this table kind
//	SERVER_BUSY      ResourceExhausted   wait retry_after_ms, retry
//	UNAVAILABLE      Unavailable         retry with backoff
//	UNIMPLEMENTED    Unimplemented       not built yet
//	VERSION_GONE     Aborted             bulk table: the version named was
//	                                     unloaded; retry the whole request
//	                                     on the current version
//
// Use [Errorf] to make one and [DetailOf] to read it back.
//
// The generated types are not safe for concurrent mutation; the helpers are
// pure functions.
package api

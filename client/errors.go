package client

import (
	"errors"
	"fmt"

	"github.com/tabuladb/tabula/api"
)

var (
	// ErrKeyNotFound is returned by Table.Get when the key is absent (or has
	// expired).
	ErrKeyNotFound = errors.New("client: key not found")
	// ErrClosed is returned by every call made after (or cut short by)
	// Client.Close.
	ErrClosed = errors.New("client: closed")
	// ErrNoMasters is returned by New and Options.Validate when no master
	// address is given.
	ErrNoMasters = errors.New("client: no master addresses")
	// ErrAlreadyExists is matched (errors.Is) by the error of a catalog
	// call refused because what it would create exists: CreateTable,
	// CreateTenant. The error is the server's ALREADY_EXISTS (api.CodeOf
	// reads it too), so "create if absent" is
	// `if err != nil && !errors.Is(err, client.ErrAlreadyExists)`.
	ErrAlreadyExists = errors.New("client: already exists")
)

// alreadyExists is a server's ALREADY_EXISTS as the SDK returns it: it
// reads as the server's error and also matches ErrAlreadyExists.
type alreadyExists struct{ err error }

func (e *alreadyExists) Error() string        { return e.err.Error() }
func (e *alreadyExists) Unwrap() error        { return e.err }
func (e *alreadyExists) Is(target error) bool { return target == ErrAlreadyExists }

// withSentinel lets err (a server's answer) match the SDK's sentinel for
// its code, where there is one.
func withSentinel(err error) error {
	if api.CodeOf(err) == api.ErrorCode_ERROR_CODE_ALREADY_EXISTS {
		return &alreadyExists{err}
	}
	return err
}

// permanentError carries an error through the retry loop untouched: a
// failure of the caller's own callback, or a stream that already delivered
// records. The loop returns the inner error as is.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// errRegroup tells a batch call that its group of keys no longer falls in
// one partition of the current map (the table was re-cut), so the keys must
// be grouped again.
var errRegroup = errors.New("client: batch group spans partitions; regroup")

// unavailable is the error for a partition the client cannot reach at the
// moment (no primary in the map); it is retried like a server's UNAVAILABLE.
func unavailable(reason, format string, args ...any) error {
	return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, reason, format, args...)
}

// wrapCall says what was being done. When the call gave up because its
// context ended, both the context error and the last RPC error are wrapped:
// errors.Is(err, context.DeadlineExceeded) and api.CodeOf(err) both work.
func wrapCall(what string, ctxErr, last error) error {
	switch {
	case last == nil && ctxErr == nil:
		return nil
	case last == nil:
		return fmt.Errorf("%s: %w", what, ctxErr)
	case ctxErr == nil:
		return fmt.Errorf("%s: %w", what, last)
	default:
		return fmt.Errorf("%s: gave up (%w); last error: %w", what, ctxErr, last)
	}
}

// ErrOutcomeUnknown is matched (errors.Is) by the error of a write the SDK
// gave up on after a failure that leaves its outcome unknown: the request
// may have been applied (a deadline or a broken connection after it was
// sent, or a server answering UNAVAILABLE outcome_unknown because its
// primary changed under the write). The error is an *OutcomeUnknownError
// naming the request id: sending the same write again with
// WithRequestID(id) within 10 minutes returns its outcome, applying it at
// most once. Errors of writes that certainly did not apply do not match.
var ErrOutcomeUnknown = errors.New("client: outcome of the write is unknown")

// OutcomeUnknownError is the error of a write whose outcome is unknown; it
// matches ErrOutcomeUnknown and wraps the error the SDK gave up on (a
// context error, ErrClosed, the server's last answer).
type OutcomeUnknownError struct {
	// RequestID is the write's request id: retry with WithRequestID
	// (Invocation.IdempotencyToken for Invoke) to learn the outcome.
	RequestID string
	// Err is the error the SDK gave up on.
	Err error
	// invoke: a coprocessor call, retried with its idempotency token.
	invoke bool
}

func (e *OutcomeUnknownError) Error() string {
	how := fmt.Sprintf("client.WithRequestID(%q)", e.RequestID)
	if e.invoke {
		how = fmt.Sprintf("Invocation.IdempotencyToken %q", e.RequestID)
	}
	return fmt.Sprintf("outcome unknown: the write may or may not have been applied; send it again with %s within 10 minutes to apply it at most once and learn its outcome: %v", how, e.Err)
}

// Unwrap returns the error the SDK gave up on.
func (e *OutcomeUnknownError) Unwrap() error { return e.Err }

// Is matches ErrOutcomeUnknown.
func (e *OutcomeUnknownError) Is(target error) bool { return target == ErrOutcomeUnknown }

// ConditionFailedError is BatchWrite's error when a mutation's condition
// (Mutation.Cond) did not hold: none of that partition's mutations were
// applied. Find it with errors.As; Err is the server's refusal
// (api.CodeOf(err) is FAILED_PRECONDITION, reason condition_failed), its
// message saying what the key's state was.
type ConditionFailedError struct {
	// Index is the failed mutation's index in the muts given to BatchWrite.
	Index int
	// Err is the server's error.
	Err error
}

func (e *ConditionFailedError) Error() string {
	return fmt.Sprintf("mutation %d: condition failed: %v", e.Index, e.Err)
}

// Unwrap returns the server's error.
func (e *ConditionFailedError) Unwrap() error { return e.Err }

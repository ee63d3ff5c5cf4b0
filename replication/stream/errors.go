package stream

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tabuladb/tabula/engines"
)

// Errors of the stream layer. Corruption is engines.ErrCorrupt (wrapped):
// a block that fails its CRC is never served.
var (
	// ErrSealed: the extent is sealed and takes no more appends. A writer
	// that gets it asks the stream manager for the stream's new last extent;
	// a writer that was cut off from the manager is fenced by it.
	ErrSealed = errors.New("stream: extent sealed")
	// ErrFrozen: the extent is being sealed (a manager froze it); it takes
	// no more appends.
	ErrFrozen = errors.New("stream: extent frozen for sealing")
	// ErrBroken: a write, fsync or replication of the extent failed, so the
	// replica's state past its commit length is unknown; it takes no more
	// appends and must be sealed.
	ErrBroken = errors.New("stream: extent broken by a failed write")
	// ErrNoExtent: the node has no replica of the extent.
	ErrNoExtent = errors.New("stream: no such extent")
	// ErrExists: the extent already exists with other content or role.
	ErrExists = errors.New("stream: extent exists")
	// ErrBadRange: a read or seal not at block boundaries, or past the
	// readable end.
	ErrBadRange = errors.New("stream: range not at block boundaries or past the end")
	// ErrShort: the replica holds less than the length asked for (a seal at
	// a longer length, or a replicate past its end).
	ErrShort = errors.New("stream: replica shorter than asked")
	// ErrOffset: a replicate at an offset other than the replica's length.
	ErrOffset = errors.New("stream: replicate offset does not match")
	// ErrRole: an append to a secondary or a replicate to a primary.
	ErrRole = errors.New("stream: wrong replica role")
	// ErrSealConflict: the extent is already sealed at another length.
	ErrSealConflict = errors.New("stream: extent sealed at another length")
	// ErrTooLarge: a block or an append over the limits.
	ErrTooLarge = errors.New("stream: block or append too large")
	// ErrClosed: the store, node or client was closed.
	ErrClosed = errors.New("stream: closed")

	// ErrStreamNotFound: the stream manager has no such stream.
	ErrStreamNotFound = errors.New("stream: stream not found")
	// ErrStreamExists: CreateStream or Concat of a name in use.
	ErrStreamExists = errors.New("stream: stream exists")
	// ErrNotSealed: an operation that needs sealed extents (Concat,
	// allocating after an open extent) met an unsealed one.
	ErrNotSealed = errors.New("stream: extent not sealed")
	// ErrFenced: a writer epoch older than the stream's: another writer
	// opened the stream since.
	ErrFenced = errors.New("stream: writer fenced by a newer one")
	// ErrNoPlacement: too few live extent nodes in distinct fault domains.
	ErrNoPlacement = errors.New("stream: not enough extent nodes in distinct fault domains")
	// ErrUnknownNode: a command names a node the manager does not know.
	ErrUnknownNode = errors.New("stream: unknown extent node")
	// ErrUnknownExtent: a command names an extent the manager does not know.
	ErrUnknownExtent = errors.New("stream: unknown extent")
	// ErrBadCommand: a malformed manager command or snapshot.
	ErrBadCommand = errors.New("stream: bad command")
	// ErrUnavailable: no replica could serve the request.
	ErrUnavailable = errors.New("stream: no replica available")
	// ErrPlacementChanged: a coding result names fragment nodes the
	// manager no longer places the fragments on (one died meanwhile); the
	// coding task runs again with the new placement.
	ErrPlacementChanged = errors.New("stream: fragment placement changed")
)

// wireErrors maps sentinels to gRPC codes. Their texts travel in the status
// message, which is how fromStatus finds them again.
var wireErrors = []struct {
	err  error
	code codes.Code
}{
	{engines.ErrCorrupt, codes.DataLoss},
	{ErrSealed, codes.FailedPrecondition},
	{ErrFrozen, codes.FailedPrecondition},
	{ErrBroken, codes.FailedPrecondition},
	{ErrNoExtent, codes.NotFound},
	{ErrExists, codes.AlreadyExists},
	{ErrBadRange, codes.OutOfRange},
	{ErrShort, codes.FailedPrecondition},
	{ErrOffset, codes.FailedPrecondition},
	{ErrRole, codes.FailedPrecondition},
	{ErrSealConflict, codes.FailedPrecondition},
	{ErrTooLarge, codes.InvalidArgument},
	{ErrClosed, codes.Unavailable},
	{ErrUnavailable, codes.Unavailable},
	{ErrFormatVersion, codes.Internal},
	{ErrNotSealed, codes.FailedPrecondition},
}

// toStatus converts a node error to a gRPC status error carrying its
// sentinel's code.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok && !isSentinel(err) {
		return err
	}
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	for _, w := range wireErrors {
		if errors.Is(err, w.err) {
			return status.Error(w.code, err.Error())
		}
	}
	return status.Error(codes.Internal, err.Error())
}

func isSentinel(err error) bool {
	for _, w := range wireErrors {
		if errors.Is(err, w.err) {
			return true
		}
	}
	return false
}

// fromStatus turns an RPC error back into one that wraps the sentinel named
// in its message, if any.
func fromStatus(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	for _, w := range wireErrors {
		if st.Code() == w.code && strings.Contains(st.Message(), w.err.Error()) {
			return fmt.Errorf("%s: %w", st.Message(), w.err)
		}
	}
	switch st.Code() {
	case codes.Canceled:
		return fmt.Errorf("%s: %w", st.Message(), context.Canceled)
	case codes.DeadlineExceeded:
		return fmt.Errorf("%s: %w", st.Message(), context.DeadlineExceeded)
	}
	return err
}

// FromStatus turns an error of an ExtentNode RPC (or of a Node method
// called in-process, which returns the same status errors) back into one
// that wraps this package's sentinel, so errors.Is works on it.
func FromStatus(err error) error { return fromStatus(err) }

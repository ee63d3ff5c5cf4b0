package streamerr

import (
	"errors"
	"fmt"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/replication/stream"
)

// table lists every mapped sentinel; reasons travel on the wire: never
// change or reuse one.
var table = []struct {
	err    error
	code   api.ErrorCode
	reason string
}{
	{stream.ErrStreamNotFound, api.ErrorCode_ERROR_CODE_NOT_FOUND, "stream_not_found"},
	{stream.ErrUnknownExtent, api.ErrorCode_ERROR_CODE_NOT_FOUND, "extent_not_found"},
	{stream.ErrUnknownNode, api.ErrorCode_ERROR_CODE_NOT_FOUND, "extent_node_not_found"},
	{stream.ErrStreamExists, api.ErrorCode_ERROR_CODE_ALREADY_EXISTS, "stream_exists"},
	{stream.ErrFenced, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "writer_fenced"},
	{stream.ErrNotSealed, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "extent_not_sealed"},
	{stream.ErrBadCommand, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "bad_stream_command"},
	{stream.ErrNoPlacement, api.ErrorCode_ERROR_CODE_UNAVAILABLE, "no_extent_placement"},
	{stream.ErrUnavailable, api.ErrorCode_ERROR_CODE_UNAVAILABLE, "no_replica_available"},
	{engines.ErrCorrupt, api.ErrorCode_ERROR_CODE_UNAVAILABLE, "corrupt"},
}

// ToStatus converts a stream manager error to an API status error; other
// errors are UNAVAILABLE (retry).
func ToStatus(what string, err error) error {
	if err == nil {
		return nil
	}
	for _, t := range table {
		if errors.Is(err, t.err) {
			return api.Errorf(t.code, t.reason, "%s: %v", what, err)
		}
	}
	return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "stream_failed", "%s: %v", what, err)
}

// FromStatus turns a status from ToStatus back into an error wrapping its
// sentinel (and the status, for api.DetailOf).
func FromStatus(err error) error {
	if err == nil {
		return nil
	}
	reason := api.DetailOf(err).GetReason()
	for _, t := range table {
		if reason == t.reason {
			return fmt.Errorf("%w (%w)", err, t.err)
		}
	}
	return err
}

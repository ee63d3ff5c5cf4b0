package tablemaster

import (
	"github.com/tabuladb/tabula/internal/streamerr"
)

// The streams sub-machine: OpStream, the stream manager's commands.

func (s *State) applyStream(cmd *StreamCommand) (Result, error) {
	if cmd.StreamCmd == nil {
		return Result{}, errInvalid("stream_cmd", "stream_cmd_missing", 0, "stream command is missing")
	}
	res, err := s.streams().Apply(*cmd.StreamCmd)
	if err != nil {
		return Result{}, wrapStatus(ErrInvalidArgument, streamerr.ToStatus("stream "+string(cmd.StreamCmd.Op), err))
	}
	return Result{Changed: res.Changed, Stream: res}, nil
}

package tablemaster

import (
	"fmt"
	"slices"

	"github.com/tabuladb/tabula/api"
)

// The bulk sub-machine: OpBulkPublish, OpBulkStored, OpBulkLoaded,
// OpBulkRollback (versions, bulk.go) and OpBulkRollout, OpBulkAdvance
// (rollouts, rollout.go).

// bulkTable finds a bulk table for a bulk command.
func (s *State) bulkTable(tenant, table string, chk bool) (*Table, error) {
	if err := checkName(chk, "tenant", tenant); err != nil {
		return nil, err
	}
	if err := checkName(chk, "table", table); err != nil {
		return nil, err
	}
	t, err := s.Table(tenant, table)
	if err != nil {
		return nil, err
	}
	if t.Kind != api.TableKind_TABLE_KIND_BULK || t.Bulk == nil {
		return nil, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_WRONG_KIND, "not_bulk",
			"table %s/%s is a %s table; versions are published to bulk tables", t.Tenant, t.Name, api.KindName(t.Kind))
	}
	// Bulk commands modify the table (a no-op's copy is dropped).
	return s.mutTable(t), nil
}

func (s *State) bulkPublish(cmd *BulkPublish, unixMs int64, chk bool) (Result, error) {
	t, err := s.bulkTable(cmd.Tenant, cmd.Table, chk)
	if err != nil {
		return Result{}, err
	}
	b := t.Bulk
	if chk && cmd.Version == 0 {
		return Result{}, errInvalid("version", "version_zero", 0, "version must be 1 or more (build with --version N, or with --table to take the next one)")
	}
	if len(cmd.Files) != len(t.Partitions) {
		return Result{}, errInvalid("files", "partition_count", uint64(len(t.Partitions)),
			"%d files for a table of %d partitions (build with --table %s, or --partitions %d)", len(cmd.Files), len(t.Partitions), t.Name, len(t.Partitions))
	}
	for i, f := range cmd.Files {
		if chk && (f.Size == 0 || f.Size > MaxBulkFileBytes) {
			return Result{}, errInvalid(fmt.Sprintf("files[%d].size", i), "file_size", MaxBulkFileBytes, "partition %d's file size %d is not in 1..%d", i, f.Size, uint64(MaxBulkFileBytes))
		}
	}
	if k := b.version(cmd.Version); k >= 0 {
		// The same version again: a resumed or repeated publish, fine if
		// it is the same content (the uploads go where it is not loaded).
		v := &b.Versions[k]
		if v.Base != cmd.BaseVersion || !sameContent(v.Files, cmd.Files) {
			return Result{}, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_ALREADY_EXISTS, "version_exists",
				"version %d of %s/%s was published with other files; build the new content as version %d or later", cmd.Version, t.Tenant, t.Name, b.LastVersion+1)
		}
		return Result{Table: t}, nil
	}
	if cmd.Version <= b.LastVersion {
		return Result{}, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_ALREADY_EXISTS, "version_taken",
			"version %d of %s/%s is not newer than version %d, published before; build as version %d or later", cmd.Version, t.Tenant, t.Name, b.LastVersion, b.LastVersion+1)
	}
	if cmd.BaseVersion != 0 {
		k := b.version(cmd.BaseVersion)
		if k < 0 || b.Versions[k].State == BulkLoading {
			return Result{}, errInvalid("base_version", "base_not_retained", 0,
				"delta base version %d of %s/%s is not a loaded, retained version (retained: %v)", cmd.BaseVersion, t.Tenant, t.Name, t.readyVersions())
		}
	}
	if ro := b.Rollout; ro != nil {
		// A rollout under way: a newer publish replaces it only while no
		// copy serves its version yet.
		if v := t.servedLoading(); chk && v != 0 {
			return Result{}, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_FAILED_PRECONDITION, "rollout_in_progress",
				"version %d of %s/%s is rolling out (%d of %d rows switched): wait for it to finish, or abort it (tabula bulk rollout abort %s), before publishing version %d",
				v, t.Tenant, t.Name, ro.RowsDone, ro.Rows, t.Name, cmd.Version)
		}
	}
	// Validation is over: mutate. A version still loading is abandoned by
	// a newer publish: its uploads are deleted.
	if ro := b.Rollout; ro != nil {
		s.cancelRow(t, ro.Version)
		b.Rollout = nil
	}
	b.Versions = slices.DeleteFunc(b.Versions, func(v BulkVersion) bool {
		if v.State == BulkLoading {
			s.dropBulkStreams(t, v.Version)
			return true
		}
		return false
	})
	files := slices.Clone(cmd.Files)
	for i := range files {
		files[i].Stream = "" // recorded by OpBulkStored only
	}
	b.Versions = append(b.Versions, BulkVersion{
		Version: cmd.Version, Base: cmd.BaseVersion, State: BulkLoading, CreatedUnixMs: unixMs,
		Files: files, LoadedBy: make([][]string, len(t.Partitions)), Streams: s.streamsPlaceable(),
	})
	b.LastVersion = cmd.Version
	if b.Versions[len(b.Versions)-1].Streams {
		// Row by row (rollout.go): its files reach the copies from
		// their streams.
		s.startRollout(t, cmd.Version, unixMs)
		s.bulkAdvance(t, unixMs)
	} else {
		// Uploaded to every copy: they all hold every version.
		t.leaveRows()
	}
	t.pruneLoaded()
	return Result{Changed: true, Table: t}, nil
}

func (s *State) bulkLoadedCmd(cmd *BulkLoaded, unixMs int64, chk bool) (Result, error) {
	t, err := s.bulkTable(cmd.Tenant, cmd.Table, chk)
	if err != nil {
		return Result{}, err
	}
	b := t.Bulk
	k := b.version(cmd.Version)
	if k < 0 {
		// Unloaded or abandoned meanwhile: the server will drop it.
		return Result{}, nil
	}
	pi := slices.IndexFunc(t.Partitions, func(p Partition) bool { return p.ID == cmd.PartitionID })
	if pi < 0 {
		return Result{}, errInvalid("partition_id", "partition_not_in_table", 0, "partition %d is not in %s/%s", cmd.PartitionID, t.Tenant, t.Name)
	}
	if cmd.File == nil {
		return Result{}, errInvalid("file", "file_missing", 0, "the loaded file's size and crc are missing")
	}
	v := &b.Versions[k]
	if cmd.Error != "" {
		// A server refused the file it fetched: a loading version
		// cannot switch, and its publisher is told.
		hosted := slices.ContainsFunc(t.Partitions[pi].Replicas, func(r Replica) bool { return r.ServerID == cmd.ServerID })
		if !hosted || v.State != BulkLoading || v.Error != "" {
			return Result{}, nil
		}
		v.Error = fmt.Sprintf("partition %d: server %s refused the file: %s", pi, cmd.ServerID, cmd.Error)
		return Result{Changed: true, Table: t}, nil
	}
	if f := v.Files[pi]; f.Size != cmd.File.Size || f.CRC != cmd.File.CRC {
		return Result{}, errInvalid("file", "file_mismatch", 0, "server %s loaded a file of %d bytes, crc %08x, for partition %d of version %d; the version's file is %d bytes, crc %08x",
			cmd.ServerID, cmd.File.Size, cmd.File.CRC, pi, cmd.Version, f.Size, f.CRC)
	}
	c := slices.IndexFunc(t.Partitions[pi].Replicas, func(r Replica) bool { return r.ServerID == cmd.ServerID })
	if c < 0 || t.Bulk.Rows && !slices.Contains(t.copyHolds(pi, &t.Partitions[pi].Replicas[c]), cmd.Version) {
		return Result{}, nil // not a copy, or a copy that no longer holds it (a report from before it unloaded)
	}
	if !v.addLoaded(pi, len(t.Partitions), cmd.ServerID) {
		return Result{}, nil
	}
	res := Result{Changed: true, Table: t}
	s.bulkMaybeSwitch(t, v, unixMs)
	return res, nil
}

// bulkStoredCmd records that partition cmd.PartitionID (its index) of
// cmd.Version is stored in stream cmd.Stream, which must be the version's
// stream for it, exist, and be sealed to the end.
func (s *State) bulkStoredCmd(cmd *BulkStored, unixMs int64, chk bool) (Result, error) {
	t, err := s.bulkTable(cmd.Tenant, cmd.Table, chk)
	if err != nil {
		return Result{}, err
	}
	k := t.Bulk.version(cmd.Version)
	if k < 0 {
		return Result{}, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_NOT_FOUND, "version_not_retained",
			"version %d of %s/%s is not being published or retained (a newer publish abandoned it?)", cmd.Version, t.Tenant, t.Name)
	}
	if !t.Bulk.Versions[k].Streams {
		return Result{}, errInvalid("stream", "version_without_streams", 0,
			"version %d of %s/%s was published without streams (too few servers then); its files are uploaded to the servers only", cmd.Version, t.Tenant, t.Name)
	}
	if cmd.PartitionID >= uint64(len(t.Partitions)) {
		return Result{}, errInvalid("partition", "partition_out_of_range", uint64(len(t.Partitions)), "partition %d is out of range; %s/%s has %d", cmd.PartitionID, t.Tenant, t.Name, len(t.Partitions))
	}
	pi := int(cmd.PartitionID)
	want := BulkStreamName(t.ID, cmd.Version, pi)
	if cmd.Stream != want {
		return Result{}, errInvalid("stream", "stream_name", 0, "partition %d of version %d is stored in stream %q, not %q", pi, cmd.Version, want, cmd.Stream)
	}
	if chk {
		if err := s.checkBulkStream(cmd.Stream); err != nil {
			return Result{}, err
		}
	}
	v := &t.Bulk.Versions[k]
	if v.Files[pi].Stream == cmd.Stream {
		return Result{Table: t}, nil
	}
	v.Files[pi].Stream = cmd.Stream
	s.bulkMaybeSwitch(t, v, unixMs)
	return Result{Changed: true, Table: t}, nil
}

func (s *State) bulkRollback(cmd *BulkRollback, unixMs int64, chk bool) (Result, error) {
	t, err := s.bulkTable(cmd.Tenant, cmd.Table, chk)
	if err != nil {
		return Result{}, err
	}
	b := t.Bulk
	k := b.version(cmd.Version)
	if k < 0 {
		return Result{}, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_NOT_FOUND, "version_not_retained",
			"version %d of %s/%s is not retained (retained: %v)", cmd.Version, t.Tenant, t.Name, t.readyVersions())
	}
	if cmd.Version == b.Current && b.Rollout == nil {
		return Result{Table: t}, nil
	}
	v := &b.Versions[k]
	if b.Rows {
		// Rolled out again, row by row, from its streams.
		if ro := b.Rollout; ro != nil {
			if ro.Version == cmd.Version {
				return Result{Table: t}, nil
			}
			if chk {
				return Result{}, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_FAILED_PRECONDITION, "rollout_in_progress",
					"version %d of %s/%s is rolling out (%d of %d rows switched): wait for it to finish, or abort it (tabula bulk rollout abort %s), before rolling back to version %d",
					ro.Version, t.Tenant, t.Name, ro.RowsDone, ro.Rows, t.Name, cmd.Version)
			}
		}
		if chk && (v.State == BulkLoading || !v.bulkStored()) {
			return Result{}, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_UNAVAILABLE, "version_not_stored",
				"version %d of %s/%s is still being published; wait for its publish to finish", cmd.Version, t.Tenant, t.Name)
		}
		s.startRollout(t, cmd.Version, unixMs)
		s.bulkAdvance(t, unixMs)
		t.pruneLoaded()
		return Result{Changed: true, Table: t}, nil
	}
	if n := t.BulkLoadedCount(v); chk && n < len(t.Partitions) {
		return Result{}, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_UNAVAILABLE, "version_not_loaded",
			"version %d of %s/%s is loaded on %d of %d partitions (a partition moved and its server is fetching it, or it is still loading); try again shortly", cmd.Version, t.Tenant, t.Name, n, len(t.Partitions))
	}
	if chk && !v.bulkStored() {
		return Result{}, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_UNAVAILABLE, "version_not_stored",
			"version %d of %s/%s is still being stored in streams; wait for its publish to finish", cmd.Version, t.Tenant, t.Name)
	}
	s.bulkSwitch(t, cmd.Version, unixMs)
	return Result{Changed: true, Table: t}, nil
}

// bulkRolloutCmd applies OpBulkRollout.
func (s *State) bulkRolloutCmd(cmd *BulkRolloutAction, unixMs int64, chk bool) (Result, error) {
	t, err := s.bulkTable(cmd.Tenant, cmd.Table, chk)
	if err != nil {
		return Result{}, err
	}
	ro := t.Bulk.Rollout
	if ro == nil {
		return Result{}, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_FAILED_PRECONDITION, "no_rollout",
			"no rollout is under way on %s/%s (serving version %d)", t.Tenant, t.Name, t.Bulk.Current)
	}
	switch cmd.Action {
	case RolloutPause:
		if ro.Paused {
			return Result{Table: t}, nil
		}
		ro.Paused = true
	case RolloutResume:
		if !ro.Paused {
			return Result{Table: t}, nil
		}
		ro.Paused = false
	case RolloutAbort:
		if ro.Aborting {
			ro.Paused = false // an abort goes on
			break
		}
		if ro.From == 0 {
			return Result{}, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_FAILED_PRECONDITION, "nothing_to_go_back_to",
				"version %d is the first version of %s/%s: there is no older one to go back to (publish another version to replace it)", ro.Version, t.Tenant, t.Name)
		}
		abandon := ro.Version
		s.cancelRow(t, abandon)
		ro.Version, ro.From = ro.From, abandon
		ro.Aborting, ro.Abandon, ro.Paused, ro.Waiting = true, abandon, false, ""
		ro.RowStartedUnixMs = unixMs
	default:
		return Result{}, errInvalid("action", "rollout_action", 0, "rollout action %q: want pause, resume or abort", cmd.Action)
	}
	s.bulkAdvance(t, unixMs)
	t.pruneLoaded()
	return Result{Changed: true, Table: t}, nil
}

// bulkAdvanceCmd applies OpBulkAdvance.
func (s *State) bulkAdvanceCmd(cmd *BulkAdvance, unixMs int64, chk bool) (Result, error) {
	t, err := s.bulkTable(cmd.Tenant, cmd.Table, chk)
	if err != nil {
		return Result{}, err
	}
	if !s.bulkAdvance(t, unixMs) {
		return Result{}, nil
	}
	t.pruneLoaded()
	return Result{Changed: true, Table: t}, nil
}

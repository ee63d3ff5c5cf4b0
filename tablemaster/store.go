package tablemaster

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/tabuladb/tabula/internal/atomicfile"
)

// File names in Options.DataDir.
const (
	logFileName  = "master.log"
	snapFileName = "master.snap"
)

// logEntry is the payload of one command-log record.
//
// Payloads are JSON: a catalog command is a few hundred bytes and there are
// a handful per second at most, so encoding speed is irrelevant, while JSON
// lets an operator read the log with jq, and tolerates the additive schema
// changes the catalog will go through (new optional fields decode as zero
// in old entries). Integrity comes from the CRC32C framing, not the encoding.
type logEntry struct {
	// Seq numbers commands from 1 without gaps across snapshots, so a log
	// that outlived the snapshot that covers it is replayed only past it.
	Seq uint64  `json:"seq"`
	Cmd Command `json:"cmd"`
}

// snapshotBody is the payload of the snapshot file's one record.
type snapshotBody struct {
	// Seq is the last command the state includes.
	Seq   uint64 `json:"seq"`
	State *State `json:"state"`
}

// store is the master's durable state: a snapshot plus the command log of
// everything after it. Not safe for concurrent use; the Master calls it
// under its propose lock.
type store struct {
	dir     string
	logger  *slog.Logger
	log     *os.File // opened O_APPEND
	records int      // records in the log file
}

// openStore loads dir (creating it): the snapshot, then the log replayed on
// top. A torn final log record is dropped (and cut off the file) with a log
// line. It returns the state and the seq of the last command in it.
func openStore(dir string, logger *slog.Logger) (*store, *State, uint64, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, 0, fmt.Errorf("tablemaster: create data dir: %w", err)
	}
	for _, name := range []string{logFileName, snapFileName} {
		if err := atomicfile.RemoveTemps(filepath.Join(dir, name)); err != nil {
			return nil, nil, 0, fmt.Errorf("tablemaster: remove leftover temp file: %w", err)
		}
	}
	st, seq, err := loadSnapshot(filepath.Join(dir, snapFileName))
	if err != nil {
		return nil, nil, 0, err
	}
	s := &store{dir: dir, logger: logger}
	logPath := filepath.Join(dir, logFileName)
	data, err := os.ReadFile(logPath)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := writeFileAtomic(dir, logFileName, encodeFileHeader(logMagic)); err != nil {
			return nil, nil, 0, fmt.Errorf("tablemaster: create log: %w", err)
		}
	case err != nil:
		return nil, nil, 0, fmt.Errorf("tablemaster: read log: %w", err)
	default:
		var n, valid int
		n, valid, seq, err = replayLog(data, st, seq, logger)
		if err != nil {
			return nil, nil, 0, fmt.Errorf("tablemaster: replay %s: %w", logPath, err)
		}
		s.records = n
		if valid < len(data) {
			if err := cutFile(logPath, int64(valid)); err != nil {
				return nil, nil, 0, fmt.Errorf("tablemaster: cut torn log tail: %w", err)
			}
		}
	}
	s.log, err = os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("tablemaster: open log: %w", err)
	}
	return s, st, seq, nil
}

// replayLog applies the log file data to st, skipping commands the snapshot
// (at seq) holds. It returns the number of records, the length of the intact
// prefix of data and the last seq applied.
func replayLog(data []byte, st *State, seq uint64, logger *slog.Logger) (records, valid int, last uint64, err error) {
	body, err := checkFileHeader(data, logMagic)
	if err != nil {
		return 0, 0, 0, err
	}
	payloads, n, torn, err := decodeRecords(body)
	if err != nil {
		return 0, 0, 0, err
	}
	if torn {
		logger.Warn("tablemaster: dropped torn final record of the command log (crash during append; it was never acknowledged)",
			"offset", fileHeaderLen+n, "bytes", len(body)-n)
	}
	snapSeq := seq
	for i, p := range payloads {
		var e logEntry
		if err := json.Unmarshal(p, &e); err != nil {
			return 0, 0, 0, fmt.Errorf("%w: record %d: %v", ErrCorrupt, i, err)
		}
		if e.Seq <= snapSeq && seq == snapSeq {
			// Covered by the snapshot: the crash came between writing it
			// and resetting the log.
			continue
		}
		if e.Seq != seq+1 {
			return 0, 0, 0, fmt.Errorf("%w: record %d has seq %d, want %d", ErrCorrupt, i, e.Seq, seq+1)
		}
		// As logged: validated when it was proposed, never again.
		if _, err := st.ApplyLogged(e.Cmd); err != nil {
			return 0, 0, 0, fmt.Errorf("%w: command seq %d (%s) does not apply: %v", ErrCorrupt, e.Seq, e.Cmd.Op, err)
		}
		seq = e.Seq
	}
	return len(payloads), fileHeaderLen + n, seq, nil
}

// loadSnapshot reads the snapshot at path; a missing one is the empty state.
func loadSnapshot(path string) (*State, uint64, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return NewState(), 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("tablemaster: read snapshot: %w", err)
	}
	st, seq, err := decodeSnapshot(data)
	if err != nil {
		return nil, 0, fmt.Errorf("tablemaster: snapshot %s: %w", path, err)
	}
	return st, seq, nil
}

// decodeSnapshot decodes a snapshot file. Snapshots are replaced
// atomically, so any damage, a torn record included, is ErrCorrupt.
func decodeSnapshot(data []byte) (*State, uint64, error) {
	body, err := checkFileHeader(data, snapMagic)
	if err != nil {
		return nil, 0, err
	}
	payloads, _, torn, err := decodeRecords(body)
	if err != nil {
		return nil, 0, err
	}
	if torn || len(payloads) != 1 {
		return nil, 0, fmt.Errorf("%w: snapshot holds %d intact records (torn %v), want 1", ErrCorrupt, len(payloads), torn)
	}
	var b snapshotBody
	if err := json.Unmarshal(payloads[0], &b); err != nil {
		return nil, 0, fmt.Errorf("%w: snapshot payload: %v", ErrCorrupt, err)
	}
	if b.State == nil || b.State.Tenants == nil || b.State.Tables == nil || b.State.Servers == nil {
		return nil, 0, fmt.Errorf("%w: snapshot payload lacks state", ErrCorrupt)
	}
	return b.State, b.Seq, nil
}

// append makes e durable: when it returns nil the record is fsynced.
func (s *store) append(e logEntry) error {
	payload, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("tablemaster: encode command: %w", err)
	}
	if _, err := s.log.Write(appendRecord(nil, payload)); err != nil {
		return fmt.Errorf("tablemaster: append command seq %d: %w", e.Seq, err)
	}
	if err := s.log.Sync(); err != nil {
		return fmt.Errorf("tablemaster: sync command seq %d: %w", e.Seq, err)
	}
	s.records++
	return nil
}

// errLogUncertain marks a snapshot failure after which the command log can
// no longer be trusted to receive appends.
var errLogUncertain = errors.New("command log state uncertain")

// snapshot durably writes st (holding every command up to seq) as the
// snapshot, then resets the log to an empty one. A crash between the two
// leaves log records the snapshot covers; replay skips them by seq.
func (s *store) snapshot(st *State, seq uint64) error {
	payload, err := json.Marshal(snapshotBody{Seq: seq, State: st})
	if err != nil {
		return fmt.Errorf("tablemaster: encode snapshot: %w", err)
	}
	if err := writeFileAtomic(s.dir, snapFileName, appendRecord(encodeFileHeader(snapMagic), payload)); err != nil {
		return fmt.Errorf("tablemaster: write snapshot: %w", err)
	}
	// From here a failure may leave the file at logFileName replaced while
	// s.log still points at the old, unlinked one: commands appended there
	// would vanish on restart. Such failures are errLogUncertain, which stops
	// the master from taking commands.
	if err := writeFileAtomic(s.dir, logFileName, encodeFileHeader(logMagic)); err != nil {
		return fmt.Errorf("tablemaster: reset log: %w: %w", errLogUncertain, err)
	}
	f, err := os.OpenFile(filepath.Join(s.dir, logFileName), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("tablemaster: reopen log: %w: %w", errLogUncertain, err)
	}
	old := s.log
	s.log, s.records = f, 0
	if err := old.Close(); err != nil {
		s.logger.Warn("tablemaster: close old log", "err", err)
	}
	return nil
}

func (s *store) close() error {
	if s.log == nil {
		return nil
	}
	err := s.log.Close()
	s.log = nil
	return err
}

// writeFileAtomic durably replaces dir/name with data (atomicfile.WriteFile).
func writeFileAtomic(dir, name string, data []byte) error {
	return atomicfile.WriteFile(filepath.Join(dir, name), data, 0o644)
}

// cutFile truncates path to size and fsyncs it.
func cutFile(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if err == nil {
		err = f.Sync()
	}
	return errors.Join(err, f.Close())
}

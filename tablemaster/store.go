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
// under its propose lock (writeSnapshot, a function, runs outside it).
//
// A snapshot is cut in three steps, so only the first and last hold the
// propose lock and neither does more than a small write:
//
//  1. cut (locked): note the log's length and records at seq N, whose
//     State is published, hence immutable.
//  2. writeSnapshot (unlocked): encode that State and replace the snapshot
//     file with it (write temp, fsync, rename, fsync dir). Commands go on
//     being appended to the log meanwhile.
//  3. trim (locked): replace the log with its records past the cut (write
//     temp, fsync, rename, fsync dir) and append to the new file.
//
// A crash anywhere leaves a snapshot and a log whose records continue it:
// before the snapshot's rename, the old snapshot and the whole log; after
// it, the new snapshot and a log that still holds records it covers (replay
// skips them by seq); after the log's rename, the new snapshot and the
// records past it.
type store struct {
	dir     string
	logger  *slog.Logger
	log     *os.File // opened O_APPEND
	records int      // records in the log file
	size    int64    // bytes in the log file
	// crashAt, if set (tests), is called at each step of a snapshot and
	// of trim; an error stops there as a crash would.
	crashAt func(step string) error
}

// logCut is where the log stood when a snapshot was cut.
type logCut struct {
	seq     uint64
	size    int64
	records int
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
		s.size = fileHeaderLen
	case err != nil:
		return nil, nil, 0, fmt.Errorf("tablemaster: read log: %w", err)
	default:
		var n, valid int
		n, valid, seq, err = replayLog(data, st, seq, logger)
		if err != nil {
			return nil, nil, 0, fmt.Errorf("tablemaster: replay %s: %w", logPath, err)
		}
		s.records, s.size = n, int64(valid)
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
			return 0, 0, 0, fmt.Errorf("%w: command seq %d (%s) does not apply: %v", ErrCorrupt, e.Seq, e.Cmd.Op(), err)
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
	rec := appendRecord(nil, payload)
	if _, err := s.log.Write(rec); err != nil {
		return fmt.Errorf("tablemaster: append command seq %d: %w", e.Seq, err)
	}
	if err := s.log.Sync(); err != nil {
		return fmt.Errorf("tablemaster: sync command seq %d: %w", e.Seq, err)
	}
	s.records++
	s.size += int64(len(rec))
	return nil
}

// errLogUncertain marks a snapshot failure after which the command log can
// no longer be trusted to receive appends.
var errLogUncertain = errors.New("command log state uncertain")

// cut notes where the log stands after the command seq (step 1 of a
// snapshot).
func (s *store) cut(seq uint64) logCut {
	return logCut{seq: seq, size: s.size, records: s.records}
}

// writeSnapshot durably replaces the snapshot in dir with st, the state
// after command seq (step 2 of a snapshot). It only reads st, which must
// not change meanwhile: the Master passes a published State.
func writeSnapshot(dir string, st *State, seq uint64) error {
	payload, err := json.Marshal(snapshotBody{Seq: seq, State: st})
	if err != nil {
		return fmt.Errorf("tablemaster: encode snapshot: %w", err)
	}
	if err := writeFileAtomic(dir, snapFileName, appendRecord(encodeFileHeader(snapMagic), payload)); err != nil {
		return fmt.Errorf("tablemaster: write snapshot: %w", err)
	}
	return nil
}

// trim replaces the log with its records past c, whose snapshot is durable
// (step 3 of a snapshot). When it returns nil the new log is durable and
// receives the appends.
func (s *store) trim(c logCut) error {
	path := filepath.Join(s.dir, logFileName)
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("tablemaster: read log to trim: %w", err)
	}
	if int64(len(data)) != s.size || c.size > s.size || c.size < fileHeaderLen {
		return fmt.Errorf("tablemaster: trim log: file is %d bytes, %d written, cut at %d", len(data), s.size, c.size)
	}
	tail := data[c.size:]
	if err := s.step("trim-read"); err != nil {
		return err
	}
	if err := writeFileAtomic(s.dir, logFileName, append(encodeFileHeader(logMagic), tail...)); err != nil {
		// A failed rename leaves the old file in place; a failure after
		// it (the directory's fsync) leaves either: s.log may point at a
		// file no longer at logFileName. Commands appended there would
		// vanish on restart.
		return fmt.Errorf("tablemaster: trim log: %w: %w", errLogUncertain, err)
	}
	if err := s.step("trim-renamed"); err != nil {
		return fmt.Errorf("%w: %w", errLogUncertain, err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("tablemaster: reopen log: %w: %w", errLogUncertain, err)
	}
	old := s.log
	s.log = f
	s.records -= c.records
	s.size = fileHeaderLen + int64(len(tail))
	if err := old.Close(); err != nil {
		s.logger.Warn("tablemaster: close old log", "err", err)
	}
	return nil
}

func (s *store) step(name string) error {
	if s.crashAt == nil {
		return nil
	}
	return s.crashAt(name)
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

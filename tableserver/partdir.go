package tableserver

import (
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tabuladb/tabula/internal/atomicfile"
)

// A durable partition's files live in <data>/partitions/<id>. The directory
// holds the engine's files and an EPOCH file naming the epoch at which this
// server took the partition over. Epochs change only when the primary
// changes, so a directory whose EPOCH differs from the partition's current
// epoch holds data from before the partition lived elsewhere: serving it
// would resurrect stale data. Such a directory, and the directory of a
// partition moved away from this server, is moved aside to
// <data>/orphaned/<id>-e<epoch>-<unix seconds> (kept for an operator, never
// opened again); a dropped table's directories are deleted.
//
// EPOCH format (text, version 1, never change):
//
//	tabula-partition-epoch v1
//	epoch=<decimal>
//	crc32c=<8 hex digits of CRC32C of the decimal>
const (
	partitionsDir = "partitions"
	orphanedDir   = "orphaned"
	epochFile     = "EPOCH"
	epochHeader   = "tabula-partition-epoch v1"
)

// ErrCorruptEpoch: a partition's EPOCH file does not decode.
var ErrCorruptEpoch = errors.New("tableserver: corrupt partition EPOCH file")

func (s *Server) partitionDir(id uint64) string {
	return filepath.Join(s.opts.DataDir, partitionsDir, strconv.FormatUint(id, 10))
}

func encodeEpoch(epoch uint64) []byte {
	d := strconv.FormatUint(epoch, 10)
	return fmt.Appendf(nil, "%s\nepoch=%s\ncrc32c=%08x\n", epochHeader, d, crc32.Checksum([]byte(d), castagnoli))
}

func decodeEpoch(b []byte) (uint64, error) {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) != 3 || lines[0] != epochHeader {
		return 0, fmt.Errorf("%w: bad header or line count", ErrCorruptEpoch)
	}
	d, ok := strings.CutPrefix(lines[1], "epoch=")
	if !ok {
		return 0, fmt.Errorf("%w: bad epoch line", ErrCorruptEpoch)
	}
	var sum uint32
	if _, err := fmt.Sscanf(lines[2], "crc32c=%08x", &sum); err != nil || crc32.Checksum([]byte(d), castagnoli) != sum {
		return 0, fmt.Errorf("%w: checksum mismatch", ErrCorruptEpoch)
	}
	e, err := strconv.ParseUint(d, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %v", ErrCorruptEpoch, err)
	}
	return e, nil
}

// preparePartitionDir makes dir ready to open partition id at epoch: a
// directory left from another epoch (or with an unreadable EPOCH) is moved
// aside first. It returns the directory.
func (s *Server) preparePartitionDir(id, epoch uint64) (string, error) {
	dir := s.partitionDir(id)
	b, err := os.ReadFile(filepath.Join(dir, epochFile))
	switch {
	case errors.Is(err, os.ErrNotExist):
		if _, statErr := os.Stat(dir); statErr == nil {
			// Files but no EPOCH: a crash between creating the directory
			// and recording the epoch; nothing was served from it.
			if err := s.orphan(id, 0, "no EPOCH file"); err != nil {
				return "", err
			}
		}
	case err != nil:
		return "", fmt.Errorf("read EPOCH of partition %d: %w", id, err)
	default:
		had, derr := decodeEpoch(b)
		if derr != nil || had != epoch {
			why := fmt.Sprintf("its data is from epoch %d, the partition is at %d", had, epoch)
			if derr != nil {
				why = derr.Error()
			}
			if err := s.orphan(id, had, why); err != nil {
				return "", err
			}
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create partition %d directory: %w", id, err)
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, epochFile), encodeEpoch(epoch), 0o644); err != nil {
		return "", fmt.Errorf("record epoch of partition %d: %w", id, err)
	}
	return dir, atomicfile.SyncDir(filepath.Dir(dir))
}

// prepareLogPartitionDir makes the directory of partition id, replicated
// through its commit log, ready: its engine's data, if any, is a prefix of
// that log (nothing is applied beyond the commit point), so it is kept
// whatever epoch the partition is at, and the replica continues from it.
func (s *Server) prepareLogPartitionDir(id uint64) (string, error) {
	dir := s.partitionDir(id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create partition %d directory: %w", id, err)
	}
	return dir, atomicfile.SyncDir(filepath.Dir(dir))
}

// recordEpoch durably rewrites the EPOCH file of partition id, whose
// directory is open and serving, to epoch. Unlike preparePartitionDir it
// never moves the directory: the data in it is the partition's current data.
func (s *Server) recordEpoch(id, epoch uint64) error {
	dir := s.partitionDir(id)
	if err := atomicfile.WriteFile(filepath.Join(dir, epochFile), encodeEpoch(epoch), 0o644); err != nil {
		return fmt.Errorf("record epoch %d of partition %d: %w", epoch, id, err)
	}
	return nil
}

// orphan moves partition id's directory aside, never to be opened again.
func (s *Server) orphan(id, epoch uint64, why string) error {
	to := filepath.Join(s.opts.DataDir, orphanedDir, fmt.Sprintf("%d-e%d-%d", id, epoch, time.Now().Unix()))
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return fmt.Errorf("orphan partition %d: %w", id, err)
	}
	if err := os.Rename(s.partitionDir(id), to); err != nil {
		return fmt.Errorf("orphan partition %d: %w", id, err)
	}
	s.log.Warn("partition data moved aside, not served", "partition", id, "to", to, "why", why)
	return atomicfile.SyncDir(filepath.Join(s.opts.DataDir, partitionsDir))
}

// removePartitionDir deletes a dropped table's partition data.
func (s *Server) removePartitionDir(id uint64) error {
	if err := os.RemoveAll(s.partitionDir(id)); err != nil {
		return fmt.Errorf("remove partition %d: %w", id, err)
	}
	return nil
}

package bulk

import (
	"context"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/tabuladb/tabula/engines/vfs"
)

// DirVersion describes a directory of built partition files (what
// BuildTable writes) for publishing: the version they carry and each
// file's size and whole-file CRC32C.
type DirVersion struct {
	// Version and Base (0 for a full version) are what the files record.
	Version, Base uint64
	// Files are the partitions' files, in partition order.
	Files []PartitionInfo
}

// DescribeDir reads dir's partition files for a table of partitions
// partitions: every file must be there (named by PartitionFileName), open
// cleanly, record its partition, and agree with the others on version and
// base. It reads each file once, to compute its CRC32C.
func DescribeDir(ctx context.Context, dir string, partitions int) (DirVersion, error) {
	var dv DirVersion
	ents, err := os.ReadDir(dir)
	if err != nil {
		return dv, fmt.Errorf("bulk: read %s: %w", dir, err)
	}
	want := map[string]bool{}
	for i := range partitions {
		want[PartitionFileName(i, partitions)] = true
	}
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".bulk") && !want[e.Name()] {
			return dv, fmt.Errorf("bulk: %s holds %s, which is not a file of a %d-partition table (built for another partition count?)", dir, e.Name(), partitions)
		}
	}
	for i := range partitions {
		if err := ctx.Err(); err != nil {
			return dv, err
		}
		path := filepath.Join(dir, PartitionFileName(i, partitions))
		info, v, base, err := describeFile(path)
		if err != nil {
			return dv, err
		}
		if p, n := info.Partition, info.Partitions; p != i || n != partitions {
			return dv, fmt.Errorf("bulk: %s records partition %d of %d", path, p, n)
		}
		if i == 0 {
			dv.Version, dv.Base = v, base
		} else if v != dv.Version || base != dv.Base {
			return dv, fmt.Errorf("bulk: %s is version %d (base %d) but %s is version %d (base %d): a directory holds one version",
				path, v, base, PartitionFileName(0, partitions), dv.Version, dv.Base)
		}
		dv.Files = append(dv.Files, info)
	}
	return dv, nil
}

func describeFile(path string) (PartitionInfo, uint64, uint64, error) {
	f, err := Open(vfs.Default, path, OpenOptions{NoMmap: true})
	if err != nil {
		return PartitionInfo{}, 0, 0, fmt.Errorf("bulk: %s: %w", path, err)
	}
	defer f.Close()
	st := f.Stats()
	i, n := f.Partition()
	base, _ := f.Delta()
	info := PartitionInfo{Partition: i, Partitions: n, Path: path, Records: st.Records, Deleted: st.Deleted, FileBytes: st.FileBytes, IndexBytes: st.IndexBytes}
	osf, err := os.Open(path)
	if err != nil {
		return info, 0, 0, err
	}
	defer osf.Close()
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	if _, err := io.Copy(h, osf); err != nil {
		return info, 0, 0, fmt.Errorf("bulk: read %s: %w", path, err)
	}
	info.CRC = h.Sum32()
	return info, f.Version(), base, nil
}

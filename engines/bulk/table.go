package bulk

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"slices"
	"sync"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/vfs"
	"github.com/tabuladb/tabula/internal/keyspace"
)

// BuildOptions tune BuildTable. The zero value works (one partition... see
// Partitions).
type BuildOptions struct {
	// Partitions is the table's partition count. Default
	// defaultPartitions (8).
	Partitions int
	// Format of the inputs. Default FormatTSV.
	Format Format
	// Base64: keys and values in the input are base64 (Parquet: in its
	// BYTE_ARRAY columns). Default false.
	Base64 bool
	// KeyColumn and ValueColumn name the key's and the value's JSON
	// fields (FormatJSONL) or columns (FormatParquet). Default
	// DefaultKeyColumn ("key") and DefaultValueColumn ("value"). The text
	// formats tsv and csv have no names: setting either is an error.
	KeyColumn, ValueColumn string
	// Version is the table version written into the files. Default 0.
	Version uint64
	// DeltaOf, when not 0, builds a delta over version DeltaOf: the input
	// holds changed records and deletions (see Format).
	DeltaOf uint64
	// MemoryBudget bounds the input bytes held in memory while reading
	// and, as far as possible, the partitions being built at once (a
	// partition is built in memory: about its records' bytes, as much
	// again up to 128 MiB of output window, plus 40 bytes per record).
	// Beyond it, records spill to temporary files. Default 1 GiB.
	MemoryBudget int64
	// Workers building partitions at once. Default GOMAXPROCS.
	Workers int
	// TempDir holds spill files. Default outDir/.spill (removed at the end).
	TempDir string
	// Partition tunes each partition build (FS, LastWins, FingerprintBits,
	// MaxValueBytes, MPH, Workers). Its FS is also where inputs are read
	// from, spill files and the output written. Its Workers defaults to
	// Workers / min(Workers, Partitions).
	Partition PartitionOptions
	// Progress, when set, is called as the build advances (from one
	// goroutine at a time, at most every 64 Ki records or per partition).
	Progress func(Progress)
}

// Progress is a build's advance.
type Progress struct {
	// Phase is "read" (parsing and routing inputs) or "build" (writing
	// partition files).
	Phase string
	// Records and Bytes read so far (phase read), or records written.
	Records, Bytes int64
	// PartitionsDone of Partitions (phase build).
	PartitionsDone, Partitions int
}

func (o BuildOptions) withDefaults(outDir string) BuildOptions {
	if o.Partitions == 0 {
		o.Partitions = defaultPartitions
	}
	if o.MemoryBudget == 0 {
		o.MemoryBudget = 1 << 30
	}
	if o.Workers == 0 {
		o.Workers = runtime.GOMAXPROCS(0)
	}
	if o.TempDir == "" {
		o.TempDir = filepath.Join(outDir, ".spill")
	}
	if o.Partition.Workers == 0 {
		// Workers beyond one per partition help build each partition.
		o.Partition.Workers = max(1, o.Workers/min(o.Workers, o.Partitions))
	}
	o.Partition = o.Partition.withDefaults()
	return o
}

// Validate explains what is wrong with o.
func (o BuildOptions) Validate() error {
	switch {
	case o.Partitions < 0 || o.Partitions > maxPartitions:
		return fmt.Errorf("bulk: Partitions %d, want 1..%d", o.Partitions, maxPartitions)
	case o.Format < FormatTSV || o.Format > FormatParquet:
		return fmt.Errorf("bulk: unknown Format %d", o.Format)
	case (o.KeyColumn != "" || o.ValueColumn != "") && o.Format != FormatJSONL && o.Format != FormatParquet:
		return fmt.Errorf("bulk: KeyColumn/ValueColumn name jsonl fields or parquet columns; a %s input has no names", o.Format)
	case cmp.Or(o.KeyColumn, DefaultKeyColumn) == cmp.Or(o.ValueColumn, DefaultValueColumn):
		return fmt.Errorf("bulk: key and value both in column %q", cmp.Or(o.KeyColumn, DefaultKeyColumn))
	case o.Format > FormatJSONL && registeredFormat(o.Format) == nil:
		return fmt.Errorf("bulk: Format %s: %w (import github.com/tabuladb/tabula/engines/bulk/parquetinput)", o.Format, ErrFormatNotLinked)
	case o.Format == FormatJSONL && (o.KeyColumn == "delete" || o.ValueColumn == "delete"):
		return errors.New(`bulk: "delete" is the jsonl deletion field; it cannot name the key or the value`)
	case o.MemoryBudget < 0:
		return fmt.Errorf("bulk: MemoryBudget %d < 0", o.MemoryBudget)
	case o.Workers < 0:
		return fmt.Errorf("bulk: Workers %d < 0", o.Workers)
	}
	return o.Partition.Validate()
}

// PartitionFileName is the name BuildTable gives partition i of n.
func PartitionFileName(i, n int) string { return fmt.Sprintf("part-%05d-of-%05d.bulk", i, n) }

// spill is one partition's routed records: an in-memory tail and the bytes
// already written to its spill file.
//
// Spill record (temporary files; still checksummed):
//
//	| crc32c (4) | flags (1) | input (4) | line (8) | keyLen (4) | valLen (4) | key | value |
//
// crc32c covers everything after it; flags bit 0 is a deletion, bit 1 says
// line is a Parquet row (Position.Row).
type spill struct {
	buf     []byte
	onDisk  int64
	records int
}

const spillHeaderLen = 25

func appendSpill(dst []byte, r Record, input int, pos Position) []byte {
	start := len(dst)
	var h [spillHeaderLen]byte
	if r.Delete {
		h[4] |= 1
	}
	if pos.Row {
		h[4] |= 2
	}
	binary.LittleEndian.PutUint32(h[5:], uint32(input))
	binary.LittleEndian.PutUint64(h[9:], uint64(pos.Line))
	binary.LittleEndian.PutUint32(h[17:], uint32(len(r.Key)))
	binary.LittleEndian.PutUint32(h[21:], uint32(len(r.Value)))
	dst = append(dst, h[:]...)
	dst = append(dst, r.Key...)
	dst = append(dst, r.Value...)
	binary.LittleEndian.PutUint32(dst[start:], crcOf(dst[start+4:]))
	return dst
}

// decodeSpill decodes b into records and positions aliasing b.
func decodeSpill(b []byte, inputs []string) ([]Record, []Position, error) {
	var recs []Record
	var pos []Position
	for len(b) > 0 {
		if len(b) < spillHeaderLen {
			return nil, nil, fmt.Errorf("bulk: spill record cut: %w", engines.ErrCorrupt)
		}
		kl := uint64(binary.LittleEndian.Uint32(b[17:]))
		vl := uint64(binary.LittleEndian.Uint32(b[21:]))
		n := spillHeaderLen + kl + vl
		if uint64(len(b)) < n {
			return nil, nil, fmt.Errorf("bulk: spill record cut: %w", engines.ErrCorrupt)
		}
		if crcOf(b[4:n]) != binary.LittleEndian.Uint32(b) {
			return nil, nil, fmt.Errorf("bulk: spill record crc mismatch: %w", engines.ErrCorrupt)
		}
		in := int(binary.LittleEndian.Uint32(b[5:]))
		if in >= len(inputs) {
			return nil, nil, fmt.Errorf("bulk: spill record of input %d: %w", in, engines.ErrCorrupt)
		}
		k := b[spillHeaderLen : spillHeaderLen+kl : spillHeaderLen+kl]
		v := b[spillHeaderLen+kl : n : n]
		recs = append(recs, Record{Key: k, Value: v, Delete: b[4]&1 != 0})
		pos = append(pos, Position{File: inputs[in], Line: int64(binary.LittleEndian.Uint64(b[9:])), Row: b[4]&2 != 0})
		b = b[n:]
	}
	return recs, pos, nil
}

// BuildTable builds every partition file of a table version from inputs
// (files of opts.Partition.FS, read in order) into outDir, named
// PartitionFileName(i, n), and returns them by partition. Each file is
// durable when BuildTable returns nil. Malformed input is a
// *MalformedError naming file and line (Parquet: row), and nothing is
// built; duplicate keys a *DuplicateError unless LastWins; no records at
// all ErrEmptyInput. The output bytes depend
// only on the input and opts' format settings — not on Workers,
// MemoryBudget or timing.
func BuildTable(ctx context.Context, inputs []string, outDir string, opts BuildOptions) ([]PartitionInfo, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults(outDir)
	fs := opts.Partition.FS
	if len(inputs) == 0 {
		return nil, fmt.Errorf("%w: no input files", ErrEmptyInput)
	}
	if err := fs.MkdirAll(outDir, 0o755); err != nil {
		return nil, fmt.Errorf("bulk: create %s: %w", outDir, err)
	}
	np := opts.Partitions
	spills := make([]spill, np)
	var spillFiles []vfs.File
	spillName := func(i int) string { return filepath.Join(opts.TempDir, fmt.Sprintf("%05d.spill", i)) }
	defer func() {
		for i, f := range spillFiles {
			if f != nil {
				f.Close()
				fs.Remove(spillName(i))
			}
		}
	}()
	var buffered, records, readBytes int64
	report := func(p Progress) {
		if opts.Progress != nil {
			opts.Progress(p)
		}
	}
	flush := func() error {
		if spillFiles == nil {
			if err := fs.MkdirAll(opts.TempDir, 0o755); err != nil {
				return fmt.Errorf("bulk: create %s: %w", opts.TempDir, err)
			}
			spillFiles = make([]vfs.File, np)
		}
		for i := range spills {
			s := &spills[i]
			if len(s.buf) == 0 {
				continue
			}
			if spillFiles[i] == nil {
				f, err := fs.Create(spillName(i))
				if err != nil {
					return fmt.Errorf("bulk: spill: %w", err)
				}
				spillFiles[i] = f
			}
			if _, err := spillFiles[i].Write(s.buf); err != nil {
				return fmt.Errorf("bulk: spill: %w", err)
			}
			s.onDisk += int64(len(s.buf))
			s.buf = s.buf[:0]
		}
		buffered = 0
		return nil
	}

	// Read phase: parse and route in input order.
	for in, name := range inputs {
		f, err := fs.Open(name)
		if err != nil {
			return nil, fmt.Errorf("bulk: open input: %w", err)
		}
		p, err := OpenInput(name, f, opts.InputOptions())
		if err != nil {
			f.Close()
			return nil, err
		}
		for {
			rec, pos, n, err := p.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				f.Close()
				return nil, err
			}
			switch {
			case len(rec.Key) == 0 || len(rec.Key) > maxKeyBytes:
				f.Close()
				return nil, &MalformedError{Pos: pos, Reason: fmt.Sprintf("key of %d bytes, want 1..%d", len(rec.Key), maxKeyBytes)}
			case len(rec.Value) > opts.Partition.MaxValueBytes:
				f.Close()
				return nil, &MalformedError{Pos: pos, Reason: fmt.Sprintf("value of %d bytes, the limit is %d", len(rec.Value), opts.Partition.MaxValueBytes)}
			}
			part := keyspace.Index(keyspace.Hash(rec.Key), np)
			s := &spills[part]
			before := len(s.buf)
			s.buf = appendSpill(s.buf, rec, in, pos)
			s.records++
			buffered += int64(len(s.buf) - before)
			records++
			readBytes += int64(n)
			if buffered > opts.MemoryBudget/2 {
				if err := flush(); err != nil {
					f.Close()
					return nil, err
				}
			}
			if records&(1<<16-1) == 0 {
				if err := ctx.Err(); err != nil {
					f.Close()
					return nil, err
				}
				report(Progress{Phase: "read", Records: records, Bytes: readBytes})
			}
		}
		if err := f.Close(); err != nil {
			return nil, fmt.Errorf("bulk: close input %s: %w", name, err)
		}
	}
	report(Progress{Phase: "read", Records: records, Bytes: readBytes})
	if records == 0 {
		return nil, fmt.Errorf("%w: %d input file(s) without a record", ErrEmptyInput, len(inputs))
	}

	// Build phase: partitions in parallel, the bytes in memory bounded.
	spec := PartitionSpec{Partitions: np, Version: opts.Version, Delta: opts.DeltaOf != 0, BaseVersion: opts.DeltaOf}
	infos := make([]PartitionInfo, np)
	errs := make([]error, np)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu       sync.Mutex
		cond     = sync.NewCond(&mu)
		inMemory int64 // bytes of partitions being built; guarded by mu
		done     int   // guarded by mu
		written  int64 // guarded by mu
	)
	cost := func(i int) int64 {
		s := spills[i]
		b := s.onDisk + int64(len(s.buf))
		return b + min(b, int64(windowBytes)) + 40*int64(s.records)
	}
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(opts.Workers, np) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				c := cost(i)
				mu.Lock()
				for inMemory > 0 && inMemory+c > opts.MemoryBudget {
					cond.Wait()
				}
				inMemory += c
				mu.Unlock()
				var sf vfs.File
				if spillFiles != nil {
					sf = spillFiles[i]
				}
				infos[i], errs[i] = buildSpilled(ctx, sf, &spills[i], inputs, filepath.Join(outDir, PartitionFileName(i, np)), spec, i, opts.Partition)
				var de *DuplicateError
				if errs[i] != nil && !errors.As(errs[i], &de) {
					cancel() // duplicates: let the others list theirs
				}
				mu.Lock()
				inMemory -= c
				done++
				written += int64(infos[i].Records)
				p := Progress{Phase: "build", Records: written, PartitionsDone: done, Partitions: np}
				report(p)
				cond.Broadcast()
				mu.Unlock()
			}
		}()
	}
	for i := 0; i < np; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	if err := JoinPartitionErrors(errs, inputs); err != nil {
		return nil, err
	}
	if spillFiles != nil {
		for i, f := range spillFiles {
			if f != nil {
				f.Close()
				fs.Remove(spillName(i))
				spillFiles[i] = nil
			}
		}
		fs.Remove(opts.TempDir)
	}
	return infos, nil
}

func buildSpilled(ctx context.Context, sf vfs.File, s *spill, inputs []string, path string, spec PartitionSpec, i int, opts PartitionOptions) (PartitionInfo, error) {
	data := s.buf
	if s.onDisk > 0 {
		data = make([]byte, s.onDisk+int64(len(s.buf)))
		if _, err := sf.ReadAt(data[:s.onDisk], 0); err != nil {
			return PartitionInfo{}, fmt.Errorf("bulk: read spill: %w", err)
		}
		copy(data[s.onDisk:], s.buf)
	}
	s.buf = nil
	recs, pos, err := decodeSpill(data, inputs)
	if err != nil {
		return PartitionInfo{}, err
	}
	spec.Partition = i
	return buildPartition(ctx, path, recs, pos, spec, opts)
}

// mergeDuplicates joins the partitions' duplicate errors into one listing
// the first duplicates in input order, or returns nil if there are none.
func mergeDuplicates(errs []error, inputs []string) error {
	var all DuplicateError
	for _, err := range errs {
		var de *DuplicateError
		if errors.As(err, &de) {
			all.Count += de.Count
			all.Dups = append(all.Dups, de.Dups...)
		}
	}
	if all.Count == 0 {
		return nil
	}
	index := map[string]int{}
	for i, in := range inputs {
		if _, ok := index[in]; !ok {
			index[in] = i
		}
	}
	slices.SortStableFunc(all.Dups, func(a, b Duplicate) int {
		if c := cmp.Compare(index[a.Next.File], index[b.Next.File]); c != 0 {
			return c
		}
		return cmp.Compare(a.Next.Line, b.Next.Line)
	})
	all.Dups = all.Dups[:min(len(all.Dups), maxDups)]
	return &all
}

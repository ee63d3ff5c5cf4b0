package beambuild

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"github.com/apache/beam/sdks/v2/go/pkg/beam"
	"github.com/apache/beam/sdks/v2/go/pkg/beam/io/filesystem"
	"github.com/apache/beam/sdks/v2/go/pkg/beam/register"

	// The in-process runner Build uses by default.
	_ "github.com/apache/beam/sdks/v2/go/pkg/beam/runners/direct"

	"github.com/tabuladb/tabula/engines/bulk"
	"github.com/tabuladb/tabula/engines/bulk/mph"
	"github.com/tabuladb/tabula/engines/vfs"
)

// Options tune Build. The zero value works (the direct runner, 8
// partitions, as bulk.BuildOptions' zero value). Options is a plain value;
// Build does not keep or change it.
type Options struct {
	// Build holds the table's options, as for bulk.BuildTable: Partitions,
	// Format, Base64, Version, DeltaOf, Workers and Partition's LastWins,
	// FingerprintBits, MaxValueBytes and MPH make the same files.
	// MemoryBudget, TempDir and Progress are not used (the runner holds
	// and moves the records); Partition.FS must be nil or vfs.Default (the
	// pipeline's workers write through the operating system or Beam's file
	// systems). Workers is how many partitions one bundle builds at once
	// (default GOMAXPROCS), Partition.Workers the goroutines of each
	// (default Workers / min(Workers, Partitions)), as BuildTable's.
	Build bulk.BuildOptions
	// Runner is the Beam runner: "", "direct" or "local" run the pipeline
	// in this process on Beam's direct runner; any other name (universal,
	// flink, spark, dataflow, prism...) is passed to beam.Run, configured
	// by Beam's standard flags (--endpoint, --environment_type...).
	// Default direct.
	Runner string
	// ChunkBytes is how many bytes of encoded records of one partition the
	// read step gathers into one element. Default 1 MiB, less when there
	// are more than 256 partitions (at most 256 MiB buffered per input).
	ChunkBytes int
}

// Validate explains what is wrong with o.
func (o Options) Validate() error {
	if err := o.Build.Validate(); err != nil {
		return err
	}
	if o.Build.Partition.FS != nil && o.Build.Partition.FS != vfs.Default {
		return errors.New("beambuild: Build.Partition.FS must be nil or vfs.Default")
	}
	if o.ChunkBytes < 0 {
		return fmt.Errorf("beambuild: ChunkBytes %d < 0", o.ChunkBytes)
	}
	return nil
}

// IsDirect reports whether runner names the in-process direct runner.
func IsDirect(runner string) bool {
	return runner == "" || runner == "direct" || runner == "local" || runner == "DirectRunner"
}

const defaultPartitions = 8 // bulk.BuildOptions' default

// failures holds the error that failed each run in this process, by run
// id: Beam's runners keep only the text of a DoFn's error, so this is how
// Build returns the native error itself on the direct runner. On another
// runner the DoFns run elsewhere and Build returns the runner's error, whose
// text holds the native one.
var failures sync.Map // run id (string) → error

// fail records err as run's failure (the first one wins) and returns it.
func fail(run string, err error) error {
	failures.LoadOrStore(run, err)
	return err
}

// Build builds every partition file of a table version from inputs into
// outDir, named bulk.PartitionFileName(i, n), on a Beam pipeline: the files
// bulk.BuildTable writes from the same inputs and opts.Build, byte for
// byte. Each file is durable when Build returns nil. It returns the native
// builder's errors (*bulk.MalformedError naming file and line,
// *bulk.DuplicateError, bulk.ErrEmptyInput) — on a portable runner, within
// the runner's error. When it fails, it removes the table's partition files
// from outDir.
func Build(ctx context.Context, inputs []string, outDir string, opts Options) error {
	if err := opts.Validate(); err != nil {
		return err
	}
	bo := opts.Build
	if bo.Partitions == 0 {
		bo.Partitions = defaultPartitions
	}
	if bo.Workers == 0 {
		bo.Workers = runtime.GOMAXPROCS(0)
	}
	if bo.Partition.Workers == 0 {
		bo.Partition.Workers = max(1, bo.Workers/min(bo.Workers, bo.Partitions))
	}
	np := bo.Partitions
	if len(inputs) == 0 {
		return fmt.Errorf("%w: no input files", bulk.ErrEmptyInput)
	}
	if !isRemote(outDir) {
		if err := os.MkdirAll(outDir, 0o755); err != nil {
			return fmt.Errorf("bulk: create %s: %w", outDir, err)
		}
	}
	chunk := opts.ChunkBytes
	if chunk == 0 {
		chunk = max(64<<10, min(1<<20, (256<<20)/np))
	}

	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		return err
	}
	run := hex.EncodeToString(id[:])
	defer failures.Delete(run)

	p, s := beam.NewPipelineWithRoot()
	idx := make([]int, len(inputs))
	for i := range idx {
		idx[i] = i
	}
	files := beam.CreateList(s.Scope("inputs"), idx)
	if !IsDirect(opts.Runner) {
		files = beam.Reshuffle(s, files) // spread the inputs over workers
	}
	chunks := beam.ParDo(s.Scope("read"), &readFn{
		Run: run, Inputs: inputs, Format: int(bo.Format), Base64: bo.Base64, DeltaOf: bo.DeltaOf,
		MaxValueBytes: bo.Partition.MaxValueBytes, Partitions: np, ChunkBytes: chunk,
	}, files)
	parts := make([]int, np)
	for i := range parts {
		parts[i] = i
	}
	seeds := beam.ParDo(s.Scope("seeds"), seedPartition, beam.CreateList(s.Scope("partitions"), parts))
	grouped := beam.GroupByKey(s.Scope("route"), beam.Flatten(s, seeds, chunks))
	results := beam.ParDo(s.Scope("build"), &buildFn{
		Run: run, Inputs: inputs, Out: outDir, Partitions: np, Version: bo.Version, DeltaOf: bo.DeltaOf,
		Workers: min(bo.Workers, np), LastWins: bo.Partition.LastWins, FingerprintBits: bo.Partition.FingerprintBits,
		MaxValueBytes: bo.Partition.MaxValueBytes, MPH: bo.Partition.MPH, PartitionWorkers: bo.Partition.Workers,
	}, grouped)
	all := beam.GroupByKey(s.Scope("gather"), beam.AddFixedKey(s, results))
	beam.ParDo0(s.Scope("finish"), &finishFn{Run: run, Inputs: inputs, Partitions: np}, all)

	runner := opts.Runner
	if IsDirect(runner) {
		runner = "direct"
	}
	if _, err := beam.Run(ctx, runner, p); err != nil {
		removeOutput(ctx, outDir, np)
		if f, ok := failures.Load(run); ok {
			return f.(error)
		}
		return fmt.Errorf("beambuild: %s runner: %w", runner, err)
	}
	return nil
}

// isRemote reports whether path is on one of Beam's file systems other
// than the local one (it names a scheme, as gs://bucket/dir).
func isRemote(path string) bool {
	i := strings.Index(path, "://")
	return i > 0 && !strings.HasPrefix(path, "file://")
}

// joinPath joins dir and name for the local or a remote file system.
func joinPath(dir, name string) string {
	if isRemote(dir) {
		return strings.TrimSuffix(dir, "/") + "/" + name
	}
	return filepath.Join(dir, name)
}

// removeOutput removes what a failed build may have written to outDir:
// every partition file of the table and its temporary file.
func removeOutput(ctx context.Context, outDir string, np int) {
	if !isRemote(outDir) {
		for i := range np {
			p := filepath.Join(outDir, bulk.PartitionFileName(i, np))
			os.Remove(p)
			os.Remove(p + ".tmp")
		}
		return
	}
	fs, err := filesystem.New(ctx, outDir)
	if err != nil {
		return
	}
	defer fs.Close()
	if r, ok := fs.(filesystem.Remover); ok {
		for i := range np {
			r.Remove(ctx, joinPath(outDir, bulk.PartitionFileName(i, np)))
		}
	}
}

// openInput opens an input as BuildTable does (the local file system), or
// through Beam's file system for a remote path.
func openInput(ctx context.Context, name string) (io.ReadCloser, error) {
	if !isRemote(name) {
		f, err := vfs.Default.Open(name)
		if err != nil {
			return nil, fmt.Errorf("bulk: open input: %w", err)
		}
		return f, nil
	}
	fs, err := filesystem.New(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("bulk: open input: %w", err)
	}
	r, err := fs.OpenRead(ctx, name)
	if err != nil {
		fs.Close()
		return nil, fmt.Errorf("bulk: open input: %w", err)
	}
	return r, nil
}

// readFn parses one input (by index) and emits its records as chunks keyed
// by partition. Safe for one bundle at a time (as Beam calls it).
type readFn struct {
	Run           string
	Inputs        []string
	Format        int
	Base64        bool
	DeltaOf       uint64
	MaxValueBytes int
	Partitions    int
	ChunkBytes    int
}

func (f *readFn) ProcessElement(ctx context.Context, in int, emit func(int, []byte)) error {
	name := f.Inputs[in]
	r, err := openInput(ctx, name)
	if err != nil {
		return fail(f.Run, err)
	}
	defer r.Close()
	opts := bulk.BuildOptions{Format: bulk.Format(f.Format), Base64: f.Base64, DeltaOf: f.DeltaOf}
	opts.Partition.MaxValueBytes = f.MaxValueBytes
	ir := bulk.NewInputReader(name, r, opts)
	bufs := make([][]byte, f.Partitions)
	for n := 0; ; n++ {
		rec, pos, err := ir.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fail(f.Run, err)
		}
		part := bulk.PartitionOf(rec.Key, f.Partitions)
		b := bufs[part]
		if b == nil {
			b = make([]byte, 0, f.ChunkBytes+f.ChunkBytes/8)
		}
		b = appendRecord(b, rec, in, pos.Line)
		if len(b) >= f.ChunkBytes {
			emit(part, b)
			b = nil
		}
		bufs[part] = b
		if n&(1<<16-1) == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
	}
	if err := r.Close(); err != nil {
		return fail(f.Run, fmt.Errorf("bulk: close input %s: %w", name, err))
	}
	for part, b := range bufs {
		if len(b) > 0 {
			emit(part, b)
		}
	}
	return nil
}

// seedPartition makes partition p appear after the group-by-key even when
// no record routes to it.
func seedPartition(p int) (int, []byte) { return p, []byte{} }

// result is what building one partition gave, JSON between the build and
// finish steps.
type result struct {
	Partition int
	// Input is the partition's input records (before LastWins).
	Input    int
	Records  uint64
	Err      string           `json:",omitempty"`
	Dups     []bulk.Duplicate `json:",omitempty"`
	DupCount int              `json:",omitempty"`
}

// buildFn builds the partition files, up to Workers at once in a bundle:
// ProcessElement starts a partition's build, FinishBundle waits for them
// and emits their results. Beam calls it for one bundle at a time.
type buildFn struct {
	Run              string
	Inputs           []string
	Out              string
	Partitions       int
	Version, DeltaOf uint64
	Workers          int
	LastWins         bool
	FingerprintBits  int
	MaxValueBytes    int
	MPH              mph.Options
	PartitionWorkers int

	sem     chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	results []result // guarded by mu
}

func (f *buildFn) StartBundle(ctx context.Context, _ func([]byte)) error {
	f.sem = make(chan struct{}, max(1, f.Workers))
	f.results = nil
	if !isRemote(f.Out) {
		if err := os.MkdirAll(f.Out, 0o755); err != nil {
			return fail(f.Run, fmt.Errorf("bulk: create %s: %w", f.Out, err))
		}
	}
	return nil
}

// ProcessElement takes emit, unused, to declare the output FinishBundle
// emits.
func (f *buildFn) ProcessElement(ctx context.Context, part int, values func(*[]byte) bool, _ func([]byte)) error {
	var chunks [][]byte
	var c []byte
	for values(&c) {
		if len(c) > 0 {
			chunks = append(chunks, c)
		}
	}
	select {
	case f.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		defer func() { <-f.sem }()
		r := f.build(ctx, part, chunks)
		f.mu.Lock()
		f.results = append(f.results, r)
		f.mu.Unlock()
	}()
	return nil
}

func (f *buildFn) FinishBundle(ctx context.Context, emit func([]byte)) error {
	f.wg.Wait()
	f.mu.Lock()
	rs := f.results
	f.results = nil
	f.mu.Unlock()
	for _, r := range rs {
		b, err := json.Marshal(r)
		if err != nil {
			return err
		}
		emit(b)
	}
	return nil
}

// build builds partition part from its chunks and says how it went.
func (f *buildFn) build(ctx context.Context, part int, chunks [][]byte) result {
	res := result{Partition: part}
	d, err := inputOrder(chunks, f.Inputs)
	res.Input = len(d.recs)
	if err != nil {
		res.Err = err.Error()
		return res
	}
	name := bulk.PartitionFileName(part, f.Partitions)
	path := filepath.Join(f.Out, name)
	var tmpDir string
	if isRemote(f.Out) {
		if tmpDir, err = os.MkdirTemp("", "tabula-beam-"); err != nil {
			res.Err = err.Error()
			return res
		}
		defer os.RemoveAll(tmpDir)
		path = filepath.Join(tmpDir, name)
	}
	spec := bulk.PartitionSpec{Partition: part, Partitions: f.Partitions, Version: f.Version, Delta: f.DeltaOf != 0, BaseVersion: f.DeltaOf}
	popts := bulk.PartitionOptions{LastWins: f.LastWins, FingerprintBits: f.FingerprintBits,
		MaxValueBytes: f.MaxValueBytes, MPH: f.MPH, Workers: f.PartitionWorkers}
	info, err := bulk.BuildPartitionAt(ctx, path, d.recs, d.pos, spec, popts)
	if err == nil && tmpDir != "" {
		err = copyOut(ctx, path, joinPath(f.Out, name))
	}
	var de *bulk.DuplicateError
	switch {
	case errors.As(err, &de):
		res.Dups, res.DupCount = de.Dups, de.Count
	case err != nil:
		res.Err = err.Error()
	}
	res.Records = info.Records
	return res
}

// copyOut copies the local file src to dst on Beam's file system.
func copyOut(ctx context.Context, src, dst string) error {
	fs, err := filesystem.New(ctx, dst)
	if err != nil {
		return fmt.Errorf("beambuild: %s: %w", dst, err)
	}
	defer fs.Close()
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	w, err := fs.OpenWrite(ctx, dst)
	if err != nil {
		return fmt.Errorf("beambuild: write %s: %w", dst, err)
	}
	if _, err := io.Copy(w, in); err != nil {
		w.Close()
		return fmt.Errorf("beambuild: write %s: %w", dst, err)
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("beambuild: write %s: %w", dst, err)
	}
	return nil
}

// finishFn joins the partitions' results into the native builder's error,
// failing the pipeline, or accepts the build.
type finishFn struct {
	Run        string
	Inputs     []string
	Partitions int
}

func (f *finishFn) ProcessElement(_ int, values func(*[]byte) bool) error {
	errs := make([]error, f.Partitions)
	seen := make([]bool, f.Partitions)
	input := 0
	var b []byte
	for values(&b) {
		var r result
		if err := json.Unmarshal(b, &r); err != nil {
			return fmt.Errorf("beambuild: a partition's result: %w", err)
		}
		if r.Partition < 0 || r.Partition >= f.Partitions || seen[r.Partition] {
			return fmt.Errorf("beambuild: partition %d built twice or out of range", r.Partition)
		}
		seen[r.Partition] = true
		input += r.Input
		switch {
		case r.DupCount > 0:
			errs[r.Partition] = &bulk.DuplicateError{Dups: r.Dups, Count: r.DupCount}
		case r.Err != "":
			errs[r.Partition] = errors.New(r.Err)
		}
	}
	for i, ok := range seen {
		if !ok {
			errs[i] = fmt.Errorf("beambuild: partition %d was not built", i)
		}
	}
	if input == 0 {
		return fail(f.Run, fmt.Errorf("%w: %d input file(s) without a record", bulk.ErrEmptyInput, len(f.Inputs)))
	}
	if err := bulk.JoinPartitionErrors(errs, f.Inputs); err != nil {
		return fail(f.Run, err)
	}
	return nil
}

func init() {
	register.DoFn3x1[context.Context, int, func(int, []byte), error](&readFn{})
	register.DoFn4x1[context.Context, int, func(*[]byte) bool, func([]byte), error](&buildFn{})
	register.DoFn2x1[int, func(*[]byte) bool, error](&finishFn{})
	register.Function1x2(seedPartition)
	register.Emitter2[int, []byte]()
	register.Emitter1[[]byte]()
	register.Iter1[[]byte]()
}

package bulk

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/diskstore"
	"github.com/tabuladb/tabula/engines/vfs"
	"github.com/tabuladb/tabula/internal/keyspace"
)

func testSeed(t testing.TB) uint64 {
	if s := os.Getenv("TABULA_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	s := rand.Uint64()
	t.Logf("seed %d (rerun with TABULA_SEED=%d)", s, s)
	return s
}

// randomRecords returns n records with distinct random keys of 8..24 bytes
// and values of 0..maxVal bytes (fixed length if fixed).
func randomRecords(r *rand.Rand, n, maxVal int, fixed bool) []Record {
	seen := map[string]bool{}
	recs := make([]Record, 0, n)
	for len(recs) < n {
		k := make([]byte, 8+r.IntN(17))
		if fixed {
			k = make([]byte, 16)
		}
		for i := range k {
			k[i] = byte(r.Uint32())
		}
		if seen[string(k)] {
			continue
		}
		seen[string(k)] = true
		vl := r.IntN(maxVal + 1)
		if fixed {
			vl = maxVal
		}
		v := make([]byte, vl)
		for i := range v {
			v[i] = byte(r.Uint32())
		}
		recs = append(recs, Record{Key: k, Value: v})
	}
	return recs
}

// splitByPartition routes records as BuildTable does.
func splitByPartition(recs []Record, n int) [][]Record {
	out := make([][]Record, n)
	for _, r := range recs {
		p := keyspace.Index(keyspace.Hash(r.Key), n)
		out[p] = append(out[p], r)
	}
	return out
}

func absentKey(r *rand.Rand) []byte {
	k := make([]byte, 30) // longer than any present key
	for i := range k {
		k[i] = byte(r.Uint32())
	}
	return k
}

func TestPartitionRoundTrip(t *testing.T) {
	seed := testSeed(t)
	for _, tc := range []struct {
		name   string
		n      int
		fixed  bool
		fpBits int
		mmap   bool
	}{
		{"empty", 0, false, 0, true},
		{"one", 1, false, 0, true},
		{"two-fixed", 2, true, 0, false},
		{"var-mmap", 5000, false, 0, true},
		{"var-pread", 5000, false, 0, false},
		{"fixed-mmap", 5000, true, 0, true},
		{"fp16", 3000, false, 16, true},
		{"nofp", 3000, false, -1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, uint64(tc.n)))
			recs := randomRecords(r, tc.n, 40, tc.fixed)
			path := filepath.Join(t.TempDir(), "p.bulk")
			info, err := BuildPartition(context.Background(), path, recs, PartitionSpec{}, PartitionOptions{FingerprintBits: tc.fpBits})
			if err != nil {
				t.Fatal(err)
			}
			if info.Records != uint64(tc.n) || info.CRC != crcOf(readFile(t, path)) {
				t.Fatalf("info %+v (file crc %#x)", info, crcOf(readFile(t, path)))
			}
			f, err := Open(vfs.Default, path, OpenOptions{NoMmap: !tc.mmap})
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			st := f.Stats()
			if st.Records != uint64(tc.n) || st.FileBytes != info.FileBytes || st.IndexBytes != info.IndexBytes || st.Mapped != (tc.mmap && mmapSupported) {
				t.Fatalf("stats %+v, info %+v", st, info)
			}
			checkFile(t, f, recs, r)
			if err := f.Verify(context.Background()); err != nil {
				t.Fatal(err)
			}
			seen := 0
			if err := f.Scan(context.Background(), func(k, v []byte, del bool) error {
				seen++
				return nil
			}); err != nil || seen != tc.n {
				t.Fatalf("scan saw %d of %d: %v", seen, tc.n, err)
			}
		})
	}
}

type getter interface {
	AppendGet(dst, key []byte) ([]byte, bool, error)
	AppendGetBatch(dst []byte, keys [][]byte, vals [][]byte, found []bool) ([]byte, error)
}

// checkFile checks that every record reads back, absent keys do not, and
// a batch agrees.
func checkFile(t *testing.T, g getter, recs []Record, r *rand.Rand) {
	t.Helper()
	var buf []byte
	for _, rec := range recs {
		var ok bool
		var err error
		buf, ok, err = g.AppendGet(buf[:0], rec.Key)
		if err != nil || !ok || !bytes.Equal(buf, rec.Value) {
			t.Fatalf("get %x: %x %v %v, want %x", rec.Key, buf, ok, err, rec.Value)
		}
	}
	for i := 0; i < 200; i++ {
		if v, ok, err := g.AppendGet(nil, absentKey(r)); ok || err != nil {
			t.Fatalf("absent key found: %x %v", v, err)
		}
	}
	keys := [][]byte{absentKey(r)}
	want := []Record{{}}
	for i := 0; i < 50 && i < len(recs); i++ {
		j := r.IntN(len(recs))
		keys = append(keys, recs[j].Key)
		want = append(want, recs[j])
	}
	vals := make([][]byte, len(keys))
	found := make([]bool, len(keys))
	if _, err := g.AppendGetBatch(nil, keys, vals, found); err != nil {
		t.Fatal(err)
	}
	for i := range keys {
		if found[i] != (i > 0) || !bytes.Equal(vals[i], want[i].Value) {
			t.Fatalf("batch %d: %x %v, want %x", i, vals[i], found[i], want[i].Value)
		}
	}
}

// TestFalsePositiveRate measures how often an absent key passes the 8-bit
// fingerprint (and so costs a record read); the full key compare then
// rejects it, so none is ever served.
func TestFalsePositiveRate(t *testing.T) {
	seed := testSeed(t)
	r := rand.New(rand.NewPCG(seed, 9))
	recs := randomRecords(r, 20000, 8, false)
	path := filepath.Join(t.TempDir(), "p.bulk")
	if _, err := BuildPartition(context.Background(), path, recs, PartitionSpec{}, PartitionOptions{}); err != nil {
		t.Fatal(err)
	}
	f, err := Open(vfs.Default, path, OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const probes = 200000
	passed := 0
	for i := 0; i < probes; i++ {
		k := absentKey(r)
		h := keyHash(0, k)
		if f.fps[f.table.Lookup(h)] == byte(h) {
			passed++
		}
		if _, ok, err := f.AppendGet(nil, k); ok || err != nil {
			t.Fatalf("absent key served: %v", err)
		}
	}
	rate := float64(passed) / probes
	t.Logf("8-bit fingerprint false-positive rate on %d absent keys: %.4f%% (expected 1/256 = 0.3906%%); all rejected by the key compare", probes, 100*rate)
	if rate > 0.006 || rate < 0.002 {
		t.Fatalf("false-positive rate %.4f far from 1/256", rate)
	}
}

func TestDeterministicAndRouting(t *testing.T) {
	seed := testSeed(t)
	r := rand.New(rand.NewPCG(seed, 3))
	recs := randomRecords(r, 3000, 30, false)
	dir := t.TempDir()
	var lines strings.Builder
	for _, rec := range recs {
		fmt.Fprintf(&lines, "%s\t%s\n", base64.StdEncoding.EncodeToString(rec.Key), base64.StdEncoding.EncodeToString(rec.Value))
	}
	// The same records split over two files, and in one.
	all := lines.String()
	cut := strings.Index(all[len(all)/2:], "\n") + len(all)/2 + 1
	writeFile(t, filepath.Join(dir, "a.tsv"), all[:cut])
	writeFile(t, filepath.Join(dir, "b.tsv"), all[cut:])
	writeFile(t, filepath.Join(dir, "all.tsv"), all)
	var outs [][]PartitionInfo
	for i, o := range []BuildOptions{
		{Partitions: 4, Base64: true, Workers: 1},
		{Partitions: 4, Base64: true, Workers: 4, MemoryBudget: 4096}, // spills
	} {
		in := []string{filepath.Join(dir, "a.tsv"), filepath.Join(dir, "b.tsv")}
		if i == 1 {
			in = []string{filepath.Join(dir, "all.tsv")}
		}
		infos, err := BuildTable(context.Background(), in, filepath.Join(dir, fmt.Sprint("out", i)), o)
		if err != nil {
			t.Fatal(err)
		}
		outs = append(outs, infos)
	}
	parts := splitByPartition(recs, 4)
	for p := range 4 {
		a, b := readFile(t, outs[0][p].Path), readFile(t, outs[1][p].Path)
		if !bytes.Equal(a, b) {
			t.Fatalf("partition %d differs between builds", p)
		}
		f, err := Open(vfs.Default, outs[0][p].Path, OpenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if i, n := f.Partition(); i != p || n != 4 || f.Stats().Records != uint64(len(parts[p])) {
			t.Fatalf("partition %d: file says %d/%d with %d records, want %d", p, i, n, f.Stats().Records, len(parts[p]))
		}
		checkFile(t, f, parts[p], r)
		f.Close()
	}
	if _, err := os.Stat(filepath.Join(dir, "out1", ".spill")); !os.IsNotExist(err) {
		t.Fatalf("spill dir left behind: %v", err)
	}
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestFormats(t *testing.T) {
	dir := t.TempDir()
	want := map[string]string{"a": "1", "b,x": "two\tparts", "c": "", "ü": "\"q\""}
	inputs := map[Format]string{
		FormatTSV:   "a\t1\r\nb,x\ttwo\tparts\n\nc\t\nü\t\"q\"",
		FormatCSV:   "a,1\n\"b,x\",\"two\tparts\"\nc,\nü,\"\"\"q\"\"\"\n",
		FormatJSONL: `{"key":"a","value":"1"}` + "\n" + `{"key":"b,x","value":"two\tparts"}` + "\n\n" + `{"key":"c","value":""}` + "\n" + `{"key":"ü","value":"\"q\""}` + "\n",
	}
	for format, text := range inputs {
		t.Run(format.String(), func(t *testing.T) {
			in := filepath.Join(dir, "in."+format.String())
			writeFile(t, in, text)
			out := filepath.Join(dir, "out-"+format.String())
			infos, err := BuildTable(context.Background(), []string{in}, out, BuildOptions{Partitions: 1, Format: format})
			if err != nil {
				t.Fatal(err)
			}
			f, err := Open(vfs.Default, infos[0].Path, OpenOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if f.Stats().Records != uint64(len(want)) {
				t.Fatalf("%d records", f.Stats().Records)
			}
			for k, v := range want {
				got, ok, err := f.Get([]byte(k))
				if err != nil || !ok || string(got) != v {
					t.Fatalf("%q: %q %v %v, want %q", k, got, ok, err, v)
				}
			}
		})
	}
}

func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	build := func(text string, o BuildOptions) error {
		in := filepath.Join(dir, "in")
		writeFile(t, in, text)
		if o.Partitions == 0 {
			o.Partitions = 2
		}
		_, err := BuildTable(context.Background(), []string{in}, filepath.Join(dir, "out"), o)
		return err
	}
	in := filepath.Join(dir, "in")
	for _, tc := range []struct {
		text   string
		o      BuildOptions
		line   int64
		reason string
	}{
		{"a\t1\nnotab\n", BuildOptions{}, 2, "no tab"},
		{"a\t1\n\tv\n", BuildOptions{}, 2, "key of 0 bytes"},
		{"a\t1\nb\t!!\n", BuildOptions{Base64: true}, 1, "base64"},
		{"{\"key\":\"a\",\"value\":\"1\"}\n{\"key\":\"b\"}\n", BuildOptions{Format: FormatJSONL}, 2, "no \"value\""},
		{"{\"key\":\"a\",\"value\":\"1\",\"x\":1}\n", BuildOptions{Format: FormatJSONL}, 1, "unknown field"},
		{"{\"key\":\"a\",\"delete\":true}\n", BuildOptions{Format: FormatJSONL}, 1, "delete"},
		{"a,1\nb,2,3\n", BuildOptions{Format: FormatCSV}, 2, "3 fields"},
		{"a\t" + strings.Repeat("v", 11) + "\n", BuildOptions{Partition: PartitionOptions{MaxValueBytes: 10}}, 1, "value of 11 bytes"},
		{"a\t1\n" + strings.Repeat("k", 4097) + "\tv\n", BuildOptions{}, 2, "key of 4097"},
	} {
		err := build(tc.text, tc.o)
		var me *MalformedError
		if !errors.As(err, &me) || me.Pos.Line != tc.line || me.Pos.File != in || !strings.Contains(err.Error(), tc.reason) {
			t.Fatalf("%q: err %v, want malformed at line %d (%s)", tc.text, err, tc.line, tc.reason)
		}
	}
	for _, text := range []string{"", "\n\n\r\n"} {
		if err := build(text, BuildOptions{}); !errors.Is(err, ErrEmptyInput) {
			t.Fatalf("%q: err %v, want ErrEmptyInput", text, err)
		}
	}
	// Duplicates: an error naming them, or the last wins.
	text := "a\t1\nb\t2\na\t3\nc\t4\nb\t5\n"
	err := build(text, BuildOptions{})
	var de *DuplicateError
	if !errors.As(err, &de) || de.Count != 2 || !strings.Contains(err.Error(), in+":1 and "+in+":3") {
		t.Fatalf("err %v, want 2 duplicates with positions", err)
	}
	if err := build(text, BuildOptions{Partitions: 1, Partition: PartitionOptions{LastWins: true}}); err != nil {
		t.Fatal(err)
	}
	f, err := Open(vfs.Default, filepath.Join(dir, "out", PartitionFileName(0, 1)), OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for k, v := range map[string]string{"a": "3", "b": "5", "c": "4"} {
		if got, ok, err := f.Get([]byte(k)); string(got) != v || !ok || err != nil {
			t.Fatalf("%s: %q %v %v, want %q", k, got, ok, err, v)
		}
	}
	// BuildPartition refuses a key of another partition.
	if _, err := BuildPartition(context.Background(), filepath.Join(dir, "x"), []Record{{Key: []byte("a")}, {Key: []byte("b")}, {Key: []byte("c")}, {Key: []byte("d")}}, PartitionSpec{Partition: 0, Partitions: 2}, PartitionOptions{}); err == nil || !strings.Contains(err.Error(), "belongs to partition") {
		t.Fatalf("err %v", err)
	}
}

func TestDeltaOverlay(t *testing.T) {
	seed := testSeed(t)
	r := rand.New(rand.NewPCG(seed, 5))
	dir := t.TempDir()
	base := randomRecords(r, 2000, 20, false)
	var sb strings.Builder
	for _, rec := range base {
		fmt.Fprintf(&sb, "{\"key\":%q,\"value\":%q}\n", base64.StdEncoding.EncodeToString(rec.Key), base64.StdEncoding.EncodeToString(rec.Value))
	}
	writeFile(t, filepath.Join(dir, "base.jsonl"), sb.String())
	model := map[string][]byte{}
	for _, rec := range base {
		model[string(rec.Key)] = rec.Value
	}
	// Delta: change 100, delete 100, add 100.
	sb.Reset()
	for i := 0; i < 100; i++ {
		k := base[i].Key
		v := []byte(fmt.Sprint("changed", i))
		model[string(k)] = v
		fmt.Fprintf(&sb, "{\"key\":%q,\"value\":%q}\n", base64.StdEncoding.EncodeToString(k), base64.StdEncoding.EncodeToString(v))
	}
	for i := 100; i < 200; i++ {
		delete(model, string(base[i].Key))
		fmt.Fprintf(&sb, "{\"key\":%q,\"delete\":true}\n", base64.StdEncoding.EncodeToString(base[i].Key))
	}
	for _, rec := range randomRecords(r, 100, 20, false) {
		model[string(rec.Key)] = rec.Value
		fmt.Fprintf(&sb, "{\"key\":%q,\"value\":%q}\n", base64.StdEncoding.EncodeToString(rec.Key), base64.StdEncoding.EncodeToString(rec.Value))
	}
	writeFile(t, filepath.Join(dir, "delta.jsonl"), sb.String())
	const np = 3
	o := BuildOptions{Partitions: np, Format: FormatJSONL, Base64: true, Version: 7}
	bi, err := BuildTable(context.Background(), []string{filepath.Join(dir, "base.jsonl")}, filepath.Join(dir, "v7"), o)
	if err != nil {
		t.Fatal(err)
	}
	o.Version, o.DeltaOf = 8, 7
	di, err := BuildTable(context.Background(), []string{filepath.Join(dir, "delta.jsonl")}, filepath.Join(dir, "v8"), o)
	if err != nil {
		t.Fatal(err)
	}
	var modelRecs []Record
	for k, v := range model {
		modelRecs = append(modelRecs, Record{Key: []byte(k), Value: v})
	}
	parts := splitByPartition(modelRecs, np)
	for p := range np {
		bf, err := Open(vfs.Default, bi[p].Path, OpenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		df, err := Open(vfs.Default, di[p].Path, OpenOptions{NoMmap: true})
		if err != nil {
			t.Fatal(err)
		}
		if bv, ok := df.Delta(); !ok || bv != 7 || df.Version() != 8 {
			t.Fatalf("delta metadata %d %v %d", bv, ok, df.Version())
		}
		if _, err := NewOverlay(df, bf); err == nil {
			t.Fatal("overlay with a delta base accepted")
		}
		ov, err := NewOverlay(bf, df)
		if err != nil {
			t.Fatal(err)
		}
		checkFile(t, ov, parts[p], r)
		for i := 100; i < 200; i++ {
			if keyspace.Index(keyspace.Hash(base[i].Key), np) != p {
				continue
			}
			if v, ok, err := ov.AppendGet(nil, base[i].Key); ok || err != nil {
				t.Fatalf("deleted key served: %x %v", v, err)
			}
			if _, ok, _ := bf.AppendGet(nil, base[i].Key); !ok {
				t.Fatal("base lost a key")
			}
		}
		bf.Close()
		df.Close()
		if _, _, err := ov.AppendGet(nil, base[0].Key); !errors.Is(err, engines.ErrClosed) {
			t.Fatalf("read of closed overlay: %v", err)
		}
	}
}

func TestCorruption(t *testing.T) {
	seed := testSeed(t)
	r := rand.New(rand.NewPCG(seed, 6))
	recs := randomRecords(r, 500, 20, false)
	path := filepath.Join(t.TempDir(), "p.bulk")
	if _, err := BuildPartition(context.Background(), path, recs, PartitionSpec{}, PartitionOptions{}); err != nil {
		t.Fatal(err)
	}
	good := readFile(t, path)
	open := func(b []byte) (*File, error) { return OpenReaderAt(bytes.NewReader(b), int64(len(b)), nil) }
	// Truncations are refused at open.
	for _, n := range []int{0, 10, headerLen + footerLen - 1, len(good) / 2, len(good) - 1} {
		if _, err := open(good[:n]); !errors.Is(err, engines.ErrCorrupt) {
			t.Fatalf("truncated to %d: %v", n, err)
		}
	}
	// Another format version is refused with a clear error.
	bad := bytes.Clone(good)
	bad[len(bad)-16] = formatVersion + 1
	ft := bad[len(bad)-footerLen:]
	binary.LittleEndian.PutUint32(ft[180:], crcOf(ft[:180]))
	if _, err := open(bad); !errors.Is(err, ErrFormatVersion) {
		t.Fatalf("version 2: %v", err)
	}
	// A flipped bit anywhere: refused at open, or (records) an error on
	// the read or the scan — never a wrong value.
	for i := 0; i < 300; i++ {
		bad := bytes.Clone(good)
		off := r.IntN(len(bad))
		bad[off] ^= 1 << r.IntN(8)
		f, err := open(bad)
		if err != nil {
			if !errors.Is(err, engines.ErrCorrupt) {
				t.Fatalf("flip at %d: open error %v does not wrap ErrCorrupt", off, err)
			}
			continue
		}
		sawErr := false
		for _, rec := range recs {
			v, ok, err := f.AppendGet(nil, rec.Key)
			if err != nil {
				if !errors.Is(err, engines.ErrCorrupt) {
					t.Fatalf("flip at %d: get error %v", off, err)
				}
				sawErr = true
				continue
			}
			if ok && !bytes.Equal(v, rec.Value) {
				t.Fatalf("flip at %d: served a wrong value", off)
			}
		}
		if verr := f.Verify(context.Background()); verr == nil || !errors.Is(verr, engines.ErrCorrupt) {
			t.Fatalf("flip at %d (get error %v): Verify says %v", off, sawErr, verr)
		}
	}
}

func TestNoSpaceAndCrash(t *testing.T) {
	for _, sb := range []int{syncBytes, 64 << 10} {
		t.Run(fmt.Sprint("syncBytes=", sb), func(t *testing.T) {
			old := syncBytes
			syncBytes = sb // small: the records are synced as they go, too
			defer func() { syncBytes = old }()
			testNoSpaceAndCrash(t)
		})
	}
}

func testNoSpaceAndCrash(t *testing.T) {
	seed := testSeed(t)
	r := rand.New(rand.NewPCG(seed, 7))
	recs := randomRecords(r, 300, 2000, false) // > 1 MiB: several writes
	fs := vfs.NewMem()
	if err := fs.MkdirAll("/d", 0o755); err != nil {
		t.Fatal(err)
	}
	fs.SyncDir("/")
	opts := PartitionOptions{FS: fs}
	before := fs.Ops(vfs.OpAny)
	if _, err := BuildPartition(context.Background(), "/d/p.bulk", recs, PartitionSpec{}, opts); err != nil {
		t.Fatal(err)
	}
	ops := fs.Ops(vfs.OpAny) - before
	for k := 0; k < int(ops); k++ {
		fs := vfs.NewMem()
		fs.MkdirAll("/d", 0o755)
		fs.SyncDir("/")
		fs.InjectAfter(k, vfs.OpAny, vfs.ErrNoSpace)
		_, err := BuildPartition(context.Background(), "/d/p.bulk", recs, PartitionSpec{}, PartitionOptions{FS: fs})
		fs.ClearFaults()
		if err == nil {
			continue // the fault hit an operation whose failure is harmless
		}
		if names, _ := fs.List("/d"); len(names) != 0 {
			// A failed build leaves no file behind (the rename is last).
			if len(names) != 1 || names[0] != "p.bulk" {
				t.Fatalf("fault %d: %v left %v", k, err, names)
			}
		}
		fs.Crash()
		if _, err := fs.Stat("/d/p.bulk"); err == nil {
			f, err := Open(fs, "/d/p.bulk", OpenOptions{})
			if err != nil {
				t.Fatalf("fault %d: a file that survived a crash does not open: %v", k, err)
			}
			f.Close()
		}
	}
	// After a clean build and a crash the file is there and whole.
	fs.Crash()
	f, err := Open(fs, "/d/p.bulk", OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	checkFile(t, f, recs, r)
}

func TestCloseWhileReading(t *testing.T) {
	seed := testSeed(t)
	r := rand.New(rand.NewPCG(seed, 8))
	recs := randomRecords(r, 2000, 50, false)
	path := filepath.Join(t.TempDir(), "p.bulk")
	if _, err := BuildPartition(context.Background(), path, recs, PartitionSpec{}, PartitionOptions{}); err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 20; round++ {
		f, err := Open(vfs.Default, path, OpenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var buf []byte
				for i := 0; ; i++ {
					rec := recs[(i*7+g)%len(recs)]
					var ok bool
					var err error
					buf, ok, err = f.AppendGet(buf[:0], rec.Key)
					if errors.Is(err, engines.ErrClosed) {
						return
					}
					if err != nil || !ok || !bytes.Equal(buf, rec.Value) {
						t.Errorf("get: %v %v", ok, err)
						return
					}
				}
			}()
		}
		for i := 0; i < 1000*round; i++ {
			f.Stats()
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if err := f.Close(); err != nil {
			t.Fatal("second close:", err)
		}
	}
}

func FuzzOpen(f *testing.F) {
	r := rand.New(rand.NewPCG(1, 2))
	dir := f.TempDir()
	for i, n := range []int{0, 1, 3, 40} {
		path := filepath.Join(dir, fmt.Sprint(i))
		spec := PartitionSpec{}
		recs := randomRecords(r, n, 10, i == 2)
		if i == 3 {
			spec.Delta = true
			recs[0].Value, recs[0].Delete = nil, true
		}
		if _, err := BuildPartition(context.Background(), path, recs, spec, PartitionOptions{}); err != nil {
			f.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		file, err := OpenReaderAt(bytes.NewReader(b), int64(len(b)), nil)
		if err != nil {
			if !errors.Is(err, engines.ErrCorrupt) && !errors.Is(err, ErrFormatVersion) {
				t.Fatalf("open error wraps neither ErrCorrupt nor ErrFormatVersion: %v", err)
			}
			return
		}
		defer file.Close()
		n := 0
		err = file.Scan(context.Background(), func(k, v []byte, del bool) error {
			n++
			if _, _, err := file.AppendGet(nil, k); err != nil && !errors.Is(err, engines.ErrCorrupt) {
				t.Fatalf("get: %v", err)
			}
			return nil
		})
		if err != nil && !errors.Is(err, engines.ErrCorrupt) {
			t.Fatalf("scan: %v", err)
		}
		file.AppendGet(nil, []byte("absent"))
		if err := file.Verify(context.Background()); err != nil && !errors.Is(err, engines.ErrCorrupt) {
			t.Fatalf("verify: %v", err)
		}
	})
}

func TestCRCCombine(t *testing.T) {
	r := rand.New(rand.NewPCG(testSeed(t), 11))
	b := make([]byte, 1<<16)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	for range 200 {
		i := r.IntN(len(b))
		j := i + r.IntN(len(b)-i+1)
		if got, want := crcCombine(crcOf(b[:i]), crcOf(b[i:j]), uint64(j-i)), crcOf(b[:j]); got != want {
			t.Fatalf("combine at %d..%d: %#x, want %#x", i, j, got, want)
		}
	}
	big := make([]byte, 3<<20+5)
	if got, want := crcCombine(crcOf(b), crcOf(big), uint64(len(big))), crcOf(append(slices.Clone(b), big...)); got != want {
		t.Fatalf("combine of %d bytes: %#x, want %#x", len(big), got, want)
	}
}

// TestWindows builds with output windows of a few records each: the bytes
// are those of a one-window build, and they read back, with and without
// duplicates to drop.
func TestWindows(t *testing.T) {
	seed := testSeed(t)
	for _, tc := range []struct {
		name  string
		fixed bool
		dups  bool
	}{{"fixed", true, false}, {"var", false, false}, {"var-dups", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 12))
			recs := randomRecords(r, 3000, 50, tc.fixed)
			want := recs
			if tc.dups {
				// Every 10th key again, with a new value: the last wins.
				for i := 0; i < len(want); i += 10 {
					recs = append(recs, Record{Key: want[i].Key, Value: []byte(fmt.Sprint("new", i))})
				}
				want = slices.Clone(want)
				for i := 0; i < len(want); i += 10 {
					want[i].Value = []byte(fmt.Sprint("new", i))
				}
			}
			dir := t.TempDir()
			build := func(name string) []byte {
				path := filepath.Join(dir, name)
				if _, err := BuildPartition(context.Background(), path, recs, PartitionSpec{}, PartitionOptions{LastWins: tc.dups}); err != nil {
					t.Fatal(err)
				}
				return readFile(t, path)
			}
			one := build("one")
			old := windowBytes
			windowBytes = 1000
			many := build("many")
			windowBytes = old
			if !bytes.Equal(one, many) {
				t.Fatal("a build in small windows differs from one in a single window")
			}
			f, err := Open(vfs.Default, filepath.Join(dir, "many"), OpenOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			checkFile(t, f, want, r)
		})
	}
}

// TestWorkers: a build by several workers, in many windows, gives the same
// bytes as one by one worker, for fixed- and variable-length records.
func TestWorkers(t *testing.T) {
	r := rand.New(rand.NewPCG(testSeed(t), 14))
	for _, fixed := range []bool{true, false} {
		recs := randomRecords(r, 200000, 40, fixed)
		dir := t.TempDir()
		build := func(name string, workers int) []byte {
			path := filepath.Join(dir, name)
			if _, err := BuildPartition(context.Background(), path, recs, PartitionSpec{}, PartitionOptions{Workers: workers}); err != nil {
				t.Fatal(err)
			}
			return readFile(t, path)
		}
		one := build("one", 1)
		old := windowBytes
		windowBytes = 1 << 20
		for _, w := range []int{2, 3} {
			if got := build(fmt.Sprint("w", w), w); !bytes.Equal(got, one) {
				windowBytes = old
				t.Fatalf("fixed %v: %d workers built other bytes than one", fixed, w)
			}
		}
		windowBytes = old
	}
}

// TestRecordEncoder: the encoder's shortcut for records of one key and one
// value length writes diskstore's encoding.
func TestRecordEncoder(t *testing.T) {
	r := rand.New(rand.NewPCG(testSeed(t), 15))
	for _, kv := range [][2]int{{1, 0}, {16, 64}, {7, 1}, {300, 5000}} {
		recs := make([]Record, 50)
		var lens recordLens
		for i := range recs {
			recs[i] = Record{Key: make([]byte, kv[0]), Value: make([]byte, kv[1])}
			for j := range recs[i].Key {
				recs[i].Key[j] = byte(r.Uint32())
			}
			for j := range recs[i].Value {
				recs[i].Value[j] = byte(r.Uint32())
			}
			lens.add(&recs[i])
		}
		e := newRecordEncoder(recs, lens, lens.first, nil)
		if e.tmpl == nil {
			t.Fatalf("key %d value %d bytes: no template", kv[0], kv[1])
		}
		buf := make([]byte, len(recs)*int(lens.first))
		list := make([]uint64, len(recs))
		for i := range list {
			list[i] = uint64(i)<<32 | uint64(len(recs)-1-i) // record i in slot n-1-i
		}
		if err := e.fill(context.Background(), buf, 0, list); err != nil {
			t.Fatal(err)
		}
		var want []byte
		for i := range recs {
			want, _ = diskstore.AppendPutRecord(want, recs[len(recs)-1-i].Key, recs[len(recs)-1-i].Value, 0)
		}
		if !bytes.Equal(buf, want) {
			t.Fatalf("key %d value %d bytes: the encoder differs from diskstore", kv[0], kv[1])
		}
	}
}

// TestOldFormatRefused: a file of format version 1 (before MPH parts) is
// refused with ErrFormatVersion, not misread.
func TestOldFormatRefused(t *testing.T) {
	r := rand.New(rand.NewPCG(testSeed(t), 13))
	path := filepath.Join(t.TempDir(), "p.bulk")
	if _, err := BuildPartition(context.Background(), path, randomRecords(r, 100, 10, false), PartitionSpec{}, PartitionOptions{}); err != nil {
		t.Fatal(err)
	}
	b := readFile(t, path)
	binary.LittleEndian.PutUint32(b[8:], 1)
	binary.LittleEndian.PutUint32(b[12:], crcOf(b[:12]))
	ft := b[len(b)-footerLen:]
	binary.LittleEndian.PutUint32(ft[176:], 1)
	binary.LittleEndian.PutUint32(ft[180:], crcOf(ft[:180]))
	if _, err := OpenReaderAt(bytes.NewReader(b), int64(len(b)), nil); !errors.Is(err, ErrFormatVersion) {
		t.Fatalf("version 1 file: %v, want ErrFormatVersion", err)
	}
}

package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tabuladb/tabula/engines/point"
)

func init() {
	register(suite{
		name:  "diskstore",
		about: "point engine on the SSD disk store vs badger (LSM and value-log profiles), pebble, bbolt",
		run:   runDiskstore,
	})
	register(suite{
		name:  "diskstore-child",
		about: "(internal) diskstore's crash test: loads a store, keeps writing until SIGKILLed",
		run:   runDiskstoreChild,
	})
}

const dsKeySize = 16

// dsConfig is what both the suite and its crash child need to rebuild the
// same keys and values.
type dsConfig struct {
	keys        int
	valueSize   int
	batch       int
	goroutines  int
	seed        uint64
	oursStorage string
}

// dsData is the key set and a pool values are cut from.
type dsData struct {
	cfg  dsConfig
	keys [][]byte // 16 random bytes each, distinct
	pool []byte   // random bytes; a value is a valueSize window of it
}

func newDSData(cfg dsConfig) *dsData {
	rng := rand.New(rand.NewPCG(cfg.seed, 2))
	d := &dsData{cfg: cfg}
	backing := make([]byte, cfg.keys*dsKeySize)
	for i := 0; i < len(backing); i += 8 {
		v := rng.Uint64()
		for j := range 8 {
			backing[i+j] = byte(v >> (8 * j))
		}
	}
	d.keys = make([][]byte, cfg.keys)
	for i := range d.keys {
		d.keys[i] = backing[i*dsKeySize : (i+1)*dsKeySize : (i+1)*dsKeySize]
	}
	// 2^64 random 16-byte keys: a duplicate among 1M has probability ~1e-27.
	// Random (incompressible) values, so compression neither helps nor
	// hurts anyone; a 1 MiB pool keeps them out of the heap.
	d.pool = make([]byte, 1<<20+cfg.valueSize)
	for i := 0; i+8 <= len(d.pool); i += 8 {
		v := rng.Uint64()
		for j := range 8 {
			d.pool[i+j] = byte(v >> (8 * j))
		}
	}
	return d
}

// value returns version ver of key i's value: a window of the pool.
func (d *dsData) value(i int, ver uint64) []byte {
	off := fmix64(uint64(i)<<8|ver) & (1<<20 - 1)
	return d.pool[off : off+uint64(d.cfg.valueSize) : off+uint64(d.cfg.valueSize)]
}

// liveBytes is the key and value bytes of the live records.
func (d *dsData) liveBytes() int64 { return int64(d.cfg.keys) * int64(dsKeySize+d.cfg.valueSize) }

// xorshift is a goroutine's cheap random source.
type xorshift uint64

func (x *xorshift) next() uint64 {
	*x ^= *x << 13
	*x ^= *x >> 7
	*x ^= *x << 17
	return uint64(*x)
}

func newXorshift(seed uint64, worker int) xorshift {
	return xorshift(fmix64(seed+uint64(worker)*0x9E3779B97F4A7C15) | 1)
}

// firstErr keeps the first error of several goroutines.
type firstErr struct {
	once   sync.Once
	failed atomic.Bool
	err    error // read after the goroutines are done
}

func (f *firstErr) set(err error) {
	if err != nil {
		f.once.Do(func() { f.err = err; f.failed.Store(true) })
	}
}

// writeBatches writes version ver of the keys idx names, in batches of
// cfg.batch through putBatch, split among cfg.goroutines goroutines, and
// returns records per second.
func writeBatches(s dsStore, d *dsData, idx []int, ver uint64) (float64, error) {
	g := d.cfg.goroutines
	var wg sync.WaitGroup
	var fe firstErr
	t0 := time.Now()
	for w := range g {
		part := idx[len(idx)*w/g : len(idx)*(w+1)/g]
		wg.Add(1)
		go func() {
			defer wg.Done()
			keys := make([][]byte, 0, d.cfg.batch)
			vals := make([][]byte, 0, d.cfg.batch)
			for len(part) > 0 && !fe.failed.Load() {
				n := min(d.cfg.batch, len(part))
				keys, vals = keys[:0], vals[:0]
				for _, i := range part[:n] {
					keys = append(keys, d.keys[i])
					vals = append(vals, d.value(i, ver))
				}
				part = part[n:]
				fe.set(s.putBatch(keys, vals))
			}
		}()
	}
	wg.Wait()
	return float64(len(idx)) / time.Since(t0).Seconds(), fe.err
}

// runTimed runs op in cfg.goroutines goroutines for dur and returns
// operations per second (op returns how many operations it did).
func runTimed(g int, dur time.Duration, seed uint64, op func(x *xorshift) (int, error)) (float64, error) {
	var stop atomic.Bool
	var total atomic.Int64
	var wg sync.WaitGroup
	var fe firstErr
	t0 := time.Now()
	timer := time.AfterFunc(dur, func() { stop.Store(true) })
	defer timer.Stop()
	for w := range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := newXorshift(seed, w)
			n := 0
			for !stop.Load() {
				k, err := op(&x)
				if err != nil {
					fe.set(err)
					stop.Store(true)
				}
				n += k
			}
			total.Add(int64(n))
		}()
	}
	wg.Wait()
	return float64(total.Load()) / time.Since(t0).Seconds(), fe.err
}

func errMissing(store string, key []byte) error {
	return fmt.Errorf("%s: key %x missing", store, key)
}

// readOne reads a random key and checks it is there with a whole value.
func readOne(name string, s dsStore, d *dsData, x *xorshift) error {
	k := d.keys[x.next()>>8%uint64(len(d.keys))]
	v, ok, err := s.get(k)
	if err != nil {
		return err
	}
	if !ok {
		return errMissing(name, k)
	}
	if len(v) != d.cfg.valueSize {
		return fmt.Errorf("%s: key %x: value of %d bytes, want %d", name, k, len(v), d.cfg.valueSize)
	}
	return nil
}

// warmCache reads every file under dir, so the store's files are in the page
// cache ("values in page cache").
func warmCache(dir string) error {
	buf := make([]byte, 1<<20)
	return filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil || !de.Type().IsRegular() {
			return err
		}
		f, err := os.Open(p)
		if errors.Is(err, fs.ErrNotExist) { // compacted away meanwhile
			return nil
		}
		if err != nil {
			return err
		}
		_, err = io.CopyBuffer(io.Discard, struct{ io.Reader }{f}, buf)
		return errors.Join(err, f.Close())
	})
}

// dropCache writes back and evicts dir's files from the page cache (fsync,
// then posix_fadvise DONTNEED), so a reopen reads from the disk as after a
// machine crash, and /proc/self/io's read_bytes counts what it reads. Only
// the store's own files are evicted; nothing else on the shared box is.
func dropCache(dir string) error {
	return filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil || !de.Type().IsRegular() {
			return err
		}
		f, err := os.Open(p)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		err = f.Sync()
		if err == nil {
			err = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
		}
		return errors.Join(err, f.Close())
	})
}

// diskUsage is the bytes allocated to dir's files (du).
func diskUsage(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) { // a file the store just deleted
				return nil
			}
			return err
		}
		if !de.Type().IsRegular() {
			return nil
		}
		fi, err := de.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			n += st.Blocks * 512
		} else {
			n += fi.Size()
		}
		return nil
	})
	return n, err
}

// procIO is this process's read counters from /proc/self/io: rchar (bytes
// asked of read syscalls, cached or not) and read_bytes (bytes fetched from
// the block device, including page faults on mmapped files).
func procIO() (rchar, readBytes int64, err error) {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		switch k {
		case "rchar":
			rchar = n
		case "read_bytes":
			readBytes = n
		}
	}
	return rchar, readBytes, nil
}

func dsMedian(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func newTempDir(name string) (string, error) {
	return os.MkdirTemp("", "tabula-bench-diskstore-"+name+"-")
}

// dsRound is one contender's throughput results in one round.
type dsRound struct {
	load, reads, mixed, batch, loop float64
	settle                          time.Duration // idle wait after the load
}

// cpuTime is this process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// settle waits until the process is idle (under 10% of a core over one
// second) or limit has passed, and returns how long it waited.
func settle(limit time.Duration) time.Duration {
	t0 := time.Now()
	for time.Since(t0) < limit {
		c0, w0 := cpuTime(), time.Now()
		time.Sleep(time.Second) // the sampling period of the idle condition
		if float64(cpuTime()-c0) < 0.1*float64(time.Since(w0)) {
			break
		}
	}
	return time.Since(t0)
}

// runThroughput: fresh store, load, reads, BatchGet vs loop, 90/10 mixed.
func runThroughput(k dsKind, d *dsData, readDur, mixedDur, batchDur, settleMax time.Duration, seed uint64, log io.Writer) (r dsRound, err error) {
	dir, err := newTempDir(k.name)
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(dir)
	s, err := k.open(dir)
	if err != nil {
		return r, fmt.Errorf("open %s: %w", k.name, err)
	}
	defer func() { err = errors.Join(err, s.close()) }()
	g := d.cfg.goroutines

	all := make([]int, len(d.keys))
	for i := range all {
		all[i] = i
	}
	// Load in a random order (the keys are random anyway).
	rand.New(rand.NewPCG(seed, 3)).Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	fmt.Fprintf(log, "diskstore: %s load\n", k.name)
	if r.load, err = writeBatches(s, d, all, 0); err != nil {
		return r, fmt.Errorf("%s load: %w", k.name, err)
	}

	// Let the load's background work (flushes, compactions) finish, so the
	// reads measure the store, not its backlog: wait until the process uses
	// under 10% of a core for a second, at most settleMax.
	fmt.Fprintf(log, "diskstore: %s settle\n", k.name)
	r.settle = settle(settleMax)
	if err := warmCache(dir); err != nil {
		return r, err
	}
	read := func(x *xorshift) (int, error) { return 1, readOne(k.name, s, d, x) }
	// Untimed warm-up: the store's own caches, the Go heap.
	if _, err := runTimed(g, readDur/4, seed, read); err != nil {
		return r, err
	}
	fmt.Fprintf(log, "diskstore: %s reads\n", k.name)
	if r.reads, err = runTimed(g, readDur, seed+1, read); err != nil {
		return r, err
	}

	fmt.Fprintf(log, "diskstore: %s batch-get\n", k.name)
	const nb = 64
	pick := func(x *xorshift, keys [][]byte) {
		for i := range keys {
			keys[i] = d.keys[x.next()>>8%uint64(len(d.keys))]
		}
	}
	multi := func(loop bool) func(x *xorshift) (int, error) {
		return func(x *xorshift) (int, error) {
			var keys [nb][]byte
			pick(x, keys[:])
			var n int
			var err error
			if loop {
				n, err = loopGets(s, keys[:])
			} else {
				n, err = s.getMulti(keys[:])
			}
			if err == nil && n != nb {
				err = fmt.Errorf("%s: %d of %d keys found", k.name, n, nb)
			}
			return nb, err
		}
	}
	if r.batch, err = runTimed(g, batchDur, seed+2, multi(false)); err != nil {
		return r, err
	}
	if r.loop, err = runTimed(g, batchDur, seed+2, multi(true)); err != nil {
		return r, err
	}

	fmt.Fprintf(log, "diskstore: %s 90/10\n", k.name)
	mixed := func(x *xorshift) (int, error) {
		v := x.next()
		if v%100 < 90 {
			return 1, readOne(k.name, s, d, x)
		}
		i := int(v >> 8 % uint64(len(d.keys)))
		return 1, s.put(d.keys[i], d.value(i, 1+v>>60))
	}
	if r.mixed, err = runTimed(g, mixedDur, seed+4, mixed); err != nil {
		return r, err
	}
	return r, nil
}

// dsCrash is one contender's crash, recovery, space and GC-latency results.
type dsCrash struct {
	skipped           string // why the crash part was skipped
	reopen            time.Duration
	rchar, readBytes  int64
	missing, sampled  int
	spaceStart        float64 // du / live bytes right after the overwrite
	spaceEnd          float64 // ... at the end of the GC window
	spaceReachedAfter time.Duration
	p999, p99, p50    time.Duration
	gcReads           int
}

// runCrash: a child process loads the store and keeps writing synced
// single records until SIGKILLed; the parent evicts the store's files from
// the page cache, reopens it (timed, /proc/self/io read counters before and
// after), checks a sample of keys, overwrites 50% of the keys and reads
// random keys for gcWindow while the store reclaims space on its own.
func runCrash(k dsKind, d *dsData, killAfter, gcWindow time.Duration, seed uint64, log io.Writer) (c dsCrash, err error) {
	dir, err := newTempDir(k.name)
	if err != nil {
		return c, err
	}
	defer os.RemoveAll(dir)

	var s dsStore
	if k.durable {
		fmt.Fprintf(log, "diskstore: %s crash child load\n", k.name)
		if err := runChildAndKill(k.name, dir, d.cfg, killAfter); err != nil {
			return c, fmt.Errorf("%s crash child: %w", k.name, err)
		}
		if err := dropCache(dir); err != nil {
			return c, err
		}
		runtime.GC()
		rc0, rb0, err := procIO()
		if err != nil {
			return c, err
		}
		t0 := time.Now()
		s, err = k.open(dir)
		c.reopen = time.Since(t0)
		if err != nil {
			return c, fmt.Errorf("reopen %s after crash: %w", k.name, err)
		}
		rc1, rb1, err := procIO()
		if err != nil {
			return c, errors.Join(err, s.close())
		}
		c.rchar, c.readBytes = rc1-rc0, rb1-rb0
		// Every loaded key must be there (the load's batches were synced).
		x := newXorshift(seed, 99)
		c.sampled = min(1000, len(d.keys))
		for range c.sampled {
			_, ok, err := s.get(d.keys[x.next()>>8%uint64(len(d.keys))])
			if err != nil {
				return c, errors.Join(err, s.close())
			}
			if !ok {
				c.missing++
			}
		}
	} else {
		c.skipped = "not durable"
		if s, err = k.open(dir); err != nil {
			return c, err
		}
		all := make([]int, len(d.keys))
		for i := range all {
			all[i] = i
		}
		if _, err := writeBatches(s, d, all, 0); err != nil {
			return c, errors.Join(err, s.close())
		}
	}
	defer func() { err = errors.Join(err, s.close()) }()

	// Overwrite a random half of the keys.
	half := rand.New(rand.NewPCG(seed, 5)).Perm(len(d.keys))[:len(d.keys)/2]
	fmt.Fprintf(log, "diskstore: %s overwrite 50%%\n", k.name)
	if _, err := writeBatches(s, d, half, 2); err != nil {
		return c, fmt.Errorf("%s overwrite: %w", k.name, err)
	}
	live := float64(d.liveBytes())
	du, err := diskUsage(dir)
	if err != nil {
		return c, err
	}
	c.spaceStart = float64(du) / live

	// The GC window: readers record every Get's latency while the store
	// reclaims space on its own (badger-vlog: its documented GC loop).
	fmt.Fprintf(log, "diskstore: %s GC window %v\n", k.name, gcWindow)
	var stop atomic.Bool
	var wg sync.WaitGroup
	var fe firstErr
	lats := make([][]time.Duration, d.cfg.goroutines)
	for w := range lats {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := newXorshift(seed+7, w)
			l := make([]time.Duration, 0, 1<<20)
			for !stop.Load() {
				t := time.Now()
				if err := readOne(k.name, s, d, &x); err != nil {
					fe.set(err)
					break
				}
				l = append(l, time.Since(t))
			}
			lats[w] = l
		}()
	}
	gc, hasGC := s.(dsBackgroundGC)
	start := time.Now()
	c.spaceReachedAfter = -1
	for time.Since(start) < gcWindow && !fe.failed.Load() {
		if hasGC {
			gc.gcStep()
		}
		du, err := diskUsage(dir)
		if err != nil {
			fe.set(err)
			break
		}
		c.spaceEnd = float64(du) / live
		if c.spaceEnd <= 1.15 && c.spaceReachedAfter < 0 {
			c.spaceReachedAfter = time.Since(start)
		}
		time.Sleep(time.Second) // sampling period, not a wait for a condition
	}
	stop.Store(true)
	wg.Wait()
	if fe.err != nil {
		return c, fe.err
	}
	all := slices.Concat(lats...)
	slices.Sort(all)
	c.gcReads = len(all)
	if n := len(all); n > 0 {
		c.p50, c.p99, c.p999 = all[n/2], all[n*99/100], all[n*999/1000]
	}
	return c, nil
}

// runChildAndKill starts this binary as "diskstore-child" on dir, waits for
// it to finish loading, lets it write for killAfter, and SIGKILLs it.
func runChildAndKill(store, dir string, cfg dsConfig, killAfter time.Duration) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(exe, "diskstore-child",
		"-store", store, "-dir", dir,
		"-keys", strconv.Itoa(cfg.keys), "-value-size", strconv.Itoa(cfg.valueSize),
		"-batch", strconv.Itoa(cfg.batch), "-goroutines", strconv.Itoa(cfg.goroutines),
		"-seed", strconv.FormatUint(cfg.seed, 10), "-ours-storage", cfg.oursStorage)
	cmd.Stderr = os.Stderr
	// If the suite dies first, the child must not write on forever.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	sc := bufio.NewScanner(out)
	loaded := false
	for sc.Scan() {
		if sc.Text() == "loaded" {
			loaded = true
			break
		}
	}
	if !loaded {
		return errors.Join(errors.New("child exited before it finished loading"), cmd.Wait())
	}
	// Let it run a stream of synced single writes, then crash it mid-stream.
	time.Sleep(killAfter)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	go io.Copy(io.Discard, out)
	err = cmd.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signaled() {
		return nil
	}
	return fmt.Errorf("child did not die of SIGKILL: %v", err)
}

// runDiskstoreChild loads a store, prints "loaded", then overwrites random
// keys one synced write at a time until it is killed (or -max-run passes;
// it then exits without closing the store).
func runDiskstoreChild(out io.Writer, args []string) error {
	fs := flag.NewFlagSet("diskstore-child", flag.ContinueOnError)
	var cfg dsConfig
	store := fs.String("store", "", "contender name")
	dir := fs.String("dir", "", "store directory")
	fs.IntVar(&cfg.keys, "keys", 1_000_000, "keys")
	fs.IntVar(&cfg.valueSize, "value-size", 1024, "value bytes")
	fs.IntVar(&cfg.batch, "batch", 1000, "records per load batch")
	fs.IntVar(&cfg.goroutines, "goroutines", 2, "goroutines")
	fs.Uint64Var(&cfg.seed, "seed", 1, "seed")
	fs.StringVar(&cfg.oursStorage, "ours-storage", "ssd", "point engine Storage")
	maxRun := fs.Duration("max-run", 5*time.Minute, "stop writing after this long if not killed")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var kind *dsKind
	for _, k := range dsKinds(cfg.oursStorage) {
		if k.name == *store {
			kind = &k
		}
	}
	if kind == nil || *dir == "" {
		return fmt.Errorf("need -dir and -store (one of the contenders), got %q", *store)
	}
	d := newDSData(cfg)
	s, err := kind.open(*dir)
	if err != nil {
		return err
	}
	all := make([]int, len(d.keys))
	for i := range all {
		all[i] = i
	}
	if _, err := writeBatches(s, d, all, 0); err != nil {
		return err
	}
	fmt.Fprintln(out, "loaded")
	// Bounded in case nobody kills it.
	_, err = runTimed(cfg.goroutines, *maxRun, cfg.seed+11, func(x *xorshift) (int, error) {
		v := x.next()
		i := int(v >> 8 % uint64(len(d.keys)))
		return 1, s.put(d.keys[i], d.value(i, 1))
	})
	return err
}

func runDiskstore(out io.Writer, args []string) error {
	fs := flag.NewFlagSet("diskstore", flag.ContinueOnError)
	var cfg dsConfig
	fs.IntVar(&cfg.keys, "keys", 1_000_000, "keys (16-byte random keys); 1M takes ~17 min on the 2-core dev box, 400k ~7 min")
	fs.IntVar(&cfg.valueSize, "value-size", 1024, "value bytes")
	fs.IntVar(&cfg.batch, "batch", 1000, "records per load/overwrite batch (one synced commit each)")
	fs.IntVar(&cfg.goroutines, "goroutines", 2, "goroutines per workload")
	fs.StringVar(&cfg.oursStorage, "ours-storage", "ssd", `point engine Storage for ours ("memory" exercises the harness before the disk store exists)`)
	var (
		rounds    = fs.Int("rounds", 2, "throughput rounds (fresh store each); the contender order reverses every other round")
		readDur   = fs.Duration("read-time", 3*time.Second, "random-read run length")
		mixedDur  = fs.Duration("mixed-time", 3*time.Second, "90/10 run length")
		batchDur  = fs.Duration("batch-time", 2*time.Second, "BatchGet and Get-loop run length, each")
		killAfter = fs.Duration("kill-after", time.Second, "crash test: synced single writes the child does after loading before SIGKILL")
		gcWindow  = fs.Duration("gc-window", 15*time.Second, "time the store gets to reclaim space after the 50% overwrite (reads measured meanwhile)")
		only      = fs.String("stores", "", "comma-separated contenders to run (default all: tabula,badger,badger-vlog,pebble,bbolt)")
		settleMax = fs.Duration("settle", 30*time.Second, "after the load, wait at most this long for the store's background work to finish (process idle) before the reads")
		noCrash   = fs.Bool("no-crash", false, "skip the crash/recovery, space and GC-latency phase")
		seedArg   = fs.Uint64("seed", 0, "seed (0: random)")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.seed = *seedArg
	if cfg.seed == 0 {
		cfg.seed = rand.Uint64()
	}
	log := os.Stderr
	t0 := time.Now()

	kinds := dsKinds(cfg.oursStorage)
	if *only != "" {
		want := strings.Split(*only, ",")
		kinds = slices.DeleteFunc(kinds, func(k dsKind) bool { return !slices.Contains(want, k.name) })
	}
	// Is our storage there yet?
	haveOurs := false
	if i := slices.IndexFunc(kinds, func(k dsKind) bool { return k.name == "tabula" }); i >= 0 {
		dir, err := newTempDir("probe")
		if err != nil {
			return err
		}
		s, err := kinds[i].open(dir)
		switch {
		case errors.Is(err, point.ErrStorageUnavailable):
			fmt.Fprintf(out, "# ours: storage %s not available yet (%v); running the peers only (-ours-storage memory exercises ours)\n", cfg.oursStorage, err)
			kinds = slices.Delete(kinds, i, i+1)
		case err != nil:
			os.RemoveAll(dir)
			return fmt.Errorf("open ours (storage %q): %w", cfg.oursStorage, err)
		default:
			haveOurs = true
			if err := s.close(); err != nil {
				return err
			}
		}
		os.RemoveAll(dir)
	}

	fmt.Fprintf(out, "# diskstore: %d keys (16-byte random), %d-byte random values (%.0f MiB live), %d goroutines, GOMAXPROCS %d, %d rounds, seed %d (rerun with -seed %d)\n",
		cfg.keys, cfg.valueSize, float64(cfg.keys)*float64(dsKeySize+cfg.valueSize)/(1<<20), cfg.goroutines, runtime.GOMAXPROCS(0), *rounds, cfg.seed, cfg.seed)
	fmt.Fprintf(out, "# durability: load and overwrite = %d-record batches, one synced commit each; 90/10 writes = one synced write per op; reads copy the value out\n", cfg.batch)
	for _, k := range kinds {
		fmt.Fprintf(out, "# %s: %s\n", k.name, k.settings)
	}
	fmt.Fprintf(out, "# temp dirs under %s\n", os.TempDir())

	d := newDSData(cfg)
	names := make([]string, len(kinds))
	for i, k := range kinds {
		names[i] = k.name
	}
	res := map[string][]dsRound{}
	for r := range *rounds {
		order := slices.Clone(kinds)
		if r%2 == 1 {
			slices.Reverse(order) // ABAB: no contender always runs first
		}
		for _, k := range order {
			fmt.Fprintf(log, "diskstore: round %d/%d %s (%v elapsed)\n", r+1, *rounds, k.name, time.Since(t0).Round(time.Second))
			rr, err := runThroughput(k, d, *readDur, *mixedDur, *batchDur, *settleMax, cfg.seed+uint64(r)*100, log)
			if err != nil {
				return err
			}
			res[k.name] = append(res[k.name], rr)
			runtime.GC()
		}
	}
	med := func(name string, f func(dsRound) float64) float64 {
		var xs []float64
		for _, r := range res[name] {
			xs = append(xs, f(r))
		}
		return dsMedian(xs)
	}
	type metric struct {
		name string
		f    func(dsRound) float64
		unit string
	}
	metrics := []metric{
		{"load", func(r dsRound) float64 { return r.load }, "records/s"},
		{"reads", func(r dsRound) float64 { return r.reads }, "ops/s"},
		{"90/10", func(r dsRound) float64 { return r.mixed }, "ops/s"},
		{"batchget64", func(r dsRound) float64 { return r.batch }, "keys/s"},
		{"get-loop64", func(r dsRound) float64 { return r.loop }, "keys/s"},
	}
	for _, m := range metrics {
		for _, n := range names {
			fmt.Fprintf(out, "raw %s %s median %.0f %s\n", n, m.name, med(n, m.f), m.unit)
		}
	}
	for _, n := range names {
		fmt.Fprintf(out, "raw %s settle-after-load median %.1f s\n", n, med(n, func(r dsRound) float64 { return r.settle.Seconds() }))
	}
	if haveOurs {
		for _, m := range metrics[:4] {
			ours := med("tabula", m.f)
			for _, n := range names[1:] {
				fmt.Fprintf(out, "ratio tabula/%s %s %.2f\n", n, m.name, ours/med(n, m.f))
			}
		}
	}
	for _, n := range names {
		fmt.Fprintf(out, "figure %s-batchget64-vs-loop %.2f x\n", n,
			med(n, metrics[3].f)/med(n, metrics[4].f))
	}
	if *noCrash {
		fmt.Fprintf(out, "# crash/recovery, space and GC-latency phase skipped (-no-crash); %v total\n", time.Since(t0).Round(time.Second))
		return nil
	}

	fmt.Fprintf(out, "# crash: a child process loads the store (synced batches), does %v of synced single writes, is SIGKILLed; the store's files are fsynced and evicted from the page cache (fadvise DONTNEED); the reopen is timed and /proc/self/io counted around it; one run per store\n", *killAfter)
	fmt.Fprintf(out, "# space: then 50%% of the keys are overwritten (synced batches) and the store gets %v to reclaim space by itself while %d goroutines read random keys (every Get timed); space amplification = du of the dir / %d live key+value bytes\n",
		*gcWindow, cfg.goroutines, d.liveBytes())
	crash := map[string]dsCrash{}
	for _, k := range kinds {
		fmt.Fprintf(log, "diskstore: crash/space %s (%v elapsed)\n", k.name, time.Since(t0).Round(time.Second))
		c, err := runCrash(k, d, *killAfter, *gcWindow, cfg.seed+1000, log)
		if err != nil {
			return err
		}
		crash[k.name] = c
		runtime.GC()
	}
	perM := 1e6 / float64(cfg.keys)
	for _, n := range names {
		c := crash[n]
		if c.skipped != "" {
			fmt.Fprintf(out, "# %s: recovery and space not measured (%s)\n", n, c.skipped)
		} else {
			fmt.Fprintf(out, "raw %s recovery-open %.3f s read_bytes %d rchar %d missing %d of %d sampled keys\n",
				n, c.reopen.Seconds(), c.readBytes, c.rchar, c.missing, c.sampled)
			fmt.Fprintf(out, "figure %s-recovery-seconds-per-1M-keys %.4f s\n", n, c.reopen.Seconds()*perM)
			fmt.Fprintf(out, "figure %s-recovery-read-bytes-pct-of-data %.2f %%\n", n, 100*float64(c.readBytes)/float64(d.liveBytes()))
			fmt.Fprintf(out, "figure %s-recovery-rchar-pct-of-data %.2f %%\n", n, 100*float64(c.rchar)/float64(d.liveBytes()))
			reached := "not reached"
			if c.spaceReachedAfter >= 0 {
				reached = fmt.Sprintf("after %.0f s", c.spaceReachedAfter.Seconds())
			}
			fmt.Fprintf(out, "raw %s space-amp after-overwrite %.3f end-of-window %.3f (<=1.15 %s)\n", n, c.spaceStart, c.spaceEnd, reached)
			fmt.Fprintf(out, "figure %s-space-amplification %.3f x\n", n, c.spaceEnd)
			if c.missing > 0 {
				fmt.Fprintf(out, "figure %s-recovery-lost-keys %d of %d sampled\n", n, c.missing, c.sampled)
			}
		}
		fmt.Fprintf(out, "raw %s gc-window reads %d p50 %.1f us p99 %.1f us p99.9 %.1f us\n",
			n, c.gcReads, us(c.p50), us(c.p99), us(c.p999))
		fmt.Fprintf(out, "figure %s-read-p99.9-during-gc %.1f us\n", n, us(c.p999))
	}
	if haveOurs {
		ours := crash["tabula"]
		var best time.Duration
		for _, n := range names[1:] {
			c := crash[n]
			if best == 0 || c.p999 < best {
				best = c.p999
			}
			if ours.skipped == "" {
				// Inverted (peer ÷ ours) so that > 1 still means ours is better.
				fmt.Fprintf(out, "ratio tabula/%s recovery-time(peer÷ours) %.3g\n", n, c.reopen.Seconds()/ours.reopen.Seconds())
				fmt.Fprintf(out, "ratio tabula/%s space-amp(peer÷ours) %.3f\n", n, c.spaceEnd/ours.spaceEnd)
			}
			fmt.Fprintf(out, "ratio tabula/%s read-p99.9-during-gc(peer÷ours) %.2f\n", n, float64(c.p999)/float64(ours.p999))
		}
		if best > 0 {
			fmt.Fprintf(out, "figure tabula-read-p99.9-during-gc-vs-best-peer %.2f x\n", float64(ours.p999)/float64(best))
		}
	}
	fmt.Fprintf(out, "# %v total\n", time.Since(t0).Round(time.Second))
	return nil
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

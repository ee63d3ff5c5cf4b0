package engines

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/tabuladb/tabula/engines/vfs"
)

// Sentinel errors every engine uses, so callers test them with errors.Is.
var (
	// ErrNotFound: the key is absent (or expired).
	ErrNotFound = errors.New("engines: key not found")
	// ErrClosed: the engine was closed.
	ErrClosed = errors.New("engines: engine closed")
	// ErrCorrupt: stored data failed its checksum or does not decode. Never served.
	ErrCorrupt = errors.New("engines: corrupt data")
	// ErrUnknownKind: no engine is registered for the kind.
	ErrUnknownKind = errors.New("engines: unknown engine kind")
	// ErrReadOnly: the engine does not accept writes (e.g. bulk tables).
	ErrReadOnly = errors.New("engines: engine is read-only")
)

// Kind names an engine family; it is the table kind.
type Kind string

// The kinds of table.
const (
	KindPoint   Kind = "point"
	KindBulk    Kind = "bulk"
	KindOrdered Kind = "ordered"
)

// Record is a key, its value and its expiry.
type Record struct {
	Key   []byte
	Value []byte
	// ExpiresAt is the expiry in Unix milliseconds by Options.Now; 0: never.
	// A record with 0 < ExpiresAt <= Now() is absent.
	ExpiresAt int64
}

// Mutation is one write of a batch.
type Mutation struct {
	Key []byte
	// Delete removes Key; Value and ExpiresAt are then ignored.
	Delete    bool
	Value     []byte
	ExpiresAt int64
	// Cold hints that the record will most likely not be read soon (a
	// replica's bookkeeping: its applied LSN, a request's kept outcome),
	// so an engine with a read cache may leave it out. It changes nothing
	// an engine answers.
	Cold bool
}

// CAS is a compare-and-swap request. It applies New only if the key's current
// state is Expected: absent when !ExpectExists, else present with exactly
// ExpectedValue (expired counts as absent).
type CAS struct {
	Key           []byte
	ExpectExists  bool
	ExpectedValue []byte
	// New is the state to install: a delete when New.Delete, else a put.
	// New.Key is ignored (Key is used).
	New Mutation
}

// CASResult is what CompareAndSwap saw and did.
type CASResult struct {
	Swapped bool
	// Existed and Current are the key's state before the call.
	Existed bool
	Current []byte
}

// Stats is a snapshot of an engine's counters.
type Stats struct {
	// Keys is the number of live keys (expired keys not yet dropped may count),
	// reserved ones included.
	Keys uint64
	// ReservedKeys is how many of Keys are reserved (api.IsReservedKey:
	// request outcomes, the applied LSN, coprocessor records): the keys
	// clients wrote are Keys - ReservedKeys. Engines that do not count them
	// leave it 0.
	ReservedKeys uint64
	// Bytes is the key and value bytes held for live keys.
	Bytes uint64
	// IndexBytes is the memory of the index alone.
	IndexBytes uint64
	// Reads and Writes count operations since open.
	Reads  uint64
	Writes uint64

	// Engines that keep files report these too (zero otherwise).
	//
	// LiveBytes and GarbageBytes split the bytes on disk between records
	// still current and versions overwritten, deleted or expired; Segments
	// is the number of log files.
	LiveBytes    uint64
	GarbageBytes uint64
	Segments     uint64
	// CacheHits and CacheMisses count reads served by the read cache and
	// reads that went to disk.
	CacheHits   uint64
	CacheMisses uint64
	// Syncs counts group commits (one write and fsync each); GCRuns the
	// segments garbage collection rewrote and GCBytesMoved the live bytes
	// it copied doing so.
	Syncs        uint64
	GCRuns       uint64
	GCBytesMoved uint64
}

// Engine is what every storage engine provides. Methods are safe for
// concurrent use. Returned slices belong to the caller. Calls that would
// block on I/O still take no context: engines are local and bounded (as in
// pebble); cancellation is the caller's business around them.
type Engine interface {
	// Get returns the value and expiry of key, or ErrNotFound.
	Get(key []byte) (value []byte, expiresAt int64, err error)
	// Scan calls fn for every live record, stopping at fn's first error,
	// which it returns. Records unchanged during the scan are seen exactly
	// once; a record written during the scan may be seen in either version
	// (or, if deleted, not at all). fn must not call back into the engine's
	// write methods. The Record's slices are only valid during the call.
	Scan(fn func(Record) error) error
	// Stats returns the engine's counters.
	Stats() Stats
	// Close releases the engine. It is idempotent; calls after it return ErrClosed.
	Close() error
}

// Writer is the capability of engines that accept writes (point, ordered).
// What is durable when a call returns is the engine's to document.
type Writer interface {
	// Apply applies every mutation or none, atomically to concurrent readers
	// of any single key (the batch is one unit with respect to other writers).
	Apply(batch []Mutation) error
	// Delete removes key and reports whether a live record was there.
	Delete(key []byte) (existed bool, err error)
	// CompareAndSwap applies c atomically.
	CompareAndSwap(c CAS) (CASResult, error)
}

// BatchGetter is the capability of engines with a faster multi-key read than
// a loop of Gets. GetBatch fills values[i] and found[i] for keys[i].
type BatchGetter interface {
	GetBatch(keys [][]byte, values [][]byte, expires []int64, found []bool) error
}

// Options configure an engine instance. The zero value works for in-memory
// engines.
type Options struct {
	// Dir is where the engine keeps its files. Empty: in-memory only.
	Dir string
	// Storage selects a storage back end within the kind, e.g. "memory".
	// Empty: the kind's default.
	Storage string
	// Durability says when a write to a disk-backed engine is acknowledged:
	// "sync" (default, once fsynced) or "lazy" (at once, flushed shortly
	// after). Engines without files ignore it.
	Durability string
	// Compression is how disk-backed engines compress values: "none"
	// (default) or "s2". Engines without files refuse anything else.
	Compression string
	// Replayable says every write is also in a log the owner keeps
	// durably and replays after a crash from the engine's own position (a
	// replicated partition's commit log): a disk-backed engine then need
	// not sync its writes (Durability is ignored: lazy) and may persist
	// its restart state less often.
	Replayable bool
	// FS is the file system disk-backed engines keep their files on.
	// Default: vfs.Default (the operating system's); tests inject faults
	// through a vfs.MemFS.
	FS vfs.FS
	// Now is the clock TTLs are measured by, in Unix milliseconds.
	// Default: time.Now().UnixMilli().
	Now func() int64
	// Logger receives the engine's events. Default: slog.Default().
	Logger *slog.Logger
	// CacheBudget, when set, sizes a disk-backed engine's read cache as
	// one share of a budget many engines split (a table server's);
	// otherwise each engine has its back end's default cache.
	CacheBudget *CacheBudget
	// Partition and Partitions name the partition the engine serves (its
	// index of the table's count). Engines whose files record their
	// partition (bulk) refuse a file of another. Partitions 0: unchecked.
	Partition, Partitions int
}

// WithDefaults returns o with zero fields set to their defaults.
func (o Options) WithDefaults() Options {
	if o.Now == nil {
		o.Now = func() int64 { return time.Now().UnixMilli() }
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Factory opens an engine.
type Factory func(opts Options) (Engine, error)

var registry struct {
	sync.RWMutex
	// factories is guarded by the mutex.
	factories map[Kind]Factory
}

// Register makes kind openable with f. Engines call it from init; a second
// registration of a kind panics (a wiring bug).
func Register(kind Kind, f Factory) {
	registry.Lock()
	defer registry.Unlock()
	if registry.factories == nil {
		registry.factories = make(map[Kind]Factory)
	}
	if _, dup := registry.factories[kind]; dup {
		panic(fmt.Sprintf("engines: kind %q registered twice", kind))
	}
	registry.factories[kind] = f
}

// Open opens an engine of kind with opts (defaults applied).
func Open(kind Kind, opts Options) (Engine, error) {
	registry.RLock()
	f := registry.factories[kind]
	registry.RUnlock()
	if f == nil {
		return nil, fmt.Errorf("open %q engine: %w (registered: %v)", kind, ErrUnknownKind, Kinds())
	}
	return f(opts.WithDefaults())
}

// Kinds lists the registered kinds, sorted.
func Kinds() []Kind {
	registry.RLock()
	defer registry.RUnlock()
	ks := make([]Kind, 0, len(registry.factories))
	for k := range registry.factories {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i] < ks[j] })
	return ks
}

// LastWins returns the indexes of batch's mutations that are the last for
// their key, in batch order: what a batch applies when it names a key more
// than once.
func LastWins(batch []Mutation) []int {
	out := make([]int, 0, len(batch))
	if len(batch) <= 16 {
	next:
		for i := range batch {
			for j := i + 1; j < len(batch); j++ {
				if bytes.Equal(batch[i].Key, batch[j].Key) {
					continue next
				}
			}
			out = append(out, i)
		}
		return out
	}
	last := make(map[string]int, len(batch))
	for i := range batch {
		last[string(batch[i].Key)] = i
	}
	for i := range batch {
		if last[string(batch[i].Key)] == i {
			out = append(out, i)
		}
	}
	return out
}

package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	badger "github.com/dgraph-io/badger/v4"
	bolt "go.etcd.io/bbolt"

	"github.com/tabuladb/tabula/engines"
	_ "github.com/tabuladb/tabula/engines/point"
)

// dsStore is one contender of the diskstore suite. Methods are called by
// several goroutines at once. Every read returns a copy of the value (as our
// engine's Get does), so no store is charged or spared the copy.
type dsStore interface {
	// putBatch writes keys[i] = vals[i] as one batch through the store's
	// batch API; the batch is durable (fsynced) when it returns.
	putBatch(keys, vals [][]byte) error
	// put writes one record; it is durable when it returns. Concurrent puts
	// may share one fsync where the store has group commit.
	put(key, val []byte) error
	// get returns a copy of key's value.
	get(key []byte) (val []byte, found bool, err error)
	// getMulti reads keys with the store's multi-key read (one call, one
	// transaction or snapshot), or a loop where it has none; it returns how
	// many were found.
	getMulti(keys [][]byte) (found int, err error)
	close() error
}

// dsBackgroundGC is implemented by stores whose space reclamation does not
// run by itself but which document a loop the application should run
// (badger's value log): the suite calls gcStep once a second while it waits
// for space to be reclaimed.
type dsBackgroundGC interface{ gcStep() }

// dsKind is a contender: how to open it and what it was configured with.
type dsKind struct {
	name     string
	settings string // printed on a # line
	// durable: the store keeps data across a crash (the memory back end of
	// ours does not, so crash and space phases skip it).
	durable bool
	open    func(dir string) (dsStore, error)
}

// ---- ours ----

type tabulaStore struct {
	e  engines.Engine
	w  engines.Writer
	bg engines.BatchGetter
}

func openTabula(dir, storage string) (dsStore, error) {
	e, err := engines.Open(engines.KindPoint, engines.Options{Dir: dir, Storage: storage})
	if err != nil {
		return nil, err
	}
	w, ok := e.(engines.Writer)
	if !ok {
		return nil, errors.Join(fmt.Errorf("point engine (storage %q) is not an engines.Writer", storage), e.Close())
	}
	s := &tabulaStore{e: e, w: w}
	s.bg, _ = e.(engines.BatchGetter)
	return s, nil
}

func (s *tabulaStore) putBatch(keys, vals [][]byte) error {
	ms := make([]engines.Mutation, len(keys))
	for i := range keys {
		ms[i] = engines.Mutation{Key: keys[i], Value: vals[i]}
	}
	return s.w.Apply(ms)
}

func (s *tabulaStore) put(key, val []byte) error {
	return s.w.Apply([]engines.Mutation{{Key: key, Value: val}})
}

func (s *tabulaStore) get(key []byte) ([]byte, bool, error) {
	v, _, err := s.e.Get(key)
	if errors.Is(err, engines.ErrNotFound) {
		return nil, false, nil
	}
	return v, err == nil, err
}

func (s *tabulaStore) getMulti(keys [][]byte) (int, error) {
	if s.bg == nil {
		return loopGets(s, keys)
	}
	vals := make([][]byte, len(keys))
	exp := make([]int64, len(keys))
	found := make([]bool, len(keys))
	if err := s.bg.GetBatch(keys, vals, exp, found); err != nil {
		return 0, err
	}
	n := 0
	for _, f := range found {
		if f {
			n++
		}
	}
	return n, nil
}

func (s *tabulaStore) close() error { return s.e.Close() }

func loopGets(s dsStore, keys [][]byte) (int, error) {
	n := 0
	for _, k := range keys {
		_, ok, err := s.get(k)
		if err != nil {
			return n, err
		}
		if ok {
			n++
		}
	}
	return n, nil
}

// ---- badger ----

type badgerStore struct {
	db *badger.DB
}

// openBadger opens badger v4 with its DefaultOptions except SyncWrites
// (every commit fsyncs before it returns; concurrent commits are written and
// synced together by badger's single writer goroutine: group commit) and no
// logger. valueThreshold 0 keeps the default (1 MiB: 1 KB values stay in the
// LSM tree); 64 sends every 1 KB value to the value log.
func openBadger(dir string, valueThreshold int64) (dsStore, error) {
	o := badger.DefaultOptions(dir).WithSyncWrites(true).WithLogger(nil)
	if valueThreshold > 0 {
		o = o.WithValueThreshold(valueThreshold)
	}
	db, err := badger.Open(o)
	if err != nil {
		return nil, err
	}
	return &badgerStore{db: db}, nil
}

func (s *badgerStore) putBatch(keys, vals [][]byte) error {
	return s.db.Update(func(txn *badger.Txn) error {
		for i := range keys {
			if err := txn.Set(keys[i], vals[i]); err != nil {
				return err
			}
		}
		return nil
	})
}

func (s *badgerStore) put(key, val []byte) error {
	return s.db.Update(func(txn *badger.Txn) error { return txn.Set(key, val) })
}

func badgerGet(txn *badger.Txn, key []byte) ([]byte, bool, error) {
	it, err := txn.Get(key)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	v, err := it.ValueCopy(nil)
	return v, err == nil, err
}

func (s *badgerStore) get(key []byte) (v []byte, ok bool, err error) {
	err = s.db.View(func(txn *badger.Txn) error {
		v, ok, err = badgerGet(txn, key)
		return err
	})
	return v, ok, err
}

// getMulti: one read transaction (one snapshot) for all keys.
func (s *badgerStore) getMulti(keys [][]byte) (n int, err error) {
	err = s.db.View(func(txn *badger.Txn) error {
		for _, k := range keys {
			_, ok, err := badgerGet(txn, k)
			if err != nil {
				return err
			}
			if ok {
				n++
			}
		}
		return nil
	})
	return n, err
}

// gcStep is the loop badger's README asks applications to run: value-log GC
// until it finds nothing to rewrite at a 0.5 discard ratio.
func (s *badgerStore) gcStep() {
	for s.db.RunValueLogGC(0.5) == nil {
	}
}

func (s *badgerStore) close() error { return s.db.Close() }

// ---- pebble ----

type pebbleStore struct{ db *pebble.DB }

// openPebble opens pebble v2 with default Options plus what any point-read
// user sets: a 10-bit bloom filter on every level (the default has none, and
// a Get then searches every L0 file and level: ~40k reads/s in a first run)
// and a 256 MiB block cache (badger's default; pebble's is 8 MiB). Writes
// use pebble.Sync (the commit pipeline syncs concurrent commits' WAL records
// together). Info logs (WAL replay) are dropped; errors still print.
func openPebble(dir string) (dsStore, error) {
	c := pebble.NewCache(256 << 20)
	defer c.Unref()
	o := &pebble.Options{Cache: c, Logger: quietPebbleLogger{}}
	for i := range o.Levels {
		o.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	db, err := pebble.Open(dir, o)
	if err != nil {
		return nil, err
	}
	return &pebbleStore{db: db}, nil
}

type quietPebbleLogger struct{}

func (quietPebbleLogger) Infof(string, ...any) {}
func (quietPebbleLogger) Errorf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "pebble: "+format+"\n", args...)
}
func (quietPebbleLogger) Fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "pebble: "+format+"\n", args...)
	os.Exit(1)
}

func (s *pebbleStore) putBatch(keys, vals [][]byte) error {
	b := s.db.NewBatch()
	for i := range keys {
		if err := b.Set(keys[i], vals[i], nil); err != nil {
			return errors.Join(err, b.Close())
		}
	}
	return errors.Join(b.Commit(pebble.Sync), b.Close())
}

func (s *pebbleStore) put(key, val []byte) error { return s.db.Set(key, val, pebble.Sync) }

func (s *pebbleStore) get(key []byte) ([]byte, bool, error) {
	v, c, err := s.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	out := append([]byte(nil), v...)
	return out, true, c.Close()
}

// getMulti: pebble has no multi-get; a loop of Gets.
func (s *pebbleStore) getMulti(keys [][]byte) (int, error) { return loopGets(s, keys) }

func (s *pebbleStore) close() error { return s.db.Close() }

// ---- bbolt ----

var boltBucket = []byte("kv")

type boltStore struct{ db *bolt.DB }

// openBolt opens bbolt v1.5 with DefaultOptions: every Update transaction
// fsyncs on commit; there is no group commit across Update calls.
func openBolt(dir string) (dsStore, error) {
	db, err := bolt.Open(filepath.Join(dir, "bolt.db"), 0o600, nil)
	if err != nil {
		return nil, err
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(boltBucket)
		return err
	}); err != nil {
		return nil, errors.Join(err, db.Close())
	}
	return &boltStore{db: db}, nil
}

func (s *boltStore) putBatch(keys, vals [][]byte) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(boltBucket)
		for i := range keys {
			if err := b.Put(keys[i], vals[i]); err != nil {
				return err
			}
		}
		return nil
	})
}

func (s *boltStore) put(key, val []byte) error {
	return s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(boltBucket).Put(key, val) })
}

func (s *boltStore) get(key []byte) (v []byte, ok bool, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		if x := tx.Bucket(boltBucket).Get(key); x != nil {
			v, ok = append([]byte(nil), x...), true
		}
		return nil
	})
	return v, ok, err
}

// getMulti: one read transaction for all keys.
func (s *boltStore) getMulti(keys [][]byte) (n int, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(boltBucket)
		for _, k := range keys {
			if x := b.Get(k); x != nil {
				_ = append([]byte(nil), x...)
				n++
			}
		}
		return nil
	})
	return n, err
}

func (s *boltStore) close() error { return s.db.Close() }

// dsKinds lists the contenders, ours first. oursStorage is the point
// engine's Storage ("ssd", or "memory" to exercise the harness).
func dsKinds(oursStorage string) []dsKind {
	return []dsKind{
		{
			name: "tabula",
			settings: fmt.Sprintf("point engine, Storage %q, engine defaults (documented default: sync before ack with group commit); load: Apply of one batch; mixed: Apply of one mutation", oursStorage) +
				map[bool]string{true: "; NOT DURABLE: memory back end", false: ""}[oursStorage == "memory" || oursStorage == ""],
			durable: oursStorage != "memory" && oursStorage != "",
			open:    func(dir string) (dsStore, error) { return openTabula(dir, oursStorage) },
		},
		{
			name:     "badger",
			settings: "badger v4.9.6 DefaultOptions (ValueThreshold 1 MiB: values in the LSM tree) + SyncWrites=true, Logger nil; load: one Update txn per batch; RunValueLogGC(0.5) loop once a second during the GC window (as for badger-vlog; little to do here); mixed: one Update txn per write (concurrent commits share a sync)",
			durable:  true,
			open:     func(dir string) (dsStore, error) { return openBadger(dir, 0) },
		},
		{
			name:     "badger-vlog",
			settings: "badger v4.9.6 DefaultOptions + ValueThreshold=64 (1 KB values in the value log) + SyncWrites=true, Logger nil; value-log GC: RunValueLogGC(0.5) loop once a second during the GC window (badger never runs it by itself)",
			durable:  true,
			open:     func(dir string) (dsStore, error) { return openBadger(dir, 64) },
		},
		{
			name:     "pebble",
			settings: "pebble v2.1.7 default Options + bloom.FilterPolicy(10) on all levels + 256 MiB cache; load: Batch.Commit(pebble.Sync); mixed: Set(pebble.Sync) per write (commit pipeline groups concurrent syncs)",
			durable:  true,
			open:     openPebble,
		},
		{
			name:     "bbolt",
			settings: "bbolt v1.5.0 DefaultOptions (fsync per commit); load: one Update tx per batch; mixed: one Update tx per write (no group commit)",
			durable:  true,
			open:     openBolt,
		},
	}
}

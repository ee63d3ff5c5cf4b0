package tableserver

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/point"
	"github.com/tabuladb/tabula/replication/partition"
)

// keptV0 is a kept outcome as builds before fingerprints wrote it.
func keptV0Value(lsn uint64, result []byte) []byte {
	return append(binary.LittleEndian.AppendUint64(nil, lsn), result...)
}

// TestKeptOutcomeLayout: version 1 round-trips with its fingerprint; a
// version 0 outcome (written by earlier builds) still decodes, without
// one, and answers any retry; short and unknown layouts are corrupt.
func TestKeptOutcomeLayout(t *testing.T) {
	res := []byte{outcomeCAS, 1, 1, 'v'}
	k, err := decodeKept(encodeKept(nil, 42, 0xfeed, res))
	if err != nil || k.lsn != 42 || !k.hasFP || k.fp != 0xfeed || !bytes.Equal(k.result, res) {
		t.Fatalf("version 1: %+v, %v", k, err)
	}
	if err := k.check(1, "r", 0xfeed); err != nil {
		t.Fatalf("the same fingerprint refused: %v", err)
	}
	err = k.check(1, "r", 0xbeef)
	if api.CodeOf(err) != api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT || api.DetailOf(err).GetReason() != "request_id_reused" {
		t.Fatalf("another fingerprint: %v; want INVALID_ARGUMENT request_id_reused", err)
	}
	k, err = decodeKept(keptV0Value(42, res))
	if err != nil || k.lsn != 42 || k.hasFP || !bytes.Equal(k.result, res) {
		t.Fatalf("version 0: %+v, %v", k, err)
	}
	if err := k.check(1, "r", 0xbeef); err != nil {
		t.Fatalf("a version 0 outcome refused a retry: %v", err)
	}
	// Builds before version 1 read the outcome's kind after the word:
	// they find no kind there and refuse, never misread.
	if v := encodeKept(nil, 42, 0xfeed, res); v[8] == outcomePut || v[8] == outcomeDelete || v[8] == outcomeCAS || v[8] == outcomeBatch {
		t.Fatalf("version 1 has a kind (%d) where earlier builds read one", v[8])
	}
	bad := encodeKept(nil, 42, 7, nil)
	bad[8] = 1
	for name, v := range map[string][]byte{
		"version 1 without its zero byte": bad,
		"short":                           {1, 2, 3},
		"short version 1":                 encodeKept(nil, 42, 7, nil)[:12],
		"version 2":                       binary.LittleEndian.AppendUint64(nil, 42|2<<56),
	} {
		if _, err := decodeKept(v); !errors.Is(err, engines.ErrCorrupt) {
			t.Errorf("%s: %v; want ErrCorrupt", name, err)
		}
	}
}

func FuzzDecodeKept(f *testing.F) {
	f.Add(encodeKept(nil, 1, 2, []byte("r")))
	f.Add(keptV0Value(9, nil))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := decodeKept(b)
		if err != nil {
			if !errors.Is(err, engines.ErrCorrupt) {
				t.Fatalf("error without ErrCorrupt: %v", err)
			}
			return
		}
		var again []byte
		if k.hasFP {
			again = encodeKept(nil, k.lsn, k.fp, k.result)
		} else {
			again = keptV0Value(k.lsn, k.result)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("%x decodes to %+v, which encodes to %x", b, k, again)
		}
	})
}

// TestFingerprints: a retry (same write, another header or id) has the
// write's fingerprint; any change to what it asks changes it.
func TestFingerprints(t *testing.T) {
	h1 := &api.RequestHeader{Tenant: "a", Table: "t", PartitionId: 1, Epoch: 1}
	h2 := &api.RequestHeader{Tenant: "a", Table: "t", PartitionId: 1, Epoch: 7}
	put := func(mod func(*api.PutRequest)) uint64 {
		r := &api.PutRequest{Header: h1, Key: []byte("k"), Value: []byte("v"), TtlMs: 5, RequestId: "r"}
		mod(r)
		return putFingerprint(r)
	}
	cas := func(mod func(*api.CompareAndSwapRequest)) uint64 {
		r := &api.CompareAndSwapRequest{Header: h1, Key: []byte("k"), ExpectExists: true, Expected: []byte("e"), Value: []byte("v"), TtlMs: 5, RequestId: "r"}
		mod(r)
		return casFingerprint(r)
	}
	batch := func(mod func(*api.BatchWriteRequest)) uint64 {
		r := &api.BatchWriteRequest{Header: h1, RequestId: "r", Mutations: []*api.Mutation{
			{Op: api.Mutation_OP_PUT, Key: []byte("k"), Value: []byte("v"), TtlMs: 5, Condition: &api.Condition{Kind: api.Condition_KIND_PREFIX, Prefix: []byte("p")}},
			{Op: api.Mutation_OP_DELETE, Key: []byte("d")},
		}}
		mod(r)
		return batchFingerprint(r)
	}
	same := func(name string, a, b uint64) {
		t.Helper()
		if a != b {
			t.Errorf("%s: fingerprint changed (%x, %x)", name, a, b)
		}
	}
	differ := func(name string, a, b uint64) {
		t.Helper()
		if a == b {
			t.Errorf("%s: fingerprint unchanged (%x)", name, a)
		}
	}
	p0 := put(func(*api.PutRequest) {})
	same("put retried at a new epoch", p0, put(func(r *api.PutRequest) { r.Header = h2 }))
	same("put under another id", p0, put(func(r *api.PutRequest) { r.RequestId = "other" }))
	differ("put key", p0, put(func(r *api.PutRequest) { r.Key = []byte("k2") }))
	differ("put value", p0, put(func(r *api.PutRequest) { r.Value = []byte("v2") }))
	differ("put ttl", p0, put(func(r *api.PutRequest) { r.TtlMs = 6 }))
	// Field boundaries count: key "kv"+value "" is not key "k"+value "v".
	differ("put key/value boundary", p0, put(func(r *api.PutRequest) { r.Key, r.Value = []byte("kv"), nil }))
	if put(func(r *api.PutRequest) { r.RequestId = "" }) != 0 {
		t.Error("a write without a request id has a fingerprint")
	}
	d0 := deleteFingerprint(&api.DeleteRequest{Header: h1, Key: []byte("k"), RequestId: "r"})
	same("delete retried", d0, deleteFingerprint(&api.DeleteRequest{Header: h2, Key: []byte("k"), RequestId: "r"}))
	differ("delete key", d0, deleteFingerprint(&api.DeleteRequest{Header: h1, Key: []byte("k2"), RequestId: "r"}))
	differ("delete and put of one key", d0, put(func(r *api.PutRequest) { r.Value, r.TtlMs = nil, 0 }))
	c0 := cas(func(*api.CompareAndSwapRequest) {})
	same("cas retried", c0, cas(func(r *api.CompareAndSwapRequest) { r.Header = h2 }))
	differ("cas expect_exists", c0, cas(func(r *api.CompareAndSwapRequest) { r.ExpectExists = false }))
	differ("cas expected", c0, cas(func(r *api.CompareAndSwapRequest) { r.Expected = []byte("x") }))
	differ("cas delete", c0, cas(func(r *api.CompareAndSwapRequest) { r.Delete = true }))
	differ("cas value", c0, cas(func(r *api.CompareAndSwapRequest) { r.Value = []byte("x") }))
	differ("cas ttl", c0, cas(func(r *api.CompareAndSwapRequest) { r.TtlMs = 0 }))
	b0 := batch(func(*api.BatchWriteRequest) {})
	same("batch retried", b0, batch(func(r *api.BatchWriteRequest) { r.Header = h2 }))
	differ("batch op", b0, batch(func(r *api.BatchWriteRequest) { r.Mutations[1].Op = api.Mutation_OP_PUT }))
	differ("batch condition kind", b0, batch(func(r *api.BatchWriteRequest) { r.Mutations[0].Condition.Kind = api.Condition_KIND_PRESENT }))
	differ("batch condition prefix", b0, batch(func(r *api.BatchWriteRequest) { r.Mutations[0].Condition.Prefix = []byte("q") }))
	differ("batch order", b0, batch(func(r *api.BatchWriteRequest) { r.Mutations[0], r.Mutations[1] = r.Mutations[1], r.Mutations[0] }))
	differ("batch one mutation fewer", b0, batch(func(r *api.BatchWriteRequest) { r.Mutations = r.Mutations[:1] }))
}

// skewedReplica is a primary's log replica over a memory point engine
// whose clock, and the server's, runs *skew ahead of the real one (the
// test moves it): enough of one to take writes and retries (the core is
// not involved in what these tests drive).
func skewedReplica(t *testing.T, skew *atomic.Int64) *logReplica {
	t.Helper()
	now := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	e, err := point.Open(engines.Options{Storage: point.StorageMemory, Now: func() int64 { return now().UnixMilli() }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return &logReplica{
		s: &Server{opts: Options{Now: now}}, pid: 1, engine: e, writer: e,
		core:    partition.New(partition.Config{}, 0),
		overlay: map[string]overlayEntry{}, waiters: map[uint64]chan writeResult{},
		want: roleWant{role: partition.RolePrimary, epoch: 1, extent: 1}, extent: 1, caughtUp: true,
	}
}

// keptRecord is a record as the primary logs a write with request id
// reqID, at the primary's clock primaryNow, kept as the given value.
func keptRecord(lsn uint64, reqID string, primaryNow time.Time, kept []byte) partition.Record {
	w := partition.Write{Mutations: []partition.Mutation{
		{Kind: partition.MutPut, Key: []byte("k"), Value: []byte("v2")},
		{Kind: partition.MutPut, Key: requestKey(reqID), Value: kept, ExpiresAt: primaryNow.Add(requestTTL).UnixMilli()},
	}}
	return partition.Record{LSN: lsn, Epoch: 1, RequestID: reqID, Body: partition.EncodeWrite(nil, w)}
}

// TestKeptOutcomeOutlivesSkew: a replica whose clock is 11 minutes ahead
// of the primary that logged a write (the new primary after a failover)
// still answers a retry with the kept outcome, for records of this build
// and of earlier ones (version 0 outcomes), and for outcomes it copied
// from another replica's snapshot. Before, it kept the outcome until the
// primary's clock + 10 minutes, by its own clock already past: the retry
// of a CAS applied again.
func TestKeptOutcomeOutlivesSkew(t *testing.T) {
	var skew atomic.Int64
	skew.Store(int64(11 * time.Minute))
	l := skewedReplica(t, &skew)
	primaryNow := time.Now()
	// The engine does drop by its skewed clock what the primary's clock
	// set: without keptExpiry the outcome would be gone.
	if err := l.writer.Apply([]engines.Mutation{{Key: []byte("probe"), Value: []byte("x"), ExpiresAt: primaryNow.Add(requestTTL).UnixMilli()}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.engine.Get([]byte("probe")); !errors.Is(err, engines.ErrNotFound) {
		t.Fatalf("the engine kept a key past its expiry by its clock (%v): the test's clock is not skewed", err)
	}
	res := []byte{outcomeCAS, 1, 1, 'v', '1'}
	fp := uint64(0xc0ffee)
	recs := []partition.Record{
		keptRecord(1, "new", primaryNow, encodeKept(nil, 1, fp, res)),
		keptRecord(2, "old", primaryNow, keptV0Value(2, res)),
	}
	if err := l.apply(recs); err != nil {
		t.Fatal(err)
	}
	copiedKey := requestKey("copied")
	m := l.fromCopy(engines.Mutation{Key: copiedKey, Value: encodeKept(nil, 3, fp, res), ExpiresAt: primaryNow.Add(requestTTL).UnixMilli()})
	if !m.Cold {
		t.Error("a copied kept outcome goes to the read cache")
	}
	if err := l.writer.Apply([]engines.Mutation{m}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		id  string
		lsn uint64
	}{{"new", 1}, {"old", 2}, {"copied", 3}} {
		lsn, got, ok, err := l.committedRequest(c.id, fp)
		if err != nil || !ok || lsn != c.lsn || !bytes.Equal(got, res) {
			t.Errorf("retry of %q on the skewed replica: lsn %d, result %x, kept %v, err %v; want LSN %d and the first outcome", c.id, lsn, got, ok, err, c.lsn)
		}
	}
	// Through write: the retry is answered without deciding again.
	lsn, got, err := l.write(context.Background(), 1, "new", fp, func(func([]byte) ([]byte, bool, error)) ([]engines.Mutation, []byte, error) {
		t.Error("a retry within the window was decided again")
		return nil, nil, errors.New("decided again")
	})
	if err != nil || lsn != 1 || !bytes.Equal(got, res) {
		t.Fatalf("retried write: %d, %x, %v", lsn, got, err)
	}
	// Kept long enough, not for ever: gone once requestTTL passed by the
	// replica's clock, which the engine's collector then drops.
	skew.Add(int64(requestTTL + time.Minute))
	for _, id := range []string{"new", "old", "copied"} {
		if _, _, ok, err := l.committedRequest(id, fp); ok || err != nil {
			t.Errorf("outcome of %q kept past requestTTL by the replica's clock: %v, %v", id, ok, err)
		}
	}
}

// TestRetryJoiningInFlight: a retry of a write still in flight waits for
// it and answers its outcome; a write reusing the id with another
// fingerprint is refused at once, without waiting or joining.
func TestRetryJoiningInFlight(t *testing.T) {
	var skew atomic.Int64
	l := skewedReplica(t, &skew)
	res := []byte{outcomePut}
	const fp, other = uint64(0xa11ce), uint64(0xb0b)
	kept := encodeKept(nil, 7, fp, res)
	l.overlay[string(requestKey("r"))] = overlayEntry{lsn: 7, value: kept}
	decide := func(func([]byte) ([]byte, bool, error)) ([]engines.Mutation, []byte, error) {
		t.Error("a retry of a write in flight was decided again")
		return nil, nil, errors.New("decided again")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _, err := l.write(ctx, 1, "r", other, decide)
	if api.DetailOf(err).GetReason() != "request_id_reused" {
		t.Fatalf("another write under the id in flight: %v; want request_id_reused", err)
	}
	type answer struct {
		lsn uint64
		res []byte
		err error
	}
	done := make(chan answer, 1)
	go func() {
		lsn, res, err := l.write(ctx, 1, "r", fp, decide)
		done <- answer{lsn, res, err}
	}()
	// Once the retry waits (awaitRequest's channel is out), the write
	// applies as the pump does it: engine, overlay, wake.
	for {
		l.mu.Lock()
		waiting := l.appliedCh != nil
		l.mu.Unlock()
		if waiting {
			break
		}
		select {
		case a := <-done:
			t.Fatalf("the retry answered before the write applied: %+v", a)
		case <-ctx.Done():
			t.Fatal("the retry never waited for the write in flight")
		case <-time.After(time.Millisecond):
		}
	}
	l.mu.Lock()
	if err := l.writer.Apply([]engines.Mutation{{Key: requestKey("r"), Value: kept, ExpiresAt: l.keptExpiry(0)}}); err != nil {
		t.Fatal(err)
	}
	delete(l.overlay, string(requestKey("r")))
	l.notifyAppliedLocked()
	l.mu.Unlock()
	a := <-done
	if a.err != nil || a.lsn != 7 || !bytes.Equal(a.res, res) {
		t.Fatalf("the retry that joined: %+v; want LSN 7 and the first outcome", a)
	}
	// Applied now: the other write is still refused.
	if _, _, err := l.write(ctx, 1, "r", other, decide); api.DetailOf(err).GetReason() != "request_id_reused" {
		t.Fatalf("another write under the applied id: %v; want request_id_reused", err)
	}
}

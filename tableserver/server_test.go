package tableserver_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/internal/keyspace"
	"github.com/tabuladb/tabula/internal/testcluster"
)

// fixture is an in-process cluster with one point table, spoken to with raw
// gRPC so every request check can be provoked.
type fixture struct {
	c      *testcluster.Cluster
	master api.MasterClient
	m      *api.PartitionMap
	conns  map[string]*grpc.ClientConn
}

func newFixture(t *testing.T, partitions uint32) *fixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := testcluster.Start(ctx, testcluster.Options{Servers: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close cluster: %v", err)
		}
	})
	f := &fixture{c: c, conns: map[string]*grpc.ClientConn{}}
	f.master = api.NewMasterClient(f.dial(t, c.MasterAddr()))
	resp, err := f.master.CreateTable(ctx, &api.CreateTableRequest{
		Tenant: api.DefaultTenant, Name: "t", Kind: api.TableKind_TABLE_KIND_POINT,
		// One copy: each server hosts only its own partitions, so a request
		// to another server is NOT_OWNER partition_not_here (a secondary's
		// answer, not_primary, is tested with replicas).
		Options: &api.TableOptions{Partitions: partitions, MaxValueBytes: 1024, Replication: 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	f.m = resp.GetMap()
	return f
}

func (f *fixture) dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	if cc := f.conns[addr]; cc != nil {
		return cc
	}
	cc, err := grpc.NewClient(addr, append(f.c.Credential().DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	f.conns[addr] = cc
	return cc
}

func primary(p *api.Partition) *api.Replica {
	for _, r := range p.GetReplicas() {
		if r.GetRole() == api.ReplicaRole_REPLICA_ROLE_PRIMARY {
			return r
		}
	}
	return nil
}

// keyIn returns a key that hashes into partition index i of n.
func keyIn(i, n int) []byte {
	for j := 0; ; j++ {
		k := fmt.Appendf(nil, "k%d", j)
		if keyspace.Index(keyspace.Hash(k), n) == i {
			return k
		}
	}
}

func (f *fixture) server(t *testing.T, p *api.Partition) api.TableServerClient {
	return api.NewTableServerClient(f.dial(t, primary(p).GetAddr()))
}

func hdr(p *api.Partition) *api.RequestHeader {
	return &api.RequestHeader{Tenant: api.DefaultTenant, Table: "t", PartitionId: p.GetId(), Epoch: p.GetEpoch()}
}

// call retries while the server has not yet seen the new table (it learns
// of it through its watch), then returns the last error.
func eventually[T any](t *testing.T, fn func() (T, error)) (T, error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		v, err := fn()
		code := api.CodeOf(err)
		if err == nil || time.Now().After(deadline) || (code != api.ErrorCode_ERROR_CODE_NOT_OWNER && code != api.ErrorCode_ERROR_CODE_UNAVAILABLE && code != api.ErrorCode_ERROR_CODE_NOT_FOUND) {
			return v, err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRequestChecks(t *testing.T) {
	f := newFixture(t, 6)
	ctx := context.Background()
	p0, p1 := f.m.GetPartitions()[0], f.m.GetPartitions()[1]
	k0 := keyIn(0, 6)
	s0 := f.server(t, p0)
	if _, err := eventually(t, func() (*api.PutResponse, error) {
		return s0.Put(ctx, &api.PutRequest{Header: hdr(p0), Key: k0, Value: []byte("v")})
	}); err != nil {
		t.Fatalf("put: %v", err)
	}
	got, err := s0.Get(ctx, &api.GetRequest{Header: hdr(p0), Key: k0})
	if err != nil || !got.GetFound() || string(got.GetValue()) != "v" {
		t.Fatalf("get: %v %v", got, err)
	}

	cases := []struct {
		name   string
		call   func() error
		code   api.ErrorCode
		reason string
	}{
		{"missing header", func() error { _, err := s0.Get(ctx, &api.GetRequest{Key: k0}); return err },
			api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "header_missing"},
		{"stale epoch", func() error {
			h := hdr(p0)
			h.Epoch--
			_, err := s0.Get(ctx, &api.GetRequest{Header: h, Key: k0})
			return err
		}, api.ErrorCode_ERROR_CODE_STALE_EPOCH, "stale_epoch"},
		{"future epoch", func() error {
			h := hdr(p0)
			h.Epoch += 5
			_, err := s0.Get(ctx, &api.GetRequest{Header: h, Key: k0})
			return err
		}, api.ErrorCode_ERROR_CODE_UNAVAILABLE, "map_behind"},
		{"key of another partition", func() error {
			_, err := s0.Get(ctx, &api.GetRequest{Header: hdr(p0), Key: keyIn(1, 6)})
			return err
		}, api.ErrorCode_ERROR_CODE_NOT_OWNER, "key_not_in_partition"},
		{"empty key", func() error { _, err := s0.Put(ctx, &api.PutRequest{Header: hdr(p0), Value: []byte("v")}); return err },
			api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "key_empty"},
		{"key over 4 KiB", func() error {
			_, err := s0.Put(ctx, &api.PutRequest{Header: hdr(p0), Key: make([]byte, api.MaxKeyBytes+1)})
			return err
		}, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "key_too_large"},
		{"value over the table limit", func() error {
			_, err := s0.Put(ctx, &api.PutRequest{Header: hdr(p0), Key: k0, Value: make([]byte, 1025)})
			return err
		}, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "value_too_large"},
		{"ttl overflowing the expiry", func() error {
			_, err := s0.Put(ctx, &api.PutRequest{Header: hdr(p0), Key: k0, Value: []byte("w"), TtlMs: math.MaxUint64})
			return err
		}, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "ttl_too_long"},
		{"ttl too long in a batch", func() error {
			_, err := s0.BatchWrite(ctx, &api.BatchWriteRequest{Header: hdr(p0), Mutations: []*api.Mutation{{Op: api.Mutation_OP_PUT, Key: k0, Value: []byte("w"), TtlMs: api.MaxTTLMs + 1}}})
			return err
		}, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "ttl_too_long"},
		{"ttl too long in a CAS", func() error {
			_, err := s0.CompareAndSwap(ctx, &api.CompareAndSwapRequest{Header: hdr(p0), Key: k0, ExpectExists: true, Expected: []byte("v"), Value: []byte("w"), TtlMs: math.MaxUint64})
			return err
		}, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "ttl_too_long"},
		{"unknown table", func() error {
			h := hdr(p0)
			h.Table = "nosuch"
			_, err := s0.Get(ctx, &api.GetRequest{Header: h, Key: k0})
			return err
		}, api.ErrorCode_ERROR_CODE_NOT_OWNER, "table_not_here"},
		{"bad op in batch", func() error {
			_, err := s0.BatchWrite(ctx, &api.BatchWriteRequest{Header: hdr(p0), Mutations: []*api.Mutation{{Key: k0}}})
			return err
		}, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "op_invalid"},
		{"empty batch", func() error { _, err := s0.BatchWrite(ctx, &api.BatchWriteRequest{Header: hdr(p0)}); return err },
			api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "batch_empty"},
		{"batch over the key limit", func() error {
			_, err := s0.BatchGet(ctx, &api.BatchGetRequest{Header: hdr(p0), Keys: make([][]byte, api.MaxBatchKeys+1)})
			return err
		}, api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "batch_too_large"},
	}
	if primary(p1).GetServerId() != primary(p0).GetServerId() {
		cases = append(cases, struct {
			name   string
			call   func() error
			code   api.ErrorCode
			reason string
		}{"partition hosted elsewhere", func() error {
			_, err := s0.Get(ctx, &api.GetRequest{Header: hdr(p1), Key: keyIn(1, 6)})
			return err
		}, api.ErrorCode_ERROR_CODE_NOT_OWNER, "partition_not_here"})
	}
	defer func() {
		// Refused writes changed nothing.
		got, err := s0.Get(ctx, &api.GetRequest{Header: hdr(p0), Key: k0})
		if err != nil || !got.GetFound() || string(got.GetValue()) != "v" || got.GetExpiresUnixMs() != 0 {
			t.Errorf("after the refused writes: %v %v, want v without expiry", got, err)
		}
	}()
	for _, c := range cases {
		err := c.call()
		d := api.DetailOf(err)
		if d.GetCode() != c.code || d.GetReason() != c.reason {
			t.Errorf("%s: got %v (%v/%q), want %v/%q", c.name, err, d.GetCode(), d.GetReason(), c.code, c.reason)
		}
		if c.code == api.ErrorCode_ERROR_CODE_NOT_OWNER && d.GetReason() != "table_not_here" && d.GetPartition() == nil {
			t.Errorf("%s: NOT_OWNER without the current map entry", c.name)
		}
	}
	// Nothing the bad requests sent changed the data.
	got, err = s0.Get(ctx, &api.GetRequest{Header: hdr(p0), Key: k0})
	if err != nil || string(got.GetValue()) != "v" {
		t.Fatalf("value changed by bad requests: %v %v", got, err)
	}
}

func TestWriteOperations(t *testing.T) {
	f := newFixture(t, 2)
	ctx := context.Background()
	p := f.m.GetPartitions()[0]
	s := f.server(t, p)
	k := keyIn(0, 2)
	if _, err := eventually(t, func() (*api.CompareAndSwapResponse, error) {
		return s.CompareAndSwap(ctx, &api.CompareAndSwapRequest{Header: hdr(p), Key: k, Value: []byte("one")})
	}); err != nil {
		t.Fatal(err)
	}
	// Every call below goes through eventually too: the master may still
	// publish a map version the server has not seen (its replicas
	// settling), which it answers UNAVAILABLE until it has.
	r, err := eventually(t, func() (*api.CompareAndSwapResponse, error) {
		return s.CompareAndSwap(ctx, &api.CompareAndSwapRequest{Header: hdr(p), Key: k, Value: []byte("two")})
	})
	if err != nil || r.GetSwapped() || !r.GetExisted() || string(r.GetCurrent()) != "one" {
		t.Fatalf("CAS expecting absent on a present key: %v %v", r, err)
	}
	r, err = eventually(t, func() (*api.CompareAndSwapResponse, error) {
		return s.CompareAndSwap(ctx, &api.CompareAndSwapRequest{Header: hdr(p), Key: k, ExpectExists: true, Expected: []byte("one"), Value: []byte("two")})
	})
	if err != nil || !r.GetSwapped() {
		t.Fatalf("CAS one->two: %v %v", r, err)
	}
	// TTL: a value written with a 1 ms TTL is gone soon after.
	kt := append([]byte("ttl-"), k...)
	for keyspace.Index(keyspace.Hash(kt), 2) != 0 {
		kt = append(kt, 'x')
	}
	if _, err := eventually(t, func() (*api.PutResponse, error) {
		return s.Put(ctx, &api.PutRequest{Header: hdr(p), Key: kt, Value: []byte("x"), TtlMs: 1})
	}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		g, err := eventually(t, func() (*api.GetResponse, error) {
			return s.Get(ctx, &api.GetRequest{Header: hdr(p), Key: kt})
		})
		if err != nil {
			t.Fatal(err)
		}
		if !g.GetFound() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("TTL record never expired")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// BatchWrite then Scan sees exactly the batch plus k.
	var muts []*api.Mutation
	want := map[string]string{string(k): "two"}
	for i := 0; len(muts) < 50; i++ {
		key := fmt.Appendf(nil, "b%d", i)
		if keyspace.Index(keyspace.Hash(key), 2) != 0 {
			continue
		}
		muts = append(muts, &api.Mutation{Op: api.Mutation_OP_PUT, Key: key, Value: key})
		want[string(key)] = string(key)
	}
	if _, err := eventually(t, func() (*api.BatchWriteResponse, error) {
		return s.BatchWrite(ctx, &api.BatchWriteRequest{Header: hdr(p), Mutations: muts})
	}); err != nil {
		t.Fatal(err)
	}
	stream, err := s.Scan(ctx, &api.ScanRequest{Header: hdr(p)})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range resp.GetRecords() {
			if _, dup := seen[string(kv.GetKey())]; dup {
				t.Fatalf("scan returned %q twice", kv.GetKey())
			}
			seen[string(kv.GetKey())] = string(kv.GetValue())
		}
	}
	if len(seen) != len(want) {
		t.Fatalf("scan saw %d records, want %d", len(seen), len(want))
	}
	for k, v := range want {
		if seen[k] != v {
			t.Fatalf("scan: %q = %q, want %q", k, seen[k], v)
		}
	}
	d, err := s.Delete(ctx, &api.DeleteRequest{Header: hdr(p), Key: k})
	if err != nil || !d.GetExisted() {
		t.Fatalf("delete: %v %v", d, err)
	}
}

// TestLeaseExpiresWithoutMaster: with the master gone, a server stops
// serving once its lease runs out.
func TestLeaseExpiresWithoutMaster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := newFixture(t, 1)
	p := f.m.GetPartitions()[0]
	s := f.server(t, p)
	k := keyIn(0, 1)
	if _, err := eventually(t, func() (*api.GetResponse, error) {
		return s.Get(ctx, &api.GetRequest{Header: hdr(p), Key: k})
	}); err != nil {
		t.Fatal(err)
	}
	if err := f.c.StopMaster(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := s.Get(ctx, &api.GetRequest{Header: hdr(p), Key: k})
		if api.DetailOf(err).GetReason() == "lease_expired" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still serving 5s after the master stopped (last: %v)", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

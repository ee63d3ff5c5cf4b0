package tableserver_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/engines/vfs"
	"github.com/tabuladb/tabula/internal/testcluster"
	"github.com/tabuladb/tabula/tableserver"
)

// faultRig is a 4-server in-process cluster whose servers keep their
// engines on their own MemFS, a one-partition ssd table "t" with 3
// replicas, and a client workload through the SDK: writers that record
// what was acknowledged and a reader that checks every value it gets.
type faultRig struct {
	t      *testing.T
	ctx    context.Context
	c      *testcluster.Cluster
	f      *fixture
	fss    []*vfs.MemFS
	tbl    *client.Table
	stop   chan struct{}
	wg     sync.WaitGroup
	mu     sync.Mutex
	acked  map[string]int // key -> last acknowledged value
	errs   atomic.Int64
	first  atomic.Value
	writes atomic.Int64
	reads  atomic.Int64
}

func newFaultRig(t *testing.T) *faultRig {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	r := &faultRig{t: t, ctx: ctx, fss: make([]*vfs.MemFS, 4), acked: map[string]int{}, stop: make(chan struct{})}
	for i := range r.fss {
		r.fss[i] = vfs.NewMem()
	}
	c, err := testcluster.Start(ctx, testcluster.Options{Servers: 4,
		ServerOptions: func(i int, o *tableserver.Options) {
			o.EngineFS = r.fss[i]
			o.LogFlushInterval = 200 * time.Millisecond
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	r.c = c
	r.f = &fixture{c: c, conns: map[string]*grpc.ClientConn{}}
	r.f.master = api.NewMasterClient(r.f.dial(t, c.MasterAddr()))
	cl, err := client.New(ctx, client.Options{Masters: []string{c.MasterAddr()}, Credential: c.Credential(), Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	if _, err := cl.CreateTable(ctx, "t", api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: 1, Replication: 3, Storage: "ssd"}); err != nil {
		t.Fatal(err)
	}
	r.tbl = cl.Table("t")
	r.waitInSync(3)
	return r
}

func (r *faultRig) fail(err error) {
	r.errs.Add(1)
	r.first.CompareAndSwap(nil, err.Error())
}

// start runs the workload: 3 writers, each over its own 40 keys with
// increasing values, and a reader that checks a Get never returns a
// value older than one acknowledged before it began, nor one never
// written.
func (r *faultRig) start() {
	for w := range 3 {
		r.wg.Go(func() {
			for i := 1; ; i++ {
				select {
				case <-r.stop:
					return
				default:
				}
				k := fmt.Sprintf("w%d-%d", w, i%40)
				if err := r.tbl.Put(r.ctx, []byte(k), []byte(strconv.Itoa(i))); err != nil {
					r.fail(fmt.Errorf("put %s: %w", k, err))
					continue
				}
				r.writes.Add(1)
				r.mu.Lock()
				r.acked[k] = i
				r.mu.Unlock()
			}
		})
	}
	r.wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-r.stop:
				return
			default:
			}
			j := i % 40
			k := fmt.Sprintf("w%d-%d", i%3, j)
			r.mu.Lock()
			floor, written := r.acked[k]
			r.mu.Unlock()
			v, err := r.tbl.Get(r.ctx, []byte(k))
			switch {
			case errors.Is(err, client.ErrKeyNotFound) && !written:
			case err != nil:
				r.fail(fmt.Errorf("get %s: %w", k, err))
			default:
				n, perr := strconv.Atoi(string(v))
				if perr != nil || n < floor || n%40 != j {
					r.fail(fmt.Errorf("get %s = %q: acknowledged %d before the read", k, v, floor))
				}
			}
			r.reads.Add(1)
			time.Sleep(time.Millisecond) // pace the reader: the machine is shared
		}
	})
}

// waitProgress waits until the workload made n more writes.
func (r *faultRig) waitProgress(n int64) {
	r.t.Helper()
	target := r.writes.Load() + n
	r.waitFor(15*time.Second, fmt.Sprintf("%d more acknowledged writes", n), func() bool { return r.writes.Load() >= target })
}

// halt stops the workload and checks no call failed.
func (r *faultRig) halt() {
	r.t.Helper()
	close(r.stop)
	r.wg.Wait()
	if n := r.errs.Load(); n > 0 {
		r.t.Fatalf("%d client calls failed; first: %v", n, r.first.Load())
	}
	if r.reads.Load() == 0 || r.writes.Load() == 0 {
		r.t.Fatalf("no workload: %d writes, %d reads", r.writes.Load(), r.reads.Load())
	}
}

func (r *faultRig) describe() *api.DescribeTableResponse {
	r.t.Helper()
	d, err := r.f.master.DescribeTable(r.ctx, &api.DescribeTableRequest{Tenant: api.DefaultTenant, Name: "t"})
	if err != nil {
		r.t.Fatal(err)
	}
	return d
}

// state is server id's reported state of the partition (unspecified if
// it reports none).
func state(d *api.DescribeTableResponse, id string) api.ReplicaState {
	for _, s := range d.GetReplicas() {
		if s.GetServerId() == id {
			return s.GetState()
		}
	}
	return api.ReplicaState_REPLICA_STATE_UNSPECIFIED
}

func hosts(d *api.DescribeTableResponse, id string) bool {
	return slices.ContainsFunc(d.GetMap().GetPartitions()[0].GetReplicas(), func(r *api.Replica) bool { return r.GetServerId() == id })
}

func (r *faultRig) waitFor(timeout time.Duration, what string, cond func() bool) {
	r.t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			r.t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitInSync waits until the partition has n replicas, all reporting
// themselves in sync.
func (r *faultRig) waitInSync(n int) {
	r.t.Helper()
	r.waitFor(20*time.Second, fmt.Sprintf("%d in-sync replicas", n), func() bool {
		d := r.describe()
		reps := d.GetMap().GetPartitions()[0].GetReplicas()
		if len(reps) != n {
			return false
		}
		for _, rep := range reps {
			if state(d, rep.GetServerId()) != api.ReplicaState_REPLICA_STATE_IN_SYNC {
				return false
			}
		}
		return true
	})
}

// replicaWith returns the server id and index of the partition's replica
// with role.
func (r *faultRig) replicaWith(role api.ReplicaRole) (string, int) {
	r.t.Helper()
	r.waitInSync(3)
	for _, rep := range r.describe().GetMap().GetPartitions()[0].GetReplicas() {
		if rep.GetRole() == role {
			return rep.GetServerId(), slices.Index(r.c.ServerIDs(), rep.GetServerId())
		}
	}
	r.t.Fatalf("no replica with role %v", role)
	return "", 0
}

// checkAll checks that every replica holds every acknowledged write: a
// last write through the primary gives the LSN each replica must reach.
func (r *faultRig) checkAll() {
	r.t.Helper()
	var last uint64
	p := r.describe().GetMap().GetPartitions()[0]
	// A secondary dropped from the open extent's ack set (its server
	// answered a replicate later than 150 ms, which a loaded machine
	// does) reads the records it missed only once the extent is sealed:
	// seal it, so the check does not wait for the extent to fill.
	if _, err := r.f.master.PartitionLogFailed(r.ctx, &api.PartitionLogFailedRequest{
		PartitionId: p.GetId(), Epoch: p.GetEpoch(), Extent: p.GetLog().GetExtent(), Reason: "test: seal before checking every replica",
	}); err != nil {
		r.t.Fatalf("seal the log: %v", err)
	}
	resp, err := eventually(r.t, func() (*api.PutResponse, error) {
		p = r.describe().GetMap().GetPartitions()[0]
		return r.f.server(r.t, p).Put(r.ctx, &api.PutRequest{Header: hdr(p), Key: []byte("last"), Value: []byte("x")})
	})
	if err != nil {
		r.t.Fatalf("last put: %v", err)
	}
	last = resp.GetLsn()
	r.mu.Lock()
	acked := maps.Clone(r.acked)
	r.mu.Unlock()
	for _, rep := range p.GetReplicas() {
		sc := api.NewTableServerClient(r.f.dial(r.t, rep.GetAddr()))
		h := hdr(p)
		h.ReadAny, h.MinLsn = true, last
		for k, v := range acked {
			g, err := eventually(r.t, func() (*api.GetResponse, error) {
				return sc.Get(r.ctx, &api.GetRequest{Header: h, Key: []byte(k)})
			})
			if err != nil || !g.GetFound() || string(g.GetValue()) != strconv.Itoa(v) {
				r.t.Fatalf("replica on %s, key %s: got %q (found %v, %v), acknowledged %d", rep.GetServerId(), k, g.GetValue(), g.GetFound(), err, v)
			}
		}
	}
}

// TestEngineTransientFaultReopens: one replica's disk fails every write,
// sync and create for a while, then heals, under a client workload. The
// replica reopens its engine in place (it reports itself catching up,
// never failed) and is not replaced; no client call fails; every
// acknowledged write is on every replica after.
func TestEngineTransientFaultReopens(t *testing.T) {
	for _, role := range []api.ReplicaRole{api.ReplicaRole_REPLICA_ROLE_SECONDARY, api.ReplicaRole_REPLICA_ROLE_PRIMARY} {
		t.Run(strings.ToLower(strings.TrimPrefix(role.String(), "REPLICA_ROLE_")), func(t *testing.T) {
			r := newFaultRig(t)
			r.start()
			r.waitProgress(100)
			bad, i := r.replicaWith(role)
			r.fss[i].Inject(vfs.Fault{Ops: vfs.OpWrite | vfs.OpSync | vfs.OpCreate, Sticky: true})
			// The fault shows as the replica catching up (reopening),
			// never failed, and it stays in the partition throughout.
			var failed, left atomic.Bool
			watch := func() bool {
				d := r.describe()
				if state(d, bad) == api.ReplicaState_REPLICA_STATE_FAILED {
					failed.Store(true)
				}
				if !hosts(d, bad) {
					left.Store(true)
				}
				return state(d, bad) == api.ReplicaState_REPLICA_STATE_CATCHING_UP
			}
			r.waitFor(10*time.Second, "the faulted replica to report itself catching up", watch)
			heal := time.Now().Add(500 * time.Millisecond) // the disk stays bad across reopen attempts
			r.waitFor(time.Second, "the disk to heal", func() bool { watch(); return time.Now().After(heal) })
			r.fss[i].ClearFaults()
			r.waitFor(20*time.Second, "the reopened replica in sync", func() bool {
				watch()
				return state(r.describe(), bad) == api.ReplicaState_REPLICA_STATE_IN_SYNC
			})
			r.waitProgress(50)
			r.halt()
			if watch(); failed.Load() || left.Load() {
				t.Fatalf("the replica on %s reported itself failed (%v) or left the partition (%v) after a transient fault: %v",
					bad, failed.Load(), left.Load(), r.describe().GetReplicas())
			}
			r.checkAll()
			t.Logf("%d writes, %d reads", r.writes.Load(), r.reads.Load())
		})
	}
}

// TestEnginePermanentFaultReplaced: the primary's disk fails for good
// under a client workload. Its reopen attempts run out, it reports itself
// failed, and the master replaces it from a healthy replica: the table is
// back to 3 in-sync replicas, no client call failed, and every
// acknowledged write is on every replica.
func TestEnginePermanentFaultReplaced(t *testing.T) {
	r := newFaultRig(t)
	r.start()
	r.waitProgress(100)
	bad, i := r.replicaWith(api.ReplicaRole_REPLICA_ROLE_PRIMARY)
	r.fss[i].Inject(vfs.Fault{Ops: vfs.OpWrite | vfs.OpSync | vfs.OpCreate, Sticky: true})
	r.waitFor(20*time.Second, "the replica on the failing disk to be replaced", func() bool { return !hosts(r.describe(), bad) })
	r.waitInSync(3)
	r.waitProgress(50)
	r.halt()
	r.checkAll()
}

// TestEngineChecksumFaultRebuilt: bits flip in one secondary's engine
// files under a client workload. The replica never serves the corrupt
// data: a scan of it fails (or returns only what was written), and the
// replica reports itself failed at once (no reopen: reading the data
// again would fail again) and is rebuilt from a healthy replica.
func TestEngineChecksumFaultRebuilt(t *testing.T) {
	r := newFaultRig(t)
	r.start()
	r.waitProgress(200)
	bad, i := r.replicaWith(api.ReplicaRole_REPLICA_ROLE_SECONDARY)
	p := r.describe().GetMap().GetPartitions()[0]
	dir := filepath.Join(r.c.Dir(), fmt.Sprintf("server-%d", i), "partitions", strconv.FormatUint(p.GetId(), 10))
	// A replicated engine writes its segment files lazily (every second,
	// or by size): wait for one.
	var names []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var err error
		if names, err = r.fss[i].List(dir); err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(names, func(n string) bool { return strings.HasSuffix(n, ".log") }) || time.Now().After(deadline) {
			break
		}
	}
	flipped := 0
	for _, n := range names {
		if !strings.HasSuffix(n, ".log") {
			continue
		}
		size, err := r.fss[i].Stat(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		for off := int64(64); off < size; off += 16 {
			if err := r.fss[i].FlipBit(filepath.Join(dir, n), off, 3); err != nil {
				t.Fatal(err)
			}
			flipped++
		}
	}
	if flipped == 0 {
		t.Fatalf("no segment files in %s: %v", dir, names)
	}
	// A scan of the corrupt replica reads its files: it must fail rather
	// than return a record that was never written.
	var addr string
	for _, rep := range p.GetReplicas() {
		if rep.GetServerId() == bad {
			addr = rep.GetAddr()
		}
	}
	h := hdr(p)
	h.ReadAny = true
	st, err := api.NewTableServerClient(r.f.dial(t, addr)).Scan(r.ctx, &api.ScanRequest{Header: h})
	if err != nil {
		t.Fatal(err)
	}
	scanned := 0
	for {
		resp, err := st.Recv()
		if errors.Is(err, io.EOF) {
			t.Fatalf("a scan of the corrupt replica succeeded (%d records)", scanned)
		}
		if err != nil {
			if api.CodeOf(err) != api.ErrorCode_ERROR_CODE_UNAVAILABLE {
				t.Fatalf("scan of the corrupt replica: %v", err)
			}
			break
		}
		for _, kv := range resp.GetRecords() {
			scanned++
			if _, err := strconv.Atoi(string(kv.GetValue())); err != nil || !strings.HasPrefix(string(kv.GetKey()), "w") {
				t.Fatalf("the corrupt replica served %q = %q", kv.GetKey(), kv.GetValue())
			}
		}
	}
	sawReopen := false
	r.waitFor(20*time.Second, "the corrupt replica to be replaced", func() bool {
		d := r.describe()
		if state(d, bad) == api.ReplicaState_REPLICA_STATE_CATCHING_UP {
			sawReopen = true
		}
		return !hosts(d, bad)
	})
	if sawReopen {
		t.Errorf("the corrupt replica reported itself catching up (reopening?) rather than failed")
	}
	r.waitInSync(3)
	r.waitProgress(50)
	r.halt()
	r.checkAll()
}

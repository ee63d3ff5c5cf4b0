package tablemaster

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/replication/stream"
)

// cowWorkload is a random sequence of commands of every domain: tables,
// servers (register, down, forget, back), partition logs, bulk versions,
// coprocessors and stream manager commands, some of them refused.
func cowWorkload(r *rand.Rand, st func() *State, n int) func(i int) Command {
	return func(i int) Command {
		cur := st()
		srv := fmt.Sprintf("srv-%d", 1+r.IntN(6))
		switch k := r.IntN(12); {
		case i < 6:
			return register("", fmt.Sprintf("h%d:1", i), fmt.Sprintf("fd%d", i%4))
		case k == 0:
			return createTable("default", fmt.Sprintf("t%d", r.IntN(8)), uint32(1+r.IntN(3)))
		case k == 1:
			return Command{Payload: CreateTable{Tenant: "default", Table: fmt.Sprintf("b%d", r.IntN(3)), Kind: api.TableKind_TABLE_KIND_BULK, Options: &TableOptions{Partitions: 2}}}
		case k == 2:
			return Command{Payload: DropTable{Tenant: "default", Table: fmt.Sprintf("t%d", r.IntN(8))}}
		case k == 3:
			return Command{UnixMs: int64(i), Payload: ServerDown{ServerID: srv, Draining: r.IntN(2) == 0}}
		case k == 4:
			return register(srv, fmt.Sprintf("h%d:%d", r.IntN(6), r.IntN(2)), "")
		case k == 5:
			return Command{Payload: ForgetServer{ServerID: srv, AcceptDataLoss: true}}
		case k == 6 || k == 7:
			for _, t := range cur.tablesByID() {
				for _, p := range t.Partitions {
					if p.Log != nil && len(p.Replicas) > 0 && r.IntN(4) == 0 {
						if p.Log.Extent == 0 {
							return Command{Payload: PartitionLogAllocated{PartitionID: p.ID, Epoch: p.Epoch, Servers: serversOf(&p), Extent: p.Log.Last + 1}}
						}
						return Command{Payload: PartitionLogReset{PartitionID: p.ID, Epoch: p.Epoch, Extent: p.Log.Extent}}
					}
				}
			}
			return Command{Payload: PlaceShort{}}
		case k == 8:
			return Command{Payload: StreamCommand{StreamCmd: &stream.Command{Op: stream.OpNodeLoad, Node: srv, UsedBytes: int64(r.IntN(1000))}}}
		case k == 9:
			return Command{Payload: BulkPublish{Tenant: "default", Table: fmt.Sprintf("b%d", r.IntN(3)), Version: uint64(1 + r.IntN(4)), Files: []BulkFile{{Size: 10, CRC: 1}, {Size: 20, CRC: 2}}}}
		case k == 10:
			return Command{Payload: CoprocDeploy{Tenant: "default", Table: fmt.Sprintf("t%d", r.IntN(8)), Name: "c", Coproc: &CoprocVersion{SHA256: fmt.Sprintf("%064x", r.IntN(3)), Size: 10}}}
		default:
			return Command{Payload: PlaceShort{}}
		}
	}
}

// A command applied copy-on-write to a published state gives the same
// state as applied to a deep copy, and leaves the published state as it
// was: the Master's readers keep an immutable view.
func TestCopyOnWriteMatchesClone(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	cur := NewState()
	mustApply(t, cur, Command{Payload: CreateTenant{Tenant: "default"}})
	next := cowWorkload(r, func() *State { return cur }, 400)
	applied := 0
	for i := range 400 {
		cmd := next(i)
		before := cur.Clone()
		got, gotRes, _, gotErr := successor(cur, cmd)
		want := cur.Clone()
		wantRes, wantErr := want.Apply(cmd)
		if !reflect.DeepEqual(cur, before) {
			t.Fatalf("step %d %+v modified the published state", i, cmd)
		}
		if (gotErr == nil) != (wantErr == nil) {
			t.Fatalf("step %d %+v: error %v, on a deep copy %v", i, cmd, gotErr, wantErr)
		}
		if gotErr != nil {
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("step %d %+v: the copy-on-write state differs from the deep copy's", i, cmd)
		}
		if gotRes.Changed != wantRes.Changed || !reflect.DeepEqual(gotRes.Moved, wantRes.Moved) {
			t.Fatalf("step %d %+v: result %+v, on a deep copy %+v", i, cmd, gotRes, wantRes)
		}
		if gotRes.Changed {
			applied++
		}
		cur = got
	}
	if applied < 100 {
		t.Fatalf("only %d of 400 commands changed the state", applied)
	}
}

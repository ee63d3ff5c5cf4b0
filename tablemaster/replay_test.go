package tablemaster

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/replication/stream"
)

// writeFixture regenerates testdata/replay from the scenario below. The
// fixture is the compatibility record of the command log and snapshot
// formats: it was written by the code of the day it was made (before the
// typed commands of issue 31), so regenerate it only to add a command the
// old code did not know, never to make a format change pass.
var writeFixture = flag.Bool("write-fixture", false, "rewrite testdata/replay from the replay scenario")

const replayDir = "testdata/replay"

// replayRun drives the scenario through a real store as the Master does:
// each command validated (ApplyChecked), the command it resolves appended
// and fsynced. Every command that applies is logged, no-ops included, as
// a replicated log holds them (a duplicate request id, say).
type replayRun struct {
	t   *testing.T
	s   *store
	st  *State
	seq uint64
	now int64
}

func (r *replayRun) do(c Command) Result {
	r.t.Helper()
	r.now += 10
	if c.UnixMs == 0 {
		c.UnixMs = r.now
	}
	res, logged, err := r.st.ApplyChecked(c)
	if err != nil {
		r.t.Fatalf("seq %d: Apply(%+v): %v", r.seq+1, c, err)
	}
	r.seq++
	if err := r.s.append(logEntry{Seq: r.seq, Cmd: logged}); err != nil {
		r.t.Fatal(err)
	}
	return res
}

func (r *replayRun) table(name string) *Table { return r.st.Tables[tableKey("acme", name)] }

// replayScenario exercises every op and most of their fields.
func replayScenario(r *replayRun) {
	t := r.t
	key := func(b byte) []byte { return bytes.Repeat([]byte{b}, TenantKeyBytes) }
	r.do(Command{RequestID: "req-tenant-1", Payload: CreateTenant{Tenant: "acme", Keys: [][]byte{key(1), key(2)}, Quota: &TenantQuota{StoredBytes: 1 << 30, ReadOpsPerSec: 500}}})
	if res := r.do(Command{RequestID: "req-tenant-1", Payload: CreateTenant{Tenant: "acme", Keys: [][]byte{key(1), key(2)}}}); !res.Duplicate {
		t.Fatal("duplicate create_tenant not seen as one")
	}
	r.do(Command{Payload: CreateTenant{Tenant: "scratch"}})
	r.do(Command{Payload: RotateTenantKey{Tenant: "acme", KeyIndex: 2, Keys: [][]byte{key(3)}}})
	r.do(Command{Payload: SetTenantQuota{Tenant: "acme", Quota: &TenantQuota{MemoryBytes: 1 << 20, WriteOpsPerSec: 100, CoprocCPUMsPerSec: 50}}})
	r.do(Command{Payload: DeleteTenant{Tenant: "scratch"}})

	for i, fd := range []string{"rack-a", "rack-b", "rack-c", "rack-d", "rack-e"} {
		r.do(Command{Payload: RegisterServer{Addr: fmt.Sprintf("h%d:7000", i+1), InternalAddr: fmt.Sprintf("h%d:7001", i+1), FaultDomain: fd, BulkCapacity: 1 << 40, Incarnation: uint64(100 + i)}})
	}
	r.do(Command{Payload: RegisterServer{ServerID: "srv-extra", Addr: "h9:7000"}}) // a domain of its own

	r.do(Command{RequestID: "req-table-mem", Payload: CreateTable{Tenant: "acme", Table: "mem", Kind: api.TableKind_TABLE_KIND_POINT, Options: &TableOptions{Partitions: 2, Storage: StorageMemory}}})
	if res := r.do(Command{RequestID: "req-table-mem", Payload: CreateTable{Tenant: "acme", Table: "mem", Kind: api.TableKind_TABLE_KIND_POINT, Options: &TableOptions{Partitions: 2, Storage: StorageMemory}}}); !res.Duplicate {
		t.Fatal("duplicate create_table not seen as one")
	}
	r.do(Command{Payload: CreateTable{Tenant: "acme", Table: "disk", Kind: api.TableKind_TABLE_KIND_POINT, Options: &TableOptions{Partitions: 4, Replication: 3, Storage: StorageSSD, Durability: DurabilityLazy, Compression: CompressionS2, DefaultTTLMs: 60000}}})
	r.do(Command{Payload: CreateTable{Tenant: "acme", Table: "ord", Kind: api.TableKind_TABLE_KIND_ORDERED, Options: &TableOptions{Partitions: 3, Replication: 2, SplitPoints: [][]byte{[]byte("g"), []byte("p")}}}})
	r.do(Command{Payload: CreateTable{Tenant: "acme", Table: "bulk", Kind: api.TableKind_TABLE_KIND_BULK, Options: &TableOptions{Partitions: 2, BulkRetainedVersions: 3}}})
	r.do(Command{Payload: CreateTable{Tenant: "acme", Table: "solo", Kind: api.TableKind_TABLE_KIND_POINT, Options: &TableOptions{Partitions: 6, Replication: 1, Storage: StorageSSD}}})
	r.do(Command{Payload: CreateTable{Tenant: "acme", Table: "gone", Kind: api.TableKind_TABLE_KIND_POINT, Options: &TableOptions{Partitions: 1, Storage: StorageMemory}}})
	r.do(Command{Payload: DropTable{Tenant: "acme", Table: "gone"}})

	// Partition logs: allocate every log of disk and ord, reset one.
	for _, name := range []string{"disk", "ord"} {
		for _, p := range r.table(name).Partitions {
			r.do(Command{Payload: PartitionLogAllocated{PartitionID: p.ID, Epoch: p.Epoch, Servers: r.st.liveServersOf(&p), Extent: 100 + p.ID}})
		}
	}
	p := r.table("disk").Partitions[0]
	r.do(Command{Payload: PartitionLogReset{PartitionID: p.ID, Epoch: p.Epoch, Extent: p.Log.Extent}})
	p = r.table("disk").Partitions[0]
	r.do(Command{Payload: PartitionLogAllocated{PartitionID: p.ID, Epoch: p.Epoch, Servers: r.st.liveServersOf(&p), Extent: 200}})

	// A move of a primary: it leaves a handoff, which its done clears.
	p = r.table("disk").Partitions[1]
	from := primaryID(&p)
	res := r.do(Command{Payload: MoveReplica{PartitionID: p.ID, ServerID: from}})
	to := r.table("disk").Partitions[1].Move.To
	r.do(Command{Payload: MoveDone{PartitionID: p.ID, ServerID: from, To: to}})
	if len(res.Moved) != 1 {
		t.Fatalf("move: %+v", res)
	}
	p = r.table("disk").Partitions[1]
	if p.Handoff == nil {
		t.Fatal("moving a primary off a live server left no handoff")
	}
	r.do(Command{Payload: HandoffDone{Handoffs: map[uint64]uint64{p.ID: p.Handoff.Version}}})

	// A replica fails; the proposer picks the new primary.
	p = r.table("ord").Partitions[2]
	var sec string
	for _, rp := range p.Replicas {
		if rp.Role != api.ReplicaRole_REPLICA_ROLE_PRIMARY {
			sec = rp.ServerID
		}
	}
	r.do(Command{Payload: ReplicaFailed{PartitionID: p.ID, ServerID: primaryID(&p), Promote: map[uint64]string{p.ID: sec}}})

	// Bulk: publish, store, load everywhere; a delta; roll back; a
	// rollout paused, resumed, advanced.
	bulkVersion := func(v, base uint64, seed uint32) {
		fs := []BulkFile{{Size: 100, CRC: seed, Records: 10}, {Size: 200, CRC: seed + 1, Records: 20}}
		r.do(Command{Payload: BulkPublish{Tenant: "acme", Table: "bulk", Version: v, BaseVersion: base, Files: fs}})
		tb := r.table("bulk")
		for i := range tb.Partitions {
			name := BulkStreamName(tb.ID, v, i)
			r.do(Command{Payload: StreamCommand{StreamCmd: &stream.Command{Op: stream.OpCreateStream, Stream: name}}})
			sr := r.do(Command{Payload: StreamCommand{StreamCmd: &stream.Command{Op: stream.OpAllocate, Stream: name}}})
			r.do(Command{Payload: StreamCommand{StreamCmd: &stream.Command{Op: stream.OpSeal, Extent: sr.Stream.Extent, Length: 1000}}})
			r.do(Command{Payload: BulkStored{Tenant: "acme", Table: "bulk", Version: v, PartitionID: uint64(i), Stream: name}})
		}
		for range 20 {
			r.now += 2 * bulkDrainMs
			changed := r.do(Command{Payload: BulkAdvance{Tenant: "acme", Table: "bulk"}}).Changed
			tb := r.table("bulk")
			for i, p := range tb.Partitions {
				for k := range p.Replicas {
					for _, x := range tb.copyHolds(i, &p.Replicas[k]) {
						f := tb.Bulk.Versions[tb.Bulk.version(x)].Files[i]
						changed = r.do(Command{Payload: BulkLoaded{Tenant: "acme", Table: "bulk", Version: x, PartitionID: p.ID, ServerID: p.Replicas[k].ServerID, File: &f}}).Changed || changed
					}
				}
			}
			if !changed {
				return
			}
		}
		t.Fatalf("bulk version %d never settled", v)
	}
	bulkVersion(1, 0, 10)
	bulkVersion(2, 1, 20)
	if cur := r.table("bulk").Bulk.Current; cur != 2 {
		t.Fatalf("bulk serves %d, want 2", cur)
	}
	r.do(Command{Payload: BulkRollback{Tenant: "acme", Table: "bulk", Version: 1}})
	// A failed load report, and a rollout left under way.
	fs3 := []BulkFile{{Size: 300, CRC: 30, Records: 30}, {Size: 400, CRC: 31, Records: 40}}
	r.do(Command{Payload: BulkPublish{Tenant: "acme", Table: "bulk", Version: 3, Files: fs3}})
	tb := r.table("bulk")
	if tb.Bulk.Rollout != nil {
		r.do(Command{Payload: BulkRolloutAction{Tenant: "acme", Table: "bulk", Action: RolloutPause}})
		r.do(Command{Payload: BulkRolloutAction{Tenant: "acme", Table: "bulk", Action: RolloutResume}})
	}
	bp := tb.Partitions[0]
	f := fs3[0]
	r.do(Command{Payload: BulkLoaded{Tenant: "acme", Table: "bulk", Version: 3, PartitionID: bp.ID, ServerID: bp.Replicas[0].ServerID, File: &f, Error: "verify: checksum mismatch"}})

	// Coprocessors: deploy two versions, ready everywhere, roll back.
	for v, sum := range []string{"a", "b"} {
		r.do(Command{RequestID: fmt.Sprintf("req-coproc-%d", v), Payload: CoprocDeploy{Tenant: "acme", Table: "disk", Name: "audit", Coproc: &CoprocVersion{SHA256: string(bytes.Repeat([]byte(sum), 64)), Size: 4096, Methods: []string{"on_put"}, Writes: true}}})
		for _, id := range r.table("disk").hosts() {
			r.do(Command{Payload: CoprocReady{Tenant: "acme", Table: "disk", Name: "audit", Version: uint64(v + 1), ServerID: id}})
		}
	}
	r.do(Command{Payload: CoprocRollback{Tenant: "acme", Table: "disk", Name: "audit", Version: 1}})

	// Stream commands of their own: a stream written and deleted, loads.
	r.do(Command{Payload: StreamCommand{StreamCmd: &stream.Command{Op: stream.OpCreateStream, Stream: "scratch/1"}}})
	r.do(Command{Payload: StreamCommand{StreamCmd: &stream.Command{Op: stream.OpNodeLoad, Node: "srv-1", UsedBytes: 12345}}})
	r.do(Command{Payload: StreamCommand{StreamCmd: &stream.Command{Op: stream.OpDeleteStream, Stream: "scratch/1"}}})

	// Servers: a restart (down with Keep, back), a drain, a replace
	// with holds, a forced move, a forget with data loss, cleared.
	r.do(Command{Payload: ServerDown{ServerID: "srv-2", Keep: true}})
	r.do(Command{Payload: RegisterServer{ServerID: "srv-2", Addr: "h2:7000", InternalAddr: "h2:7001", FaultDomain: "rack-b", Incarnation: 202, HolderSilent: true}})
	r.do(Command{Payload: ServerDown{ServerID: "srv-3", Draining: true}})
	r.do(Command{Payload: ServerDown{ServerID: "srv-3"}})
	r.do(Command{Payload: ServerDown{ServerID: "srv-4", Keep: true}})
	var hold []uint64
	for _, p := range r.table("disk").Partitions {
		if hostsReplica(&p, "srv-4") {
			hold = append(hold, p.ID)
			break
		}
	}
	r.do(Command{Payload: ServerDown{ServerID: "srv-4", Replace: true, Hold: hold}})
	r.do(Command{Payload: ServerDown{ServerID: "srv-4", Force: true}})
	r.do(Command{Payload: PlaceShort{}})
	r.do(Command{Payload: ServerDown{ServerID: "srv-extra"}})
	res = r.do(Command{Payload: ForgetServer{ServerID: "srv-3", AcceptDataLoss: true}})
	r.do(Command{Payload: ForgetServer{ServerID: "srv-extra", AcceptDataLoss: true}})
	// The live server holding most of solo's only copies dies and is
	// forgotten: its partitions are lost; one loss is cleared, the
	// others stay on record.
	held := map[string]int{}
	for _, p := range r.table("solo").Partitions {
		for _, rp := range p.Replicas {
			if r.st.Servers[rp.ServerID].Alive {
				held[rp.ServerID]++
			}
		}
	}
	victim := ""
	for _, id := range r.st.ServerIDs() {
		if victim == "" || held[id] > held[victim] {
			victim = id
		}
	}
	r.do(Command{Payload: ServerDown{ServerID: victim}})
	res = r.do(Command{Payload: ForgetServer{ServerID: victim, AcceptDataLoss: true}})
	if len(res.Lost) < 2 {
		t.Fatalf("forget %s lost %v, want 2 partitions or more", victim, res.Lost)
	}
	r.do(Command{Payload: ClearDataLoss{Tenant: "acme", Table: "solo", PartitionID: res.Lost[0]}})
	r.do(Command{Payload: ClearDataLoss{Tenant: "acme", Table: "ord"}}) // nothing lost: a no-op
}

// TestReplayFixture opens the store saved in testdata/replay with today's
// code and requires the state it was saved with: old command logs and
// snapshots replay. The log is also replayed alone, from the empty state.
func TestReplayFixture(t *testing.T) {
	if *writeFixture {
		writeReplayFixture(t)
	}
	want, err := os.ReadFile(filepath.Join(replayDir, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	// openStore may cut a torn tail or write a log: work on a copy.
	dir := t.TempDir()
	for _, name := range []string{logFileName, snapFileName} {
		b, err := os.ReadFile(filepath.Join(replayDir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s, st, seq, err := openStore(dir, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	if s.records == 0 || seq <= 1 {
		t.Fatalf("fixture replays %d records to seq %d", s.records, seq)
	}
	checkReplayState(t, "snapshot + log", st, want)

	logData, err := os.ReadFile(filepath.Join(replayDir, logFileName))
	if err != nil {
		t.Fatal(err)
	}
	alone := NewState()
	if _, _, last, err := replayLog(logData, alone, 0, testLogger(t)); err != nil || last != seq {
		t.Fatalf("replay of the log alone: last seq %d (want %d), %v", last, seq, err)
	}
	checkReplayState(t, "log alone", alone, want)
}

func checkReplayState(t *testing.T, what string, st *State, want []byte) {
	t.Helper()
	got, err := json.MarshalIndent(st, "", "\t")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		p := filepath.Join(t.TempDir(), "state.json")
		_ = os.WriteFile(p, got, 0o644)
		t.Fatalf("%s: the replayed state differs from %s/state.json (got: %s)", what, replayDir, p)
	}
}

// writeReplayFixture runs the scenario through a store, snapshots it two
// thirds of the way without trimming the log (a crash between the
// snapshot's rename and the log's trim: reopening replays the log past
// the snapshot, and the log alone still holds every command), and saves
// the log, the snapshot and the final state.
func writeReplayFixture(t *testing.T) {
	dir := t.TempDir()
	s, st, seq, err := openStore(dir, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	r := &replayRun{t: t, s: s, st: st, seq: seq, now: 1_700_000_000_000}
	replayScenario(r)
	total := r.seq
	if err := s.close(); err != nil {
		t.Fatal(err)
	}
	// Replay the log up to two thirds to get the snapshot's state.
	logData, err := os.ReadFile(filepath.Join(dir, logFileName))
	if err != nil {
		t.Fatal(err)
	}
	snapSeq := total * 2 / 3
	body, _ := checkFileHeader(logData, logMagic)
	payloads, _, _, err := decodeRecords(body)
	if err != nil {
		t.Fatal(err)
	}
	mid := NewState()
	for _, p := range payloads[:snapSeq] {
		var e logEntry
		if err := json.Unmarshal(p, &e); err != nil {
			t.Fatal(err)
		}
		if _, err := mid.ApplyLogged(e.Cmd); err != nil {
			t.Fatal(err)
		}
	}
	if err := writeSnapshot(dir, mid, snapSeq); err != nil {
		t.Fatal(err)
	}
	final, err := json.MarshalIndent(r.st, "", "\t")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(replayDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{logFileName: logData, "state.json": final} {
		if err := os.WriteFile(filepath.Join(replayDir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	snap, err := os.ReadFile(filepath.Join(dir, snapFileName))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(replayDir, snapFileName), snap, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s: %d commands, snapshot at seq %d", replayDir, total, snapSeq)
}

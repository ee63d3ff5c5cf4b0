package tablemaster

import (
	"bytes"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/replication/stream"
)

// TestTranscripts runs the state machine's transcripts: testdata/<domain>/
// *.txt, each a scenario of commands and the state of the domain they
// leave (the domain is the file's directory). Every command applies
// through Apply (the proposal path) and prints what it changed: "ok", the
// result's lists, or the error; when it changed the state, the domain's
// dump follows. Rewrite the expectations with
//
//	go test ./tablemaster -run TestTranscripts -rewrite
//
// Commands (key=value arguments; lists are comma-separated):
//
//	create-tenant name= [keys] [quota=stored:N,memory:N,read:N,write:N,cpu:N] [req=]
//	delete-tenant name=            rotate-key name= index= [seed=]
//	set-quota name= [quota=...]
//	create-table [tenant=acme] name= [kind=point|ordered|bulk] [partitions=] [replication=]
//	             [storage=] [durability=] [compression=] [splits=a,b] [retain=] [ttl=] [req=]
//	             [min-parts=] [max-parts=] [split-size=] [split-qps=]
//	drop-table [tenant=acme] name=
//	alter-table [tenant=acme] name= [min=] [max=] [size=] [qps=]   (unset: unchanged)
//	split partition= [hash=] [key=] [reason=load|size]   split-done partition= [lsn=]
//	register-server [id=] [addr=] [domain=] [internal=] [capacity=] [inc=] [silent]
//	server-down id= [draining] [keep] [replace] [force] [hold=pid,...] [promote=pid:srv,...]
//	forget-server id= [accept-loss]          clear-loss [tenant=acme] table= [partition=]
//	place
//	partition-log partition= extent= [epoch=] [servers=a,b]
//	partition-log-reset partition= [extent=] [epoch=] [servers=a,b]
//	move partition= from= [to=]     move-done partition= from= to=
//	replica-failed partition= server= [promote=srv]
//	merge partition=                  merge-done partition= lsn= right-lsn=
//	handoff-done partition= [version=]
//	write-stream name= [length=]    (create, allocate and seal a stream)
//	stream op= [stream=] [node=] [extent=] [length=] [used=]
//	bulk-publish [table=b] version= [base=] [files=N] [seed=]
//	bulk-stored [table=b] version= index=         (its stream written first)
//	bulk-loaded [table=b] version= partition= server= [error=]
//	bulk-load-all [table=b]          (reports every copy's files loaded until nothing changes)
//	bulk-rollback [table=b] version=   bulk-rollout [table=b] action=   bulk-advance [table=b]
//	coproc-deploy [table=t] [name=c] sha=x [size=] [methods=a,b] [writes]
//	coproc-ready [table=t] [name=c] version= server=
//	coproc-rollback [table=t] [name=c] version=
//	tick [ms=]   (advance the clock commands carry; default 1000)
//	dump [domain=]
//
// Every command also takes unix-ms= (else the clock) and req= (a request id).
func TestTranscripts(t *testing.T) {
	datadriven.Walk(t, "testdata/transcripts", func(t *testing.T, path string) {
		domain := filepath.Base(filepath.Dir(path))
		tr := &transcript{s: NewState(), now: 1000, domain: domain}
		datadriven.RunTest(t, path, tr.run)
	})
}

type transcript struct {
	s      *State
	now    int64
	domain string
}

func (tr *transcript) run(t *testing.T, d *datadriven.TestData) string {
	switch d.Cmd {
	case "tick":
		ms := int64(1000)
		d.MaybeScanArgs(t, "ms", &ms)
		tr.now += ms
		return fmt.Sprintf("now %d\n", tr.now)
	case "dump":
		domain := tr.domain
		d.MaybeScanArgs(t, "domain", &domain)
		return dumpDomain(tr.s, domain)
	case "bulk-load-all":
		return tr.bulkLoadAll(t, d)
	}
	cmd, err := tr.command(t, d)
	if err != nil {
		return fmt.Sprintf("bad command: %v\n", err)
	}
	return tr.apply(cmd)
}

func (tr *transcript) apply(cmd Command) string {
	res, err := tr.s.Apply(cmd)
	if err != nil {
		return fmt.Sprintf("error: %v\n", err)
	}
	var b strings.Builder
	b.WriteString(resultLine(res))
	if res.Changed {
		b.WriteString(dumpDomain(tr.s, tr.domain))
	}
	return b.String()
}

func resultLine(res Result) string {
	var parts []string
	if res.Duplicate {
		parts = append(parts, "duplicate")
	}
	if !res.Changed {
		parts = append(parts, "no change")
	}
	if res.ServerID != "" {
		parts = append(parts, "server="+res.ServerID)
	}
	if res.Table != nil && res.Changed {
		parts = append(parts, fmt.Sprintf("table=%s/%s", res.Table.Tenant, res.Table.Name))
	}
	for _, l := range []struct {
		name string
		ids  []uint64
	}{{"moved", res.Moved}, {"held", res.Held}, {"lost", res.Lost}} {
		if len(l.ids) > 0 {
			parts = append(parts, fmt.Sprintf("%s=%v", l.name, l.ids))
		}
	}
	if res.Version != 0 {
		parts = append(parts, fmt.Sprintf("version=%d", res.Version))
	}
	if res.Stream.Extent != 0 {
		parts = append(parts, fmt.Sprintf("extent=%d", res.Stream.Extent))
	}
	if len(parts) == 0 {
		return "ok\n"
	}
	return "ok: " + strings.Join(parts, " ") + "\n"
}

// args reads a command's arguments.
type args struct {
	t *testing.T
	d *datadriven.TestData
}

func (a args) has(k string) bool { return a.d.HasArg(k) }

func (a args) str(k, def string) string {
	for _, c := range a.d.CmdArgs {
		if c.Key == k {
			if len(c.Vals) == 0 {
				return ""
			}
			return strings.Join(c.Vals, ",")
		}
	}
	return def
}

func (a args) list(k string) []string {
	if v := a.str(k, ""); v != "" {
		return strings.Split(v, ",")
	}
	return nil
}

func (a args) u64(k string, def uint64) uint64 {
	v := a.str(k, "")
	if v == "" {
		return def
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		a.t.Fatalf("%s: %s=%q: %v", a.d.Pos, k, v, err)
	}
	return n
}

func (a args) u64s(k string) []uint64 {
	var out []uint64
	for _, v := range a.list(k) {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			a.t.Fatalf("%s: %s=%q: %v", a.d.Pos, k, v, err)
		}
		out = append(out, n)
	}
	return out
}

func (a args) quota() *TenantQuota {
	if !a.has("quota") {
		return nil
	}
	q := &TenantQuota{}
	for _, kv := range a.list("quota") {
		k, v, _ := strings.Cut(kv, ":")
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			a.t.Fatalf("%s: quota %q: %v", a.d.Pos, kv, err)
		}
		switch k {
		case "stored":
			q.StoredBytes = n
		case "memory":
			q.MemoryBytes = n
		case "read":
			q.ReadOpsPerSec = n
		case "write":
			q.WriteOpsPerSec = n
		case "cpu":
			q.CoprocCPUMsPerSec = n
		default:
			a.t.Fatalf("%s: quota %q: unknown limit", a.d.Pos, kv)
		}
	}
	return q
}

func transcriptKey(seed byte) []byte { return bytes.Repeat([]byte{seed}, TenantKeyBytes) }

func transcriptFiles(n int, seed uint64) []BulkFile {
	fs := make([]BulkFile, n)
	for i := range fs {
		fs[i] = BulkFile{Size: uint64(100 * (i + 1)), CRC: uint32(seed*10) + uint32(i), Records: 10}
	}
	return fs
}

var transcriptKinds = map[string]api.TableKind{
	"point": api.TableKind_TABLE_KIND_POINT, "ordered": api.TableKind_TABLE_KIND_ORDERED, "bulk": api.TableKind_TABLE_KIND_BULK,
}

// command builds the command d names.
func (tr *transcript) command(t *testing.T, d *datadriven.TestData) (Command, error) {
	f, err := tr.flatOf(t, d)
	return Command{UnixMs: f.UnixMs, RequestID: f.RequestID, Payload: payloadOf(&f)}, err
}

// flatOf builds the command d names in its flat form, whose fields its
// arguments fill one by one.
func (tr *transcript) flatOf(t *testing.T, d *datadriven.TestData) (flatCommand, error) {
	a := args{t, d}
	s := tr.s
	c := flatCommand{UnixMs: int64(a.u64("unix-ms", uint64(tr.now))), RequestID: a.str("req", "")}
	tenant := a.str("tenant", "acme")
	switch d.Cmd {
	case "create-tenant":
		c.Op, c.Tenant, c.Quota = OpCreateTenant, a.str("name", ""), a.quota()
		if a.has("keys") {
			c.Keys = [][]byte{transcriptKey(1), transcriptKey(2)}
		}
	case "delete-tenant":
		c.Op, c.Tenant = OpDeleteTenant, a.str("name", "")
	case "rotate-key":
		c.Op, c.Tenant, c.KeyIndex = OpRotateTenantKey, a.str("name", ""), int(a.u64("index", 0))
		c.Keys = [][]byte{transcriptKey(byte(a.u64("seed", 9)))}
	case "set-quota":
		c.Op, c.Tenant, c.Quota = OpSetTenantQuota, a.str("name", ""), a.quota()
	case "create-table":
		kind, ok := transcriptKinds[a.str("kind", "point")]
		if !ok {
			return c, fmt.Errorf("kind %q", a.str("kind", ""))
		}
		o := &TableOptions{Partitions: uint32(a.u64("partitions", 0)), Replication: uint32(a.u64("replication", 0)),
			Storage: a.str("storage", ""), Durability: a.str("durability", ""), Compression: a.str("compression", ""),
			BulkRetainedVersions: uint32(a.u64("retain", 0)), DefaultTTLMs: a.u64("ttl", 0),
			MinPartitions: uint32(a.u64("min-parts", 0)), MaxPartitions: uint32(a.u64("max-parts", 0)),
			SplitSizeBytes: a.u64("split-size", 0), SplitQPS: a.u64("split-qps", 0)}
		for _, sp := range a.list("splits") {
			o.SplitPoints = append(o.SplitPoints, []byte(sp))
		}
		c.Op, c.Tenant, c.Table, c.Kind, c.Options = OpCreateTable, tenant, a.str("name", ""), kind, o
	case "drop-table":
		c.Op, c.Tenant, c.Table = OpDropTable, tenant, a.str("name", "")
	case "alter-table":
		set := &SplitSettings{}
		if t, err := s.Table(tenant, a.str("name", "")); err == nil {
			*set = t.Options.splitSettings()
		}
		set.MinPartitions = uint32(a.u64("min", uint64(set.MinPartitions)))
		set.MaxPartitions = uint32(a.u64("max", uint64(set.MaxPartitions)))
		set.SplitSizeBytes = a.u64("size", set.SplitSizeBytes)
		set.SplitQPS = a.u64("qps", set.SplitQPS)
		c.Op, c.Tenant, c.Table, c.SplitSettings = OpAlterTable, tenant, a.str("name", ""), set
	case "split":
		c.Op, c.PartitionID, c.Hash, c.SplitReason = OpSplitPartition, a.u64("partition", 0), a.u64("hash", 0), a.str("reason", "")
		if a.has("key") {
			c.Key = []byte(a.str("key", ""))
		}
	case "split-done":
		c.Op, c.PartitionID, c.LSN = OpSplitDone, a.u64("partition", 0), a.u64("lsn", 1)
	case "register-server":
		c.Op, c.ServerID, c.Addr, c.FaultDomain = OpRegisterServer, a.str("id", ""), a.str("addr", ""), a.str("domain", "")
		c.InternalAddr, c.BulkCapacity, c.Incarnation, c.HolderSilent = a.str("internal", ""), a.u64("capacity", 0), a.u64("inc", 0), a.has("silent")
		if c.Addr == "" {
			c.Addr = fmt.Sprintf("h%d:7000", s.NextServerID)
		}
	case "server-down":
		c.Op, c.ServerID, c.Draining, c.Keep, c.Replace, c.Force = OpServerDown, a.str("id", ""), a.has("draining"), a.has("keep"), a.has("replace"), a.has("force")
		c.Hold = a.u64s("hold")
		for _, kv := range a.list("promote") {
			pid, srv, _ := strings.Cut(kv, ":")
			n, err := strconv.ParseUint(pid, 10, 64)
			if err != nil {
				return c, fmt.Errorf("promote %q: %w", kv, err)
			}
			if c.Promote == nil {
				c.Promote = map[uint64]string{}
			}
			c.Promote[n] = srv
		}
	case "forget-server":
		c.Op, c.ServerID, c.AcceptDataLoss = OpForgetServer, a.str("id", ""), a.has("accept-loss")
	case "clear-loss":
		c.Op, c.Tenant, c.Table, c.PartitionID = OpClearDataLoss, tenant, a.str("table", ""), a.u64("partition", 0)
	case "place":
		c.Op = OpPlace
	case "partition-log", "partition-log-reset":
		c.Op, c.PartitionID, c.Extent = OpPartitionLog, a.u64("partition", 0), a.u64("extent", 0)
		if d.Cmd == "partition-log-reset" {
			c.Op = OpPartitionLogReset
		}
		_, p := s.partition(c.PartitionID)
		if p != nil {
			c.Epoch = p.Epoch
			if c.Op == OpPartitionLog {
				c.Servers = s.liveServersOf(p)
			}
		}
		c.Epoch = a.u64("epoch", c.Epoch)
		if a.has("servers") {
			c.Servers = a.list("servers")
		}
	case "move":
		c.Op, c.PartitionID, c.ServerID, c.To = OpMoveReplica, a.u64("partition", 0), a.str("from", ""), a.str("to", "")
	case "merge":
		c.Op, c.PartitionID = OpMergePartitions, a.u64("partition", 0)
	case "merge-done":
		c.Op, c.PartitionID, c.LSN, c.RightLSN = OpMergeDone, a.u64("partition", 0), a.u64("lsn", 0), a.u64("right-lsn", 0)
	case "transfer-primary":
		c.Op, c.PartitionID, c.ServerID, c.To = OpTransferPrimary, a.u64("partition", 0), a.str("from", ""), a.str("to", "")
	case "move-done":
		c.Op, c.PartitionID, c.ServerID, c.To = OpMoveDone, a.u64("partition", 0), a.str("from", ""), a.str("to", "")
	case "replica-failed":
		c.Op, c.PartitionID, c.ServerID = OpReplicaFailed, a.u64("partition", 0), a.str("server", "")
		if a.has("promote") {
			c.Promote = map[uint64]string{c.PartitionID: a.str("promote", "")}
		}
	case "handoff-done":
		pid := a.u64("partition", 0)
		v := a.u64("version", 0)
		if _, p := s.partition(pid); p != nil && p.Handoff != nil && v == 0 {
			v = p.Handoff.Version
		}
		c.Op, c.Handoffs = OpHandoffDone, map[uint64]uint64{pid: v}
	case "write-stream":
		name := a.str("name", "")
		for _, sc := range []stream.Command{{Op: stream.OpCreateStream, Stream: name}, {Op: stream.OpAllocate, Stream: name}} {
			res, err := s.Apply(Command{UnixMs: c.UnixMs, Payload: StreamCommand{StreamCmd: &sc}})
			if err != nil {
				return c, fmt.Errorf("write stream %s: %w", name, err)
			}
			c.Op, c.StreamCmd = OpStream, &stream.Command{Op: stream.OpSeal, Extent: res.Stream.Extent, Length: int64(a.u64("length", 1000))}
		}
	case "stream":
		c.Op, c.StreamCmd = OpStream, &stream.Command{Op: stream.Op(a.str("op", "")), Stream: a.str("stream", ""), Node: a.str("node", ""),
			Extent: a.u64("extent", 0), Length: int64(a.u64("length", 0)), UsedBytes: int64(a.u64("used", 0))}
	case "bulk-publish":
		c.Op, c.Tenant, c.Table, c.Version, c.BaseVersion = OpBulkPublish, tenant, a.str("table", "b"), a.u64("version", 0), a.u64("base", 0)
		c.Files = transcriptFiles(int(a.u64("files", 2)), a.u64("seed", c.Version))
	case "bulk-stored":
		c.Op, c.Tenant, c.Table, c.Version, c.PartitionID = OpBulkStored, tenant, a.str("table", "b"), a.u64("version", 0), a.u64("index", 0)
		tb := s.Tables[tableKey(tenant, c.Table)]
		if tb == nil {
			return c, fmt.Errorf("no table %s", c.Table)
		}
		c.Stream = BulkStreamName(tb.ID, c.Version, int(c.PartitionID))
		for _, sc := range []stream.Command{{Op: stream.OpCreateStream, Stream: c.Stream}, {Op: stream.OpAllocate, Stream: c.Stream}} {
			res, err := s.Apply(Command{UnixMs: c.UnixMs, Payload: StreamCommand{StreamCmd: &sc}})
			if err != nil {
				return c, fmt.Errorf("write stream %s: %w", c.Stream, err)
			}
			if sc.Op == stream.OpAllocate {
				if _, err := s.Apply(Command{Payload: StreamCommand{StreamCmd: &stream.Command{Op: stream.OpSeal, Extent: res.Stream.Extent, Length: 1000}}}); err != nil {
					return c, err
				}
			}
		}
	case "bulk-loaded":
		c.Op, c.Tenant, c.Table, c.Version, c.PartitionID = OpBulkLoaded, tenant, a.str("table", "b"), a.u64("version", 0), a.u64("partition", 0)
		c.ServerID, c.Error = a.str("server", ""), a.str("error", "")
		tb := s.Tables[tableKey(tenant, c.Table)]
		if tb == nil || tb.Bulk == nil || tb.Bulk.version(c.Version) < 0 {
			return c, fmt.Errorf("no bulk version %d", c.Version)
		}
		_, p := s.partition(c.PartitionID)
		if p == nil {
			return c, fmt.Errorf("no partition %d", c.PartitionID)
		}
		f := tb.Bulk.Versions[tb.Bulk.version(c.Version)].Files[p.Index]
		c.File = &f
	case "bulk-rollback":
		c.Op, c.Tenant, c.Table, c.Version = OpBulkRollback, tenant, a.str("table", "b"), a.u64("version", 0)
	case "bulk-rollout":
		c.Op, c.Tenant, c.Table, c.Action = OpBulkRollout, tenant, a.str("table", "b"), a.str("action", "")
	case "bulk-advance":
		c.Op, c.Tenant, c.Table = OpBulkAdvance, tenant, a.str("table", "b")
	case "coproc-deploy":
		c.Op, c.Tenant, c.Table, c.Name = OpCoprocDeploy, tenant, a.str("table", "t"), a.str("name", "c")
		c.Coproc = &CoprocVersion{SHA256: strings.Repeat(a.str("sha", "a"), 64)[:64], Size: a.u64("size", 4096), Methods: a.list("methods"), Writes: a.has("writes")}
	case "coproc-ready":
		c.Op, c.Tenant, c.Table, c.Name = OpCoprocReady, tenant, a.str("table", "t"), a.str("name", "c")
		c.Version, c.ServerID = a.u64("version", 0), a.str("server", "")
	case "coproc-rollback":
		c.Op, c.Tenant, c.Table, c.Name, c.Version = OpCoprocRollback, tenant, a.str("table", "t"), a.str("name", "c"), a.u64("version", 0)
	default:
		return c, fmt.Errorf("unknown command %q", d.Cmd)
	}
	return c, nil
}

// bulkLoadAll reports every version each copy of the table holds loaded,
// advancing the clock past drains, until nothing changes (as servers do).
func (tr *transcript) bulkLoadAll(t *testing.T, d *datadriven.TestData) string {
	a := args{t, d}
	tenant, name := a.str("tenant", "acme"), a.str("table", "b")
	for range 20 {
		tr.now += 2 * bulkDrainMs
		res, err := tr.s.Apply(Command{UnixMs: tr.now, Payload: BulkAdvance{Tenant: tenant, Table: name}})
		if err != nil {
			return fmt.Sprintf("error: %v\n", err)
		}
		changed := res.Changed
		tb := tr.s.Tables[tableKey(tenant, name)]
		for i, p := range tb.Partitions {
			for k := range p.Replicas {
				for _, x := range tb.copyHolds(i, &p.Replicas[k]) {
					f := tb.Bulk.Versions[tb.Bulk.version(x)].Files[i]
					res, err := tr.s.Apply(Command{UnixMs: tr.now, Payload: BulkLoaded{Tenant: tenant, Table: name, Version: x, PartitionID: p.ID, ServerID: p.Replicas[k].ServerID, File: &f}})
					if err != nil {
						return fmt.Sprintf("error: %v\n", err)
					}
					changed = changed || res.Changed
				}
			}
		}
		if !changed {
			return "ok\n" + dumpDomain(tr.s, tr.domain)
		}
	}
	return "still changing after 20 rounds\n"
}

// dumpDomain prints the part of s a domain owns, in a stable order.
func dumpDomain(s *State, domain string) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	tables := s.tablesByID()
	switch domain {
	case "tenants":
		w("tenants (version %d):\n", s.TenantsVersion)
		for _, name := range slices.Sorted(maps.Keys(s.Tenants)) {
			tn := s.Tenants[name]
			w("  %s created=%d keys=%s", name, tn.CreatedUnixMs, keysString(tn.Keys))
			if tn.Quota.Limited() {
				w(" quota={%s}", quotaString(tn.Quota))
			}
			w("\n")
		}
	case "catalog":
		w("version=%d next-table=%d next-partition=%d\n", s.Version, s.NextTableID, s.NextPartitionID)
		for _, t := range tables {
			o := t.Options
			w("  %s/%s id=%d kind=%s partitions=%d replication=%d storage=%s", t.Tenant, t.Name, t.ID, kindName(t.Kind), o.Partitions, o.Replication, o.Storage)
			for _, kv := range [][2]string{{"durability", o.Durability}, {"compression", o.Compression}} {
				if kv[1] != "" {
					w(" %s=%s", kv[0], kv[1])
				}
			}
			if o.BulkRetainedVersions > 0 {
				w(" retain=%d", o.BulkRetainedVersions)
			}
			if o.DefaultTTLMs > 0 {
				w(" ttl=%d", o.DefaultTTLMs)
			}
			if set := o.splitSettings(); set != (SplitSettings{}) {
				w(" split={min=%d max=%d size=%d qps=%d}", set.MinPartitions, set.MaxPartitions, set.SplitSizeBytes, set.SplitQPS)
			}
			w("\n")
			for _, p := range t.Partitions {
				if t.Kind == api.TableKind_TABLE_KIND_ORDERED {
					w("    p%d [%q, %q)", p.ID, p.KeyStart, p.KeyEnd)
				} else {
					w("    p%d [%#x, %#x]", p.ID, p.Start, p.End)
				}
				if sp := p.Split; sp != nil {
					w(" splitting=%d,%d@%#x%q", sp.Left, sp.Right, sp.Hash, sp.Key)
					if sp.Reason != "" {
						w(" by=%s", sp.Reason)
					}
				}
				if p.SplitFrom != 0 {
					w(" from=p%d@%d", p.SplitFrom, p.SplitUnixMs)
					if p.SplitReason != "" {
						w(" by=%s", p.SplitReason)
					}
				}
				w("\n")
			}
		}
		if len(s.Requests) > 0 {
			w("requests:\n")
			for _, id := range slices.Sorted(maps.Keys(s.Requests)) {
				r := s.Requests[id]
				w("  %s %s at=%d table=%d\n", id, r.Op, r.UnixMs, r.TableID)
			}
		}
	case "placement":
		w("version=%d\n", s.Version)
		for _, t := range tables {
			w("  %s/%s\n", t.Tenant, t.Name)
			if t.Resplit && t.Kind == api.TableKind_TABLE_KIND_ORDERED {
				w("    split-points=%q\n", t.Options.SplitPoints)
			}
			for _, p := range t.Partitions {
				w("    p%d e%d %s", p.ID, p.Epoch, replicasString(p.Replicas))
				if p.Log != nil {
					w(" log=%d/%d", p.Log.Extent, p.Log.Last)
				}
				if p.Move != nil {
					w(" move=%s->%s@v%d", p.Move.From, p.Move.To, p.Move.Version)
				}
				if p.Handoff != nil {
					w(" handoff=%+v", *p.Handoff)
				}
				if p.DataLost != nil {
					w(" lost=%s@e%d", p.DataLost.ServerID, p.DataLost.Epoch)
				}
				if t.Resplit || p.Split != nil || p.Merge != nil {
					if t.Kind == api.TableKind_TABLE_KIND_ORDERED {
						w(" keys=[%q,%q)", p.KeyStart, p.KeyEnd)
					} else {
						w(" hashes=[%#x,%#x]", p.Start, p.End)
					}
				}
				if sp := p.Split; sp != nil {
					w(" split=%d+%d@%#x%q", sp.Left, sp.Right, sp.Hash, sp.Key)
				}
				if p.SplitFrom != 0 {
					w(" split-from=%d@%d", p.SplitFrom, p.SplitLSN)
				}
				if mg := p.Merge; mg != nil {
					w(" merge=%d+%d->%d", mg.Left, mg.Right, mg.Child)
				}
				if p.MergeLeft != 0 {
					w(" merge-from=%d+%d@%d", p.MergeLeft, p.MergeRight, p.MergeLSN)
				}
				w("\n")
			}
		}
	case "servers":
		w("version=%d next-server=%d\n", s.Version, s.NextServerID)
		for _, id := range s.ServerIDs() {
			sv := s.Servers[id]
			state := "alive"
			switch {
			case sv.Alive && sv.Draining:
				state = "draining"
			case !sv.Alive:
				state = fmt.Sprintf("dead since=%d", sv.DownSinceMs)
			}
			w("  %s %s domain=%s %s", id, sv.Addr, sv.FaultDomain, state)
			if sv.InternalAddr != "" {
				w(" internal=%s", sv.InternalAddr)
			}
			if sv.BulkCapacity != 0 {
				w(" capacity=%d", sv.BulkCapacity)
			}
			if sv.Incarnation != 0 {
				w(" inc=%d", sv.Incarnation)
			}
			w("\n")
		}
		counts := s.ReplicaCounts()
		w("replicas:")
		for _, id := range slices.Sorted(maps.Keys(counts)) {
			w(" %s=%d", id, counts[id])
		}
		w("\n")
	case "streams":
		m := s.StreamManager()
		w("nodes:\n")
		for _, n := range m.Nodes() {
			w("  %s %s domain=%s alive=%v used=%d\n", n.ID, n.Addr, n.FaultDomain, n.Alive, n.UsedBytes)
		}
		w("streams:\n")
		for _, name := range m.Streams() {
			sm, exts, err := m.Stream(name)
			if err != nil {
				w("  %s: %v\n", name, err)
				continue
			}
			w("  %s epoch=%d", sm.Name, sm.Epoch)
			for _, e := range exts {
				w(" [e%d %s sealed=%v len=%d]", e.ID, e.Primary, e.Sealed, e.Length)
			}
			w("\n")
		}
	case "bulk":
		for _, t := range tables {
			if t.Bulk == nil {
				continue
			}
			bs := t.Bulk
			w("%s/%s current=%d\n", t.Tenant, t.Name, bs.Current)
			for _, v := range bs.Versions {
				w("  v%d base=%d %s streams=%v loaded=%v", v.Version, v.Base, v.State, v.Streams, v.LoadedBy)
				if v.Error != "" {
					w(" error=%q", v.Error)
				}
				w("\n")
			}
			if ro := bs.Rollout; ro != nil {
				w("  rollout %+v\n", *ro)
			}
			for _, p := range t.Partitions {
				w("  p%d", p.ID)
				for _, r := range p.Replicas {
					w(" %s(serves=%d next=%d", r.ServerID, r.BulkServes, r.BulkNext)
					if r.BulkDrop != 0 {
						w(" drop=%d@%d", r.BulkDrop, r.BulkDropAtMs)
					}
					if r.BulkLeaving {
						w(" leaving")
					}
					w(")")
				}
				w("\n")
			}
		}
	case "coprocs":
		for _, t := range tables {
			for _, name := range slices.Sorted(maps.Keys(t.Coprocs)) {
				c := t.Coprocs[name]
				w("%s/%s %s live=%d next=%d\n", t.Tenant, t.Name, name, c.Live, c.Next)
				for _, v := range c.Versions {
					w("  v%d sha=%.8s size=%d methods=%v writes=%v ready=%v\n", v.Version, v.SHA256, v.Size, v.Methods, v.Writes, v.ReadyOn)
				}
			}
		}
	default:
		w("unknown domain %q\n", domain)
	}
	return b.String()
}

func kindName(k api.TableKind) string {
	for name, kk := range transcriptKinds {
		if kk == k {
			return name
		}
	}
	return k.String()
}

func keysString(keys [][]byte) string {
	var ks []string
	for _, k := range keys {
		ks = append(ks, fmt.Sprintf("%x…", k[:min(2, len(k))]))
	}
	return "[" + strings.Join(ks, " ") + "]"
}

func replicasString(rs []Replica) string {
	var out []string
	for _, r := range rs {
		s := r.ServerID
		if r.Role == api.ReplicaRole_REPLICA_ROLE_PRIMARY {
			s += "*"
		}
		out = append(out, s)
	}
	return "[" + strings.Join(out, " ") + "]"
}

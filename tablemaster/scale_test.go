package tablemaster

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/replication/stream"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// openQuiet opens a master on a fresh directory with a fake clock and no
// log output.
func openQuiet(t *testing.T, opts Options) *Master {
	t.Helper()
	if opts.DataDir == "" {
		opts.DataDir = t.TempDir()
	}
	if opts.Now == nil {
		opts.Now = newFakeClock().Now
	}
	opts.Logger = quietLogger()
	m, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Error(err)
		}
	})
	return m
}

// A node's disk-usage report (the stream driver's OpNodeLoad, every few
// seconds per node) is stream manager state: it must neither bump the map
// version nor wake the map's watchers (every table server and client).
func TestDiskUsageReportKeepsMapVersion(t *testing.T) {
	m := openQuiet(t, Options{})
	ctx := context.Background()
	if _, err := m.RegisterServer(ctx, &api.RegisterServerRequest{ServerId: "s1", Addr: "127.0.0.1:1", Incarnation: 1}); err != nil {
		t.Fatal(err)
	}
	before := m.view.Load()
	for i := range 3 {
		res, err := masterStreamLog{m}.Apply(ctx, stream.Command{Op: stream.OpNodeLoad, Node: "s1", UsedBytes: int64(1000 * (i + 1))})
		if err != nil {
			t.Fatal(err)
		}
		if !res.Changed {
			t.Fatal("load report changed nothing")
		}
	}
	after := m.view.Load()
	if after.state == before.state {
		t.Fatal("load reports were not published")
	}
	if after.state.Version != before.state.Version {
		t.Fatalf("load reports moved the map version %d -> %d", before.state.Version, after.state.Version)
	}
	select {
	case <-before.changed:
		t.Fatal("load reports woke the map watchers")
	default:
	}
	var used int64
	for _, n := range m.State().StreamManager().Nodes() {
		if n.ID == "s1" {
			used = n.UsedBytes
		}
	}
	if used != 3000 {
		t.Fatalf("node s1 used bytes %d, want 3000", used)
	}
	// A map change still wakes them.
	if _, err := m.CreateTable(ctx, &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: "t", Kind: api.TableKind_TABLE_KIND_POINT, Options: &api.TableOptions{Partitions: 2, Replication: 1}}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-before.changed:
	default:
		t.Fatal("a table creation did not wake the map watchers")
	}
}

// writeLog writes a command log of cmds (seq 1, 2, ...) into dir.
func writeLog(t *testing.T, dir string, cmds ...Command) {
	t.Helper()
	data := encodeFileHeader(logMagic)
	for i, c := range cmds {
		p, err := json.Marshal(logEntry{Seq: uint64(i + 1), Cmd: c})
		if err != nil {
			t.Fatal(err)
		}
		data = appendRecord(data, p)
	}
	if err := os.WriteFile(filepath.Join(dir, logFileName), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// A logged command was validated when it was proposed: replay applies it
// as written, so a release that tightens a rule (here: names, server ids,
// option limits) still opens a log an older release wrote.
func TestReplayDoesNotRevalidate(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir,
		Command{UnixMs: 1, Payload: CreateTenant{Tenant: api.DefaultTenant}},
		Command{UnixMs: 2, Payload: RegisterServer{ServerID: "old id", Addr: "127.0.0.1:1"}},
		// A name and a partition count the current rules refuse.
		Command{UnixMs: 3, Payload: CreateTable{Tenant: api.DefaultTenant, Table: "old name!", Kind: api.TableKind_TABLE_KIND_POINT, Options: &TableOptions{Partitions: api.MaxPartitions + 1, Replication: 1}}},
	)
	for _, c := range []Command{
		{Payload: RegisterServer{ServerID: "old id", Addr: "127.0.0.1:1"}},
		{Payload: CreateTable{Tenant: api.DefaultTenant, Table: "old name!", Kind: api.TableKind_TABLE_KIND_POINT}},
		{Payload: CreateTable{Tenant: api.DefaultTenant, Table: "t", Kind: api.TableKind_TABLE_KIND_POINT, Options: &TableOptions{Partitions: api.MaxPartitions + 1}}},
	} {
		st := NewState()
		st.Tenants[api.DefaultTenant] = &Tenant{Name: api.DefaultTenant}
		if _, err := st.Apply(c); err == nil {
			t.Fatalf("the current rules accept %+v; the test needs a command they refuse", c)
		}
	}
	m := openQuiet(t, Options{DataDir: dir})
	st := m.State()
	if srv := st.Servers["old id"]; srv == nil || !srv.Alive {
		t.Fatalf("server of the old log: %+v", srv)
	}
	tb, err := st.Table(api.DefaultTenant, "old name!")
	if err != nil {
		t.Fatal(err)
	}
	if len(tb.Partitions) != api.MaxPartitions+1 || len(tb.Partitions[0].Replicas) != 1 {
		t.Fatalf("old table has %d partitions, %d replicas", len(tb.Partitions), len(tb.Partitions[0].Replicas))
	}
	if tb.Options.Storage != StorageSSD || tb.Options.Durability != DurabilitySync || tb.Options.MaxValueBytes != api.DefaultMaxValueBytes {
		t.Fatalf("old table's options not defaulted: %+v", tb.Options)
	}
}

// The master logs a table's options as it resolved them, so a replay never
// depends on the defaults of the release that replays it.
func TestCreateTableLogsNormalizedOptions(t *testing.T) {
	dir := t.TempDir()
	m := openQuiet(t, Options{DataDir: dir})
	if _, err := m.CreateTable(context.Background(), &api.CreateTableRequest{Tenant: api.DefaultTenant, Name: "t", Kind: api.TableKind_TABLE_KIND_POINT}); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, logFileName))
	if err != nil {
		t.Fatal(err)
	}
	body, err := checkFileHeader(data, logMagic)
	if err != nil {
		t.Fatal(err)
	}
	payloads, _, _, err := decodeRecords(body)
	if err != nil {
		t.Fatal(err)
	}
	var e logEntry
	if err := json.Unmarshal(payloads[len(payloads)-1], &e); err != nil {
		t.Fatal(err)
	}
	want := m.State().Tables[tableKey(api.DefaultTenant, "t")].Options
	ct, ok := e.Cmd.Payload.(CreateTable)
	if !ok || ct.Options == nil || !reflect.DeepEqual(*ct.Options, want) {
		t.Fatalf("logged %+v, want a create_table with options %+v", e.Cmd, want)
	}
}

package tablemaster

import (
	"context"
	"io"
	"log/slog"
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

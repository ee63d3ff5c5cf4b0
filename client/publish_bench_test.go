package client_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/engines/bulk"
	"github.com/tabuladb/tabula/internal/testcluster"
	"github.com/tabuladb/tabula/tableserver"
)

// BenchmarkBulkPublish times one publish of a version (3 in-process
// servers, 6 partitions) by each path: "stream" (the default: files into
// streams, servers fetch them), "stream+direct" (PublishOptions.
// DirectUpload: files into streams and to the servers at once) and
// "upload-only" (the servers share one fault domain, so no stream can be
// placed: files to the servers only, the path before streams). Run with
// -benchtime=3x; RATIONALE.md ("Bulk files go through streams") has the
// numbers.
func BenchmarkBulkPublish(b *testing.B) {
	records := 1_000_000
	if s := os.Getenv("TABULA_PUBLISH_RECORDS"); s != "" {
		fmt.Sscan(s, &records)
	}
	const parts = 6
	dir := b.TempDir()
	var sb strings.Builder
	for i := range records {
		fmt.Fprintf(&sb, "key-%09d\tvalue-%09d-%s\n", i, i, "abcdefghijklmnopqrstuvwxyz0123456789")
	}
	in := filepath.Join(dir, "in.tsv")
	if err := os.WriteFile(in, []byte(sb.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	for _, mode := range []string{"stream", "stream+direct", "upload-only"} {
		b.Run(mode, func(b *testing.B) {
			opts := testcluster.Options{Servers: 3, Dir: b.TempDir()}
			if mode == "upload-only" {
				opts.ServerOptions = func(_ int, o *tableserver.Options) { o.FaultDomain = "one" }
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			tc, err := testcluster.Start(ctx, opts)
			if err != nil {
				b.Fatal(err)
			}
			defer tc.Close()
			c, err := client.New(ctx, client.Options{Masters: []string{tc.MasterAddr()}, Credential: tc.Credential()})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			if _, err := c.CreateTable(ctx, "m", api.TableKind_TABLE_KIND_BULK, &api.TableOptions{Replication: 1, Partitions: parts}); err != nil {
				b.Fatal(err)
			}
			tb := c.Table("m")
			var bytes int64
			var storeTime, total time.Duration
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				out := filepath.Join(b.TempDir(), "v")
				if _, err := bulk.BuildTable(ctx, []string{in}, out, bulk.BuildOptions{Partitions: parts, Version: uint64(i + 1)}); err != nil {
					b.Fatal(err)
				}
				dv, err := bulk.DescribeDir(ctx, out, parts)
				if err != nil {
					b.Fatal(err)
				}
				p := client.BulkPublish{Version: dv.Version}
				bytes = 0
				for _, f := range dv.Files {
					p.Files = append(p.Files, client.BulkFile{Path: f.Path, Size: uint64(f.FileBytes), CRC32C: f.CRC, Records: f.Records})
					bytes += f.FileBytes
				}
				b.StartTimer()
				start := time.Now()
				stored := false
				progress := func(pp client.PublishProgress) {
					if !stored && pp.Stored == pp.Partitions {
						stored = true
						storeTime += time.Since(start)
					}
				}
				if err := tb.PublishBulk(ctx, p, client.PublishOptions{DirectUpload: mode == "stream+direct", Progress: progress}); err != nil {
					b.Fatal(err)
				}
				total += time.Since(start)
			}
			b.StopTimer()
			if mode != "upload-only" {
				// Writing the streams, and from then to the switch (fetch,
				// verify, load, report).
				b.ReportMetric(float64(storeTime.Milliseconds())/float64(b.N), "store-ms/op")
				b.ReportMetric(float64((total-storeTime).Milliseconds())/float64(b.N), "after-store-ms/op")
			}
			b.SetBytes(bytes)
			b.ReportMetric(float64(bytes)/1e6, "MB/publish")
		})
	}
}

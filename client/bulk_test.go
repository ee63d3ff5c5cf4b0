package client_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/engines/bulk"
)

const bulkKeys = 20000

func bulkKey(i int) string { return fmt.Sprintf("key-%06d", i) }

// buildVersion writes a TSV of keys [0, n) with values "<tag>:<key>" (and,
// for a delta, deletion lines for del) and builds it into a directory.
func buildVersion(t *testing.T, parts int, version, deltaOf uint64, tag string, keys []int, del []int) string {
	t.Helper()
	dir := t.TempDir()
	var sb strings.Builder
	for _, i := range keys {
		fmt.Fprintf(&sb, "%s\t%s:%s\n", bulkKey(i), tag, bulkKey(i))
	}
	for _, i := range del {
		fmt.Fprintf(&sb, "%s\n", bulkKey(i))
	}
	in := filepath.Join(dir, "in.tsv")
	if err := os.WriteFile(in, []byte(sb.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	if _, err := bulk.BuildTable(context.Background(), []string{in}, out, bulk.BuildOptions{Partitions: parts, Version: version, DeltaOf: deltaOf}); err != nil {
		t.Fatalf("build version %d: %v", version, err)
	}
	return out
}

func publishDir(t *testing.T, ctx context.Context, tb *client.Table, dir string, parts int, opts client.PublishOptions) error {
	t.Helper()
	dv, err := bulk.DescribeDir(ctx, dir, parts)
	if err != nil {
		t.Fatalf("describe %s: %v", dir, err)
	}
	p := client.BulkPublish{Version: dv.Version, Base: dv.Base}
	for _, f := range dv.Files {
		p.Files = append(p.Files, client.BulkFile{Path: f.Path, Size: uint64(f.FileBytes), CRC32C: f.CRC, Records: f.Records})
	}
	return tb.PublishBulk(ctx, p, opts)
}

func seq(lo, hi int) []int {
	out := make([]int, 0, hi-lo)
	for i := lo; i < hi; i++ {
		out = append(out, i)
	}
	return out
}

// TestBulkPublishSwitchRollbackDelta publishes versions to a 3-server
// cluster while readers run BatchGets, and checks that no answer mixes
// versions and no read fails across switches and rollbacks; then a delta.
func TestBulkPublishSwitchRollbackDelta(t *testing.T) {
	tc := startCluster(t, 3)
	c := newClient(t, tc)
	ctx := testCtx(t)
	const parts = 6
	if _, err := c.CreateTable(ctx, "model", api.TableKind_TABLE_KIND_BULK, &api.TableOptions{Replication: 1, Partitions: parts}); err != nil {
		t.Fatal(err)
	}
	tb := c.Table("model")
	// Before any version: reads say so; writes are refused.
	if _, err := tb.Get(ctx, []byte(bulkKey(1))); api.DetailOf(err).GetReason() != "no_version" {
		t.Fatalf("get before any version: %v", err)
	}
	if err := tb.Put(ctx, []byte("k"), []byte("v")); api.CodeOf(err) != api.ErrorCode_ERROR_CODE_WRONG_KIND {
		t.Fatalf("put to a bulk table: %v", err)
	}
	all := seq(0, bulkKeys)
	if err := publishDir(t, ctx, tb, buildVersion(t, parts, 1, 0, "v1", all, nil), parts, client.PublishOptions{}); err != nil {
		t.Fatalf("publish 1: %v", err)
	}
	if v, err := tb.Get(ctx, []byte(bulkKey(7))); err != nil || string(v) != "v1:"+bulkKey(7) {
		t.Fatalf("get after publish: %q %v", v, err)
	}
	if _, err := tb.Get(ctx, []byte("absent")); err != client.ErrKeyNotFound {
		t.Fatalf("absent key: %v", err)
	}

	// Readers: batches of 64 random keys, every answer from one version.
	var (
		stop         atomic.Bool
		reads, mixed atomic.Int64
		failed       atomic.Int64
		firstErr     atomic.Pointer[error]
		seen         sync.Map // tag -> true
		wg           sync.WaitGroup
	)
	for g := range 4 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), testSeed))
			keys := make([][]byte, 64)
			for !stop.Load() {
				for i := range keys {
					keys[i] = []byte(bulkKey(r.IntN(bulkKeys)))
				}
				res, err := tb.BatchGet(ctx, keys)
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, &err)
					continue
				}
				reads.Add(1)
				tag := ""
				for i, x := range res {
					if !x.Found {
						mixed.Add(1)
						continue
					}
					tg, k, _ := strings.Cut(string(x.Value), ":")
					if k != string(keys[i]) {
						mixed.Add(1)
					}
					if tag == "" {
						tag = tg
					} else if tg != tag {
						mixed.Add(1)
					}
				}
				seen.Store(tag, true)
			}
		})
	}
	waitReads := func(n int64) {
		t.Helper()
		target := reads.Load() + n
		waitFor(t, 30*time.Second, "reads to progress", func() bool { return reads.Load() >= target })
	}
	waitReads(20)
	for v := uint64(2); v <= 3; v++ {
		tag := fmt.Sprintf("v%d", v)
		if err := publishDir(t, ctx, tb, buildVersion(t, parts, v, 0, tag, all, nil), parts, client.PublishOptions{}); err != nil {
			t.Fatalf("publish %d: %v", v, err)
		}
		waitFor(t, 10*time.Second, "readers to see "+tag, func() bool { _, ok := seen.Load(tag); return ok })
		waitReads(20)
	}
	// Retention 2: versions 2 and 3. Roll back to 2 and forward again.
	if err := tb.BulkRollback(ctx, 1); api.CodeOf(err) != api.ErrorCode_ERROR_CODE_NOT_FOUND {
		t.Fatalf("rollback to an unloaded version: %v", err)
	}
	for _, v := range []uint64{2, 3, 2} {
		if err := tb.BulkRollback(ctx, v); err != nil {
			t.Fatalf("rollback to %d: %v", v, err)
		}
		waitReads(20)
	}
	seen.Delete("v2")
	waitFor(t, 10*time.Second, "readers to see v2 after rollback", func() bool { _, ok := seen.Load("v2"); return ok })
	stop.Store(true)
	wg.Wait()
	if e := firstErr.Load(); e != nil {
		t.Errorf("first failed read: %v", *e)
	}
	if failed.Load() != 0 || mixed.Load() != 0 {
		t.Fatalf("%d batch reads: %d failed, %d keys wrong or from another version", reads.Load(), failed.Load(), mixed.Load())
	}
	t.Logf("%d batch reads of 64 keys across 2 publishes and 3 switches: none failed, none mixed", reads.Load())

	// A pinned read of a retired version says VERSION_GONE; of a
	// retained one no copy serves (it is in its streams, loaded again by a
	// rollback) too, saying why; of the serving one, reads it.
	if _, err := tb.AtVersion(1).Get(ctx, []byte(bulkKey(3))); api.CodeOf(err) != api.ErrorCode_ERROR_CODE_VERSION_GONE {
		t.Fatalf("read of retired version 1: %v", err)
	}
	waitFor(t, 10*time.Second, "the copies to stop holding version 3 (a switched row drains for a second)", func() bool {
		m, err := tb.Map(ctx)
		if err != nil {
			return false
		}
		for _, p := range m.GetPartitions() {
			for _, r := range p.GetReplicas() {
				if slices.Contains(r.GetBulkHolds(), 3) {
					return false
				}
			}
		}
		return true
	})
	if _, err := tb.AtVersion(3).Get(ctx, []byte(bulkKey(3))); api.DetailOf(err).GetReason() != "version_not_served" {
		t.Fatalf("pinned read of retained version 3: %v", err)
	}
	if v, err := tb.AtVersion(2).Get(ctx, []byte(bulkKey(3))); err != nil || string(v) != "v2:"+bulkKey(3) {
		t.Fatalf("pinned read of serving version 2: %q %v", v, err)
	}

	// A delta over 2 (serving): keys 0..99 changed, 100..149 deleted.
	if err := publishDir(t, ctx, tb, buildVersion(t, parts, 4, 2, "v4", seq(0, 100), seq(100, 150)), parts, client.PublishOptions{}); err != nil {
		t.Fatalf("publish delta: %v", err)
	}
	keys := make([][]byte, 300)
	for i := range keys {
		keys[i] = []byte(bulkKey(i))
	}
	res, err := tb.BatchGet(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		want, found := "v2:"+bulkKey(i), true
		switch {
		case i < 100:
			want = "v4:" + bulkKey(i)
		case i < 150:
			want, found = "", false
		}
		if r.Found != found || string(r.Value) != want {
			t.Fatalf("key %d over the delta: %q found=%v, want %q found=%v", i, r.Value, r.Found, want, found)
		}
	}
	st, err := tb.BulkStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.GetCurrent() != 4 {
		t.Fatalf("serving %d after the delta", st.GetCurrent())
	}

	// A delta over the delta: 100..119 put again, 0..9 deleted, new keys.
	if err := publishDir(t, ctx, tb, buildVersion(t, parts, 5, 4, "v5", append(seq(100, 120), seq(bulkKeys, bulkKeys+50)...), seq(0, 10)), parts, client.PublishOptions{}); err != nil {
		t.Fatalf("publish delta of a delta: %v", err)
	}
	model := map[string]string{}
	for i := range bulkKeys {
		switch {
		case i < 100:
			model[bulkKey(i)] = "v4:" + bulkKey(i)
		case i < 150:
		default:
			model[bulkKey(i)] = "v2:" + bulkKey(i)
		}
	}
	v4 := maps.Clone(model)
	for i := range 10 {
		delete(model, bulkKey(i))
	}
	for _, i := range append(seq(100, 120), seq(bulkKeys, bulkKeys+50)...) {
		model[bulkKey(i)] = "v5:" + bulkKey(i)
	}
	checkScan := func(tb *client.Table, want map[string]string) {
		t.Helper()
		got := map[string]string{}
		err := tb.Scan(ctx, func(k, v []byte) error {
			if _, dup := got[string(k)]; dup {
				return fmt.Errorf("key %q scanned twice", k)
			}
			got[string(k)] = string(v)
			return nil
		})
		if err != nil {
			t.Fatalf("scan: %v", err)
		}
		if !maps.Equal(got, want) {
			diff := 0
			for k, v := range want {
				if got[k] != v {
					diff++
					if diff < 5 {
						t.Errorf("key %q: scanned %q, want %q", k, got[k], v)
					}
				}
			}
			t.Fatalf("scan: %d keys, want %d; %d differ", len(got), len(want), diff)
		}
		// Scan agrees with Get at the version it read.
		keys := make([][]byte, 0, 200)
		for i := range 200 {
			keys = append(keys, []byte(bulkKey(i)))
		}
		res, err := tb.BatchGet(ctx, keys)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			if w, ok := want[string(keys[i])]; r.Found != ok || string(r.Value) != w {
				t.Fatalf("key %q: get %q %v, scanned %q %v", keys[i], r.Value, r.Found, w, ok)
			}
		}
	}
	checkScan(tb, model)
	checkScan(tb.AtVersion(4), v4)
}

// TestBulkBadFileAndResume: a corrupt file is refused at load and the
// table keeps serving; an interrupted publish resumes where it stopped.
func TestBulkBadFileAndResume(t *testing.T) {
	tc := startCluster(t, 2)
	c := newClient(t, tc)
	ctx := testCtx(t)
	const parts = 2
	if _, err := c.CreateTable(ctx, "m", api.TableKind_TABLE_KIND_BULK, &api.TableOptions{Replication: 1, Partitions: parts}); err != nil {
		t.Fatal(err)
	}
	tb := c.Table("m")
	all := seq(0, bulkKeys)
	if err := publishDir(t, ctx, tb, buildVersion(t, parts, 1, 0, "v1", all, nil), parts, client.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	// Version 2 with a byte flipped in the middle of partition 1's file.
	dir := buildVersion(t, parts, 2, 0, "v2", all, nil)
	path := filepath.Join(dir, bulk.PartitionFileName(1, parts))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/3] ^= 0x10
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	// DescribeDir may already refuse it (an index section); else the
	// server refuses it at load.
	if dv, derr := bulk.DescribeDir(ctx, dir, parts); derr == nil {
		p := client.BulkPublish{Version: dv.Version}
		for _, f := range dv.Files {
			p.Files = append(p.Files, client.BulkFile{Path: f.Path, Size: uint64(f.FileBytes), CRC32C: f.CRC, Records: f.Records})
		}
		err := tb.PublishBulk(ctx, p, client.PublishOptions{})
		if api.DetailOf(err).GetReason() != "bad_file" {
			t.Fatalf("publish of a corrupt file: %v", err)
		}
		t.Logf("corrupt file refused by the server: %v", err)
	} else {
		t.Logf("corrupt file refused before upload: %v", derr)
	}
	if v, err := tb.Get(ctx, []byte(bulkKey(5))); err != nil || string(v) != "v1:"+bulkKey(5) {
		t.Fatalf("after a refused version: %q %v", v, err)
	}

	// Version 3: an upload cut off after half of partition 0's file (the
	// sender closes its stream), then the publish run in full resumes it.
	dir = buildVersion(t, parts, 3, 0, "v3", all, nil)
	dv, err := bulk.DescribeDir(ctx, dir, parts)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient(tc.MasterAddr(), append(tc.Credential().DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	req := &api.BulkPublishRequest{Tenant: api.DefaultTenant, Table: "m", Version: 3}
	for i, f := range dv.Files {
		req.Files = append(req.Files, &api.BulkFile{Partition: uint32(i), Size: uint64(f.FileBytes), Crc32C: f.CRC, Records: f.Records})
	}
	pub, err := api.NewMasterClient(cc).BulkPublish(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	p0 := pub.GetMap().GetPartitions()[0]
	sc, err := grpc.NewClient(p0.GetReplicas()[0].GetAddr(), append(tc.Credential().DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	ts := api.NewTableServerClient(sc)
	hdr := &api.RequestHeader{Tenant: api.DefaultTenant, Table: "m", PartitionId: p0.GetId(), Epoch: p0.GetEpoch()}
	data, err := os.ReadFile(dv.Files[0].Path)
	if err != nil {
		t.Fatal(err)
	}
	half := uint64(len(data) / 2)
	var up api.TableServer_BulkUploadClient
	waitFor(t, 10*time.Second, "the server to see version 3", func() bool {
		st, err := ts.BulkUploadStatus(ctx, &api.BulkUploadStatusRequest{Header: hdr, Version: 3})
		return err == nil && st.GetReceived() == 0
	})
	if up, err = ts.BulkUpload(ctx); err != nil {
		t.Fatal(err)
	}
	if err := up.Send(&api.BulkUploadRequest{Header: hdr, Version: 3, File: req.Files[0], Data: data[:half]}); err != nil {
		t.Fatal(err)
	}
	if r, err := up.CloseAndRecv(); err != nil || r.GetReceived() != half || r.GetLoaded() {
		t.Fatalf("half an upload: %v %v; want %d received", r, err, half)
	}
	if st, err := ts.BulkUploadStatus(ctx, &api.BulkUploadStatusRequest{Header: hdr, Version: 3}); err != nil || st.GetReceived() != half {
		t.Fatalf("status after half an upload: %v %v", st, err)
	}
	// Data at the wrong offset is refused.
	if up, err = ts.BulkUpload(ctx); err != nil {
		t.Fatal(err)
	}
	_ = up.Send(&api.BulkUploadRequest{Header: hdr, Version: 3, File: req.Files[0], Offset: half + 10, Data: data[:10]})
	if _, err := up.CloseAndRecv(); api.DetailOf(err).GetReason() != "offset_past_end" {
		t.Fatalf("upload past the end: %v", err)
	}
	var resumedFrom atomic.Uint64
	var once sync.Once
	err = publishDir(t, ctx, tb, dir, parts, client.PublishOptions{Parallel: 1, ChunkBytes: 4 << 10, Progress: func(p client.PublishProgress) {
		once.Do(func() { resumedFrom.Store(p.Sent) })
	}})
	if err != nil {
		t.Fatalf("resumed publish: %v", err)
	}
	if resumedFrom.Load() < half {
		t.Fatalf("the publish started at %d bytes; the server held %d", resumedFrom.Load(), half)
	}
	if v, err := tb.Get(ctx, []byte(bulkKey(5))); err != nil || string(v) != "v3:"+bulkKey(5) {
		t.Fatalf("after resumed publish: %q %v", v, err)
	}
	// A publish interrupted at any point completes when run again.
	dir = buildVersion(t, parts, 4, 0, "v4", all, nil)
	ictx, cancel := context.WithCancel(ctx)
	err = publishDir(t, ictx, tb, dir, parts, client.PublishOptions{Parallel: 1, ChunkBytes: 4 << 10, Progress: func(p client.PublishProgress) {
		if p.Sent > 64<<10 {
			cancel()
		}
	}})
	cancel()
	if err == nil {
		t.Fatal("interrupted publish succeeded")
	}
	if err := publishDir(t, ctx, tb, dir, parts, client.PublishOptions{}); err != nil {
		t.Fatalf("publish run again: %v", err)
	}
	if v, err := tb.Get(ctx, []byte(bulkKey(5))); err != nil || string(v) != "v4:"+bulkKey(5) {
		t.Fatalf("after the publish ran again: %q %v", v, err)
	}
	// A wrong partition count is refused before anything is sent.
	if _, err := bulk.DescribeDir(ctx, buildVersion(t, 3, 4, 0, "v4", all, nil), parts); err == nil {
		t.Fatal("a 3-partition build described as a 2-partition version")
	}
}

// TestBulkPartitionsMoveLoadFromStreams publishes a full version and a
// delta over it to 3 servers (each file stored in a stream), kills the
// server of partition 0 while readers run BatchGets, and checks that its
// partitions move, their new servers fetch every retained version from the
// streams, every key reads back, and no answer is wrong or from another
// version. Then a server restarts with its files deleted and fetches them
// again.
func TestBulkPartitionsMoveLoadFromStreams(t *testing.T) {
	tc := startCluster(t, 3)
	c := newClient(t, tc)
	ctx := testCtx(t)
	const parts = 6
	if _, err := c.CreateTable(ctx, "moving", api.TableKind_TABLE_KIND_BULK, &api.TableOptions{Replication: 1, Partitions: parts}); err != nil {
		t.Fatal(err)
	}
	tb := c.Table("moving")
	all := seq(0, bulkKeys)
	if err := publishDir(t, ctx, tb, buildVersion(t, parts, 1, 0, "v1", all, nil), parts, client.PublishOptions{}); err != nil {
		t.Fatalf("publish 1: %v", err)
	}
	if err := publishDir(t, ctx, tb, buildVersion(t, parts, 2, 1, "v2", seq(0, 500), seq(500, 600)), parts, client.PublishOptions{}); err != nil {
		t.Fatalf("publish delta 2: %v", err)
	}
	want := func(i int) (string, bool) {
		switch {
		case i < 500:
			return "v2:" + bulkKey(i), true
		case i < 600:
			return "", false
		}
		return "v1:" + bulkKey(i), true
	}
	st, err := tb.BulkStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range st.GetVersions() {
		if !v.GetStreams() {
			t.Fatalf("version %d is not stored in streams", v.GetVersion())
		}
		for i, f := range v.GetFiles() {
			if f.GetStream() == "" {
				t.Fatalf("version %d partition %d: no stream recorded", v.GetVersion(), i)
			}
		}
	}

	var (
		stop                 atomic.Bool
		reads, wrong, failed atomic.Int64
		firstErr, firstWrong atomic.Pointer[string]
		wg                   sync.WaitGroup
	)
	for g := range 3 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), testSeed))
			idx := make([]int, 64)
			keys := make([][]byte, 64)
			for !stop.Load() {
				for i := range keys {
					idx[i] = r.IntN(bulkKeys)
					keys[i] = []byte(bulkKey(idx[i]))
				}
				res, err := tb.BatchGet(ctx, keys)
				if err != nil {
					failed.Add(1)
					msg := err.Error()
					firstErr.CompareAndSwap(nil, &msg)
					continue
				}
				reads.Add(1)
				for i, x := range res {
					if w, ok := want(idx[i]); x.Found != ok || string(x.Value) != w {
						wrong.Add(1)
						msg := fmt.Sprintf("key %d: %q found=%v, want %q found=%v", idx[i], x.Value, x.Found, w, ok)
						firstWrong.CompareAndSwap(nil, &msg)
					}
				}
			}
		})
	}
	waitFor(t, 20*time.Second, "reads", func() bool { return reads.Load() >= 20 })

	m, err := tb.Map(ctx)
	if err != nil {
		t.Fatal(err)
	}
	victim := m.GetPartitions()[0].GetReplicas()[0].GetServerId()
	vi := slices.Index(tc.ServerIDs(), victim)
	var moved []uint64
	for _, p := range m.GetPartitions() {
		if p.GetReplicas()[0].GetServerId() == victim {
			moved = append(moved, p.GetId())
		}
	}
	if err := tc.KillServer(vi); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed %s (server %d), host of partitions %v", victim, vi, moved)
	// The partitions move to live servers, which fetch versions 1 and 2.
	waitFor(t, 30*time.Second, "the moved partitions to load both versions on their new servers", func() bool {
		st, err := tb.BulkStatus(ctx)
		if err != nil {
			return false
		}
		m, err := tb.Map(ctx)
		if err != nil {
			return false
		}
		for _, p := range m.GetPartitions() {
			if len(p.GetReplicas()) == 0 || p.GetReplicas()[0].GetServerId() == victim {
				return false
			}
		}
		for _, v := range st.GetVersions() {
			if v.GetLoadedPartitions() != parts {
				return false
			}
		}
		return st.GetCurrent() == 2
	})
	waitReadsFrom := reads.Load()
	waitFor(t, 20*time.Second, "reads after the move", func() bool { return reads.Load() >= waitReadsFrom+20 })
	stop.Store(true)
	wg.Wait()
	if w := firstWrong.Load(); w != nil {
		t.Fatalf("%d wrong answers; first: %s", wrong.Load(), *w)
	}
	if e := firstErr.Load(); e != nil {
		t.Fatalf("%d of %d batch reads failed across the move; first: %s", failed.Load(), reads.Load()+failed.Load(), *e)
	}
	t.Logf("%d batch reads of 64 keys across the kill and the move: none failed, none wrong", reads.Load())

	checkAll := func(what string) {
		t.Helper()
		keys := make([][]byte, 0, bulkKeys)
		for i := range bulkKeys {
			keys = append(keys, []byte(bulkKey(i)))
		}
		res, err := tb.BatchGet(ctx, keys)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		for i, x := range res {
			if w, ok := want(i); x.Found != ok || string(x.Value) != w {
				t.Fatalf("%s: key %d: %q found=%v, want %q found=%v", what, i, x.Value, x.Found, w, ok)
			}
		}
		n := 0
		if err := tb.Scan(ctx, func(k, v []byte) error { n++; return nil }); err != nil || n != bulkKeys-100 {
			t.Fatalf("%s: scan: %d keys, %v", what, n, err)
		}
		// Version 1 (the delta's base) too, pinned.
		res, err = tb.AtVersion(1).BatchGet(ctx, keys[:1000])
		if err != nil {
			t.Fatalf("%s: version 1: %v", what, err)
		}
		for i, x := range res {
			if !x.Found || string(x.Value) != "v1:"+bulkKey(i) {
				t.Fatalf("%s: version 1 key %d: %q %v", what, i, x.Value, x.Found)
			}
		}
	}
	checkAll("after the move")

	// A server restarts having lost its files: it fetches them again.
	ri := (vi + 1) % 3
	if err := tc.KillServer(ri); err != nil {
		t.Fatal(err)
	}
	bulkFiles := func(remove bool) int {
		n := 0
		_ = filepath.WalkDir(filepath.Join(tc.Dir(), fmt.Sprintf("server-%d", ri)), func(path string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() && filepath.Ext(path) == ".bulk" && !strings.Contains(path, "orphan") {
				if !remove || os.Remove(path) == nil {
					n++
				}
			}
			return nil
		})
		return n
	}
	removed := bulkFiles(true)
	if err := tc.RestartServer(ctx, ri); err != nil {
		t.Fatal(err)
	}
	t.Logf("restarted server %d without its %d bulk files", ri, removed)
	waitFor(t, 30*time.Second, "every partition to load both versions again", func() bool {
		st, err := tb.BulkStatus(ctx)
		if err != nil {
			return false
		}
		for _, v := range st.GetVersions() {
			if v.GetLoadedPartitions() != parts {
				return false
			}
		}
		return true
	})
	checkAll("after the restart")
	if n := bulkFiles(false); n < removed {
		t.Fatalf("server %d holds %d bulk files after the restart; it lost %d", ri, n, removed)
	}
}

// TestBulkStreamBadFile: a file that passes the publisher's checks but not
// the server's verification (its records are corrupt, its CRC32C is of the
// corrupt bytes) is refused by the server that fetches it from its stream;
// the publish fails with bad_file and the table keeps serving.
func TestBulkStreamBadFile(t *testing.T) {
	tc := startCluster(t, 3)
	c := newClient(t, tc)
	ctx := testCtx(t)
	const parts = 2
	if _, err := c.CreateTable(ctx, "bad", api.TableKind_TABLE_KIND_BULK, &api.TableOptions{Replication: 1, Partitions: parts}); err != nil {
		t.Fatal(err)
	}
	tb := c.Table("bad")
	all := seq(0, 5000)
	if err := publishDir(t, ctx, tb, buildVersion(t, parts, 1, 0, "v1", all, nil), parts, client.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := buildVersion(t, parts, 2, 0, "v2", all, nil)
	path := filepath.Join(dir, bulk.PartitionFileName(1, parts))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/3] ^= 0x10 // inside the records
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	dv, err := bulk.DescribeDir(ctx, dir, parts)
	if err != nil {
		t.Skipf("the corruption landed where DescribeDir sees it: %v", err)
	}
	p := client.BulkPublish{Version: dv.Version}
	for _, f := range dv.Files {
		p.Files = append(p.Files, client.BulkFile{Path: f.Path, Size: uint64(f.FileBytes), CRC32C: f.CRC, Records: f.Records})
	}
	err = tb.PublishBulk(ctx, p, client.PublishOptions{})
	if api.DetailOf(err).GetReason() != "bad_file" {
		t.Fatalf("publish of a corrupt file: %v", err)
	}
	t.Logf("refused: %v", err)
	st, err := tb.BulkStatus(ctx)
	if err != nil || st.GetCurrent() != 1 {
		t.Fatalf("serving %d after a refused version: %v", st.GetCurrent(), err)
	}
	if v, err := tb.Get(ctx, []byte(bulkKey(5))); err != nil || string(v) != "v1:"+bulkKey(5) {
		t.Fatalf("after a refused version: %q %v", v, err)
	}
	// A good version 3 replaces the refused one.
	if err := publishDir(t, ctx, tb, buildVersion(t, parts, 3, 0, "v3", all, nil), parts, client.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	if v, err := tb.Get(ctx, []byte(bulkKey(5))); err != nil || string(v) != "v3:"+bulkKey(5) {
		t.Fatalf("after version 3: %q %v", v, err)
	}
}

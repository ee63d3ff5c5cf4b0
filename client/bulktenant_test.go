package client_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
)

// TestBulkPublishAsTenant: a tenant publishes its bulk table with its own
// credential. Streams are the cluster's, so the files go to the
// partitions' servers, which store them in the streams; the version
// switches, every file is recorded in its stream, the data serves, and a
// second publish (a delta) and a publish again of a retained version work
// the same way. Before, a tenant's publish was refused at the first stream
// call: only the cluster credential could publish.
func TestBulkPublishAsTenant(t *testing.T) {
	tc := startCluster(t, 3)
	ctx := testCtx(t)
	c, _ := newTenant(t, tc, "models", nil)
	const parts = 4
	if _, err := c.CreateTable(ctx, "emb", api.TableKind_TABLE_KIND_BULK, &api.TableOptions{Replication: 1, Partitions: parts}); err != nil {
		t.Fatal(err)
	}
	tb := c.Table("emb")
	var last client.PublishProgress
	opts := client.PublishOptions{Progress: func(p client.PublishProgress) { last = p }}
	if err := publishDir(t, ctx, tb, buildVersion(t, parts, 1, 0, "v1", seq(0, bulkKeys), nil), parts, opts); err != nil {
		t.Fatalf("publish version 1 as a tenant: %v", err)
	}
	if !last.Serving || last.Stored != parts {
		t.Errorf("last progress %+v; want serving with %d stored", last, parts)
	}
	if err := publishDir(t, ctx, tb, buildVersion(t, parts, 2, 1, "v2", seq(0, 100), seq(100, 200)), parts, client.PublishOptions{}); err != nil {
		t.Fatalf("publish delta 2 as a tenant: %v", err)
	}
	st, err := tb.BulkStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.GetCurrent() != 2 {
		t.Fatalf("serving version %d; want 2", st.GetCurrent())
	}
	for _, v := range st.GetVersions() {
		if !v.GetStreams() {
			t.Errorf("version %d: not stored in streams", v.GetVersion())
		}
		for i, f := range v.GetFiles() {
			if want := fmt.Sprintf("/%d/%d", v.GetVersion(), i); !strings.HasPrefix(f.GetStream(), api.BulkStreamPrefix) || !strings.HasSuffix(f.GetStream(), want) {
				t.Errorf("version %d partition %d: stream %q; want %q", v.GetVersion(), i, f.GetStream(), want)
			}
		}
	}
	for _, i := range []int{0, 99, 150, 500, bulkKeys - 1} {
		v, err := tb.Get(ctx, []byte(bulkKey(i)))
		switch {
		case i >= 100 && i < 200:
			if !errors.Is(err, client.ErrKeyNotFound) {
				t.Errorf("key %d (deleted by the delta): %q, %v; want ErrKeyNotFound", i, v, err)
			}
		case i < 100:
			if err != nil || string(v) != "v2:"+bulkKey(i) {
				t.Errorf("key %d: %q, %v; want v2", i, v, err)
			}
		default:
			if err != nil || string(v) != "v1:"+bulkKey(i) {
				t.Errorf("key %d: %q, %v; want v1", i, v, err)
			}
		}
	}
	// The tenant still may not touch streams itself.
	if _, err := c.Streams().Create(ctx, "bulk/x", ""); api.CodeOf(err) != api.ErrorCode_ERROR_CODE_PERMISSION_DENIED && api.CodeOf(err) != api.ErrorCode_ERROR_CODE_UNAUTHENTICATED {
		t.Errorf("a tenant creating a stream: %v; want a refusal", err)
	}
}

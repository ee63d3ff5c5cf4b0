package compat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/data/aztables"
)

var tableSeq atomic.Int64

// uniqueName is a fresh valid table name: letters and digits, the run's
// id and a sequence number.
func uniqueName(tag string) string {
	return fmt.Sprintf("c%s%s%d", tag, target.runID, tableSeq.Add(1))
}

// testCtx bounds one test's calls.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// newTable creates a table of its own for t, deleted when t ends.
func newTable(t *testing.T) *aztables.Client {
	t.Helper()
	c, _ := newNamedTable(t)
	return c
}

// newNamedTable is newTable, and the table's name.
func newNamedTable(t *testing.T) (*aztables.Client, string) {
	t.Helper()
	name := uniqueName("t")
	ctx := testCtx(t)
	if _, err := target.svc.CreateTable(ctx, name, nil); err != nil {
		t.Fatalf("create table %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = target.svc.DeleteTable(ctx, name, nil)
	})
	return target.svc.NewClient(name), name
}

// skipOnAzurite skips t when the target is Azurite, which is known to
// deviate from the service here; why says how.
func skipOnAzurite(t *testing.T, why string) {
	t.Helper()
	if target.kind == targetAzurite {
		t.Skipf("Azurite deviates from the service: %s", why)
	}
}

// wantErr checks err is the service's error answer status/code. An
// empty code checks the status only.
func wantErr(t *testing.T, err error, status int, code string) {
	t.Helper()
	if err == nil {
		t.Fatalf("succeeded; want %d %s", status, code)
	}
	var re *azcore.ResponseError
	if !errors.As(err, &re) {
		t.Fatalf("error %v is not a service answer; want %d %s", err, status, code)
	}
	if re.StatusCode != status || (code != "" && re.ErrorCode != code) {
		t.Fatalf("got %d %q; want %d %q; the error:\n%v", re.StatusCode, re.ErrorCode, status, code, err)
	}
}

// wantStatus checks err is a service answer with one of statuses.
func wantStatus(t *testing.T, err error, statuses ...int) *azcore.ResponseError {
	t.Helper()
	if err == nil {
		t.Fatalf("succeeded; want status %v", statuses)
	}
	var re *azcore.ResponseError
	if !errors.As(err, &re) {
		t.Fatalf("error %v is not a service answer; want status %v", err, statuses)
	}
	if !slices.Contains(statuses, re.StatusCode) {
		t.Fatalf("got %d %q; want status %v; the error:\n%v", re.StatusCode, re.ErrorCode, statuses, err)
	}
	return re
}

// ent is a shorthand for an entity with properties.
func ent(pk, rk string, props map[string]any) aztables.EDMEntity {
	if props == nil {
		props = map[string]any{}
	}
	return aztables.EDMEntity{Entity: aztables.Entity{PartitionKey: pk, RowKey: rk}, Properties: props}
}

func marshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("marshal %v: %v", v, err)
	}
	return b
}

// add inserts e and returns its ETag.
func add(t *testing.T, c *aztables.Client, e aztables.EDMEntity) azcore.ETag {
	t.Helper()
	resp, err := c.AddEntity(testCtx(t), marshal(t, e), nil)
	if err != nil {
		t.Fatalf("add %s/%s: %v", e.PartitionKey, e.RowKey, err)
	}
	if resp.ETag == "" {
		t.Fatalf("add %s/%s: no ETag", e.PartitionKey, e.RowKey)
	}
	return resp.ETag
}

// get reads an entity, and its ETag.
func get(t *testing.T, c *aztables.Client, pk, rk string) (aztables.EDMEntity, azcore.ETag) {
	t.Helper()
	resp, err := c.GetEntity(testCtx(t), pk, rk, nil)
	if err != nil {
		t.Fatalf("get %s/%s: %v", pk, rk, err)
	}
	var e aztables.EDMEntity
	if err := json.Unmarshal(resp.Value, &e); err != nil {
		t.Fatalf("get %s/%s: decode %s: %v", pk, rk, resp.Value, err)
	}
	if resp.ETag == "" {
		t.Fatalf("get %s/%s: no ETag", pk, rk)
	}
	return e, resp.ETag
}

// getRaw reads an entity as the JSON object the service sent.
func getRaw(t *testing.T, c *aztables.Client, pk, rk string, format *aztables.MetadataFormat) map[string]json.RawMessage {
	t.Helper()
	resp, err := c.GetEntity(testCtx(t), pk, rk, &aztables.GetEntityOptions{Format: format})
	if err != nil {
		t.Fatalf("get %s/%s: %v", pk, rk, err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(resp.Value, &m); err != nil {
		t.Fatalf("get %s/%s: decode %s: %v", pk, rk, resp.Value, err)
	}
	return m
}

// exists says whether the entity is there.
func exists(t *testing.T, c *aztables.Client, pk, rk string) bool {
	t.Helper()
	_, err := c.GetEntity(testCtx(t), pk, rk, nil)
	if err == nil {
		return true
	}
	var re *azcore.ResponseError
	if errors.As(err, &re) && re.StatusCode == http.StatusNotFound {
		return false
	}
	t.Fatalf("get %s/%s: %v", pk, rk, err)
	return false
}

// page is one page of a query: its entities and continuation.
type page struct {
	entities []aztables.EDMEntity
	nextPK   string
	nextRK   string
}

// query runs a query to its end and returns every page.
func query(t *testing.T, c *aztables.Client, opts *aztables.ListEntitiesOptions) []page {
	t.Helper()
	ps, err := queryErr(testCtx(t), c, opts)
	if err != nil {
		f := "<none>"
		if opts != nil && opts.Filter != nil {
			f = *opts.Filter
		}
		t.Fatalf("query (filter %s): %v", f, err)
	}
	return ps
}

func queryErr(ctx context.Context, c *aztables.Client, opts *aztables.ListEntitiesOptions) ([]page, error) {
	var out []page
	pager := c.NewListEntitiesPager(opts)
	for pager.More() {
		if len(out) > 1000 {
			return out, errors.New("more than 1000 pages: a continuation that does not end")
		}
		resp, err := pager.NextPage(ctx)
		if err != nil {
			return out, err
		}
		var p page
		for _, raw := range resp.Entities {
			var e aztables.EDMEntity
			if err := json.Unmarshal(raw, &e); err != nil {
				return out, fmt.Errorf("decode %s: %w", raw, err)
			}
			p.entities = append(p.entities, e)
		}
		if resp.NextPartitionKey != nil {
			p.nextPK = *resp.NextPartitionKey
		}
		if resp.NextRowKey != nil {
			p.nextRK = *resp.NextRowKey
		}
		out = append(out, p)
	}
	return out, nil
}

// keys lists "pk/rk" of every entity of every page, in order.
func keys(ps []page) []string {
	var out []string
	for _, p := range ps {
		for _, e := range p.entities {
			out = append(out, e.PartitionKey+"/"+e.RowKey)
		}
	}
	return out
}

func filterOpts(f string) *aztables.ListEntitiesOptions {
	return &aztables.ListEntitiesOptions{Filter: &f}
}

func sameStrings(a, b []string) bool { return slices.Equal(a, b) }

func joinKeys(k []string) string { return "[" + strings.Join(k, " ") + "]" }

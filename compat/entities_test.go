package compat

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/data/aztables"
)

// TestInsertGet: Insert Entity, a second insert of the same keys, Get
// Entity and a get of a missing entity.
func TestInsertGet(t *testing.T) {
	t.Parallel()
	c := newTable(t)
	ctx := testCtx(t)
	etag := add(t, c, ent("p1", "r1", map[string]any{"Name": "one", "N": int32(1)}))

	_, err := c.AddEntity(ctx, marshal(t, ent("p1", "r1", map[string]any{"Name": "again"})), nil)
	wantErr(t, err, http.StatusConflict, "EntityAlreadyExists")

	e, getTag := get(t, c, "p1", "r1")
	if getTag != etag {
		t.Fatalf("get ETag %q, insert ETag %q", getTag, etag)
	}
	if e.PartitionKey != "p1" || e.RowKey != "r1" || e.Properties["Name"] != "one" || e.Properties["N"] != int32(1) {
		t.Fatalf("got %+v", e)
	}
	if e.ETag != string(etag) {
		t.Fatalf("odata.etag %q, ETag header %q", e.ETag, etag)
	}
	if ts := time.Time(e.Timestamp); time.Since(ts) > time.Hour || time.Until(ts) > time.Hour {
		t.Fatalf("Timestamp %v is not about now", ts)
	}

	_, err = c.GetEntity(ctx, "p1", "missing", nil)
	wantErr(t, err, http.StatusNotFound, "ResourceNotFound")
	_, err = c.GetEntity(ctx, "missing", "r1", nil)
	wantErr(t, err, http.StatusNotFound, "ResourceNotFound")

	// Keys with quotes (doubled in the URL), spaces, percent signs and
	// non-ASCII letters address their entity. (Inserted from a plain map:
	// EDMEntity.MarshalJSON doubles quotes in the keys of the body too, an
	// SDK bug that would store "it''s".)
	for _, k := range []string{"it's", "a b", "100%", "ünïcødé ✓", "'", "''x''", "a+b&c=d"} {
		body := marshal(t, map[string]any{"PartitionKey": k, "RowKey": k, "K": k})
		if _, err := c.AddEntity(ctx, body, nil); err != nil {
			t.Fatalf("add key %q: %v", k, err)
		}
		e, _ := get(t, c, k, k)
		if e.PartitionKey != k || e.RowKey != k || e.Properties["K"] != k {
			t.Fatalf("key %q: got %+v", k, e)
		}
		if _, err := c.DeleteEntity(ctx, k, k, nil); err != nil {
			t.Fatalf("delete key %q: %v", k, err)
		}
		if exists(t, c, k, k) {
			t.Fatalf("key %q still there after delete", k)
		}
	}
}

// TestTimestampIsTheServers: the service sets Timestamp on every write; a
// Timestamp the client sends is ignored.
func TestTimestampIsTheServers(t *testing.T) {
	t.Parallel()
	c := newTable(t)
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	body := `{"PartitionKey":"p","RowKey":"r","Timestamp":"2001-02-03T04:05:06Z","Timestamp@odata.type":"Edm.DateTime","X":1}`
	if _, err := c.AddEntity(testCtx(t), []byte(body), nil); err != nil {
		t.Fatalf("add: %v", err)
	}
	e1, tag1 := get(t, c, "p", "r")
	if time.Time(e1.Timestamp).Equal(old) || time.Since(time.Time(e1.Timestamp)) > time.Hour {
		t.Fatalf("Timestamp %v: want the server's time of the write", time.Time(e1.Timestamp))
	}
	if _, err := c.UpdateEntity(testCtx(t), marshal(t, ent("p", "r", map[string]any{"X": int32(2)})), nil); err != nil {
		t.Fatalf("merge: %v", err)
	}
	e2, tag2 := get(t, c, "p", "r")
	if tag2 == tag1 {
		t.Fatalf("ETag unchanged by a write: %q", tag1)
	}
	if time.Time(e2.Timestamp).Before(time.Time(e1.Timestamp)) {
		t.Fatalf("Timestamp went back: %v then %v", time.Time(e1.Timestamp), time.Time(e2.Timestamp))
	}
}

// TestUpdateWithETag: Update Entity (replace) and Merge Entity with an
// ETag, with a stale ETag (412 UpdateConditionNotSatisfied), with "*",
// and on a missing entity.
func TestUpdateWithETag(t *testing.T) {
	t.Parallel()
	c := newTable(t)
	ctx := testCtx(t)
	tag0 := add(t, c, ent("p", "r", map[string]any{"A": "a0", "B": "b0"}))

	// Replace drops the properties it does not carry.
	resp, err := c.UpdateEntity(ctx, marshal(t, ent("p", "r", map[string]any{"A": "a1"})),
		&aztables.UpdateEntityOptions{IfMatch: &tag0, UpdateMode: aztables.UpdateModeReplace})
	if err != nil {
		t.Fatalf("replace with the current ETag: %v", err)
	}
	tag1 := resp.ETag
	if tag1 == "" || tag1 == tag0 {
		t.Fatalf("replace: ETag %q (before %q)", tag1, tag0)
	}
	e, gtag := get(t, c, "p", "r")
	if gtag != tag1 || e.Properties["A"] != "a1" || e.Properties["B"] != nil {
		t.Fatalf("after replace: %+v ETag %q (want %q)", e.Properties, gtag, tag1)
	}

	// Stale ETags are refused, for replace and merge, and change nothing.
	for _, mode := range []aztables.UpdateMode{aztables.UpdateModeReplace, aztables.UpdateModeMerge} {
		_, err = c.UpdateEntity(ctx, marshal(t, ent("p", "r", map[string]any{"A": "stale"})),
			&aztables.UpdateEntityOptions{IfMatch: &tag0, UpdateMode: mode})
		wantErr(t, err, http.StatusPreconditionFailed, "UpdateConditionNotSatisfied")
	}
	if e, _ := get(t, c, "p", "r"); e.Properties["A"] != "a1" {
		t.Fatalf("a refused update changed the entity: %+v", e.Properties)
	}

	// Merge keeps the properties it does not carry.
	resp, err = c.UpdateEntity(ctx, marshal(t, ent("p", "r", map[string]any{"C": "c2"})),
		&aztables.UpdateEntityOptions{IfMatch: &tag1, UpdateMode: aztables.UpdateModeMerge})
	if err != nil {
		t.Fatalf("merge with the current ETag: %v", err)
	}
	tag2 := resp.ETag
	if tag2 == "" || tag2 == tag1 {
		t.Fatalf("merge: ETag %q (before %q)", tag2, tag1)
	}
	e, _ = get(t, c, "p", "r")
	if e.Properties["A"] != "a1" || e.Properties["C"] != "c2" {
		t.Fatalf("after merge: %+v", e.Properties)
	}

	// "*" matches any version.
	star := azcore.ETagAny
	for _, mode := range []aztables.UpdateMode{aztables.UpdateModeReplace, aztables.UpdateModeMerge} {
		if _, err := c.UpdateEntity(ctx, marshal(t, ent("p", "r", map[string]any{"D": string(mode)})),
			&aztables.UpdateEntityOptions{IfMatch: &star, UpdateMode: mode}); err != nil {
			t.Fatalf("%s with *: %v", mode, err)
		}
	}
	e, _ = get(t, c, "p", "r")
	if e.Properties["D"] != string(aztables.UpdateModeMerge) || e.Properties["A"] != nil {
		t.Fatalf("after replace and merge with *: %+v", e.Properties)
	}

	// Updates of a missing entity: 404, with "*" or an ETag.
	for _, mode := range []aztables.UpdateMode{aztables.UpdateModeReplace, aztables.UpdateModeMerge} {
		_, err = c.UpdateEntity(ctx, marshal(t, ent("p", "nope", map[string]any{"A": "x"})),
			&aztables.UpdateEntityOptions{IfMatch: &star, UpdateMode: mode})
		wantErr(t, err, http.StatusNotFound, "ResourceNotFound")
		_, err = c.UpdateEntity(ctx, marshal(t, ent("p", "nope", map[string]any{"A": "x"})),
			&aztables.UpdateEntityOptions{IfMatch: &tag2, UpdateMode: mode})
		wantErr(t, err, http.StatusNotFound, "ResourceNotFound")
	}
	if exists(t, c, "p", "nope") {
		t.Fatal("an update of a missing entity created it")
	}
}

// TestUpsert: Insert Or Replace and Insert Or Merge (PUT and MERGE
// without If-Match).
func TestUpsert(t *testing.T) {
	t.Parallel()
	c := newTable(t)
	ctx := testCtx(t)
	upsert := func(mode aztables.UpdateMode, rk string, props map[string]any) azcore.ETag {
		t.Helper()
		resp, err := c.UpsertEntity(ctx, marshal(t, ent("p", rk, props)), &aztables.UpsertEntityOptions{UpdateMode: mode})
		if err != nil {
			t.Fatalf("upsert %s %s: %v", mode, rk, err)
		}
		if resp.ETag == "" {
			t.Fatalf("upsert %s %s: no ETag", mode, rk)
		}
		return resp.ETag
	}
	// Inserts when missing.
	upsert(aztables.UpdateModeReplace, "rep", map[string]any{"A": "a", "B": "b"})
	upsert(aztables.UpdateModeMerge, "mrg", map[string]any{"A": "a", "B": "b"})
	for _, rk := range []string{"rep", "mrg"} {
		if e, _ := get(t, c, "p", rk); e.Properties["A"] != "a" || e.Properties["B"] != "b" {
			t.Fatalf("%s after the inserting upsert: %+v", rk, e.Properties)
		}
	}
	// Replaces or merges when there.
	tag := upsert(aztables.UpdateModeReplace, "rep", map[string]any{"C": "c"})
	e, gtag := get(t, c, "p", "rep")
	if e.Properties["A"] != nil || e.Properties["C"] != "c" || gtag != tag {
		t.Fatalf("rep after insert-or-replace: %+v ETag %q want %q", e.Properties, gtag, tag)
	}
	tag = upsert(aztables.UpdateModeMerge, "mrg", map[string]any{"A": "a2", "C": "c"})
	e, gtag = get(t, c, "p", "mrg")
	if e.Properties["A"] != "a2" || e.Properties["B"] != "b" || e.Properties["C"] != "c" || gtag != tag {
		t.Fatalf("mrg after insert-or-merge: %+v ETag %q want %q", e.Properties, gtag, tag)
	}
}

// TestDelete: Delete Entity with the current ETag, a stale one, "*", and
// on a missing entity.
func TestDelete(t *testing.T) {
	t.Parallel()
	c := newTable(t)
	ctx := testCtx(t)
	tag0 := add(t, c, ent("p", "r", map[string]any{"A": "a"}))
	up, err := c.UpdateEntity(ctx, marshal(t, ent("p", "r", map[string]any{"A": "b"})), nil)
	if err != nil {
		t.Fatalf("merge: %v", err)
	}
	_, err = c.DeleteEntity(ctx, "p", "r", &aztables.DeleteEntityOptions{IfMatch: &tag0})
	wantErr(t, err, http.StatusPreconditionFailed, "UpdateConditionNotSatisfied")
	if !exists(t, c, "p", "r") {
		t.Fatal("a refused delete deleted")
	}
	if _, err := c.DeleteEntity(ctx, "p", "r", &aztables.DeleteEntityOptions{IfMatch: &up.ETag}); err != nil {
		t.Fatalf("delete with the current ETag: %v", err)
	}
	if exists(t, c, "p", "r") {
		t.Fatal("still there after delete")
	}
	_, err = c.DeleteEntity(ctx, "p", "r", nil)
	wantErr(t, err, http.StatusNotFound, "ResourceNotFound")
	_, err = c.DeleteEntity(ctx, "p", "r", &aztables.DeleteEntityOptions{IfMatch: &up.ETag})
	wantErr(t, err, http.StatusNotFound, "ResourceNotFound")

	// No ETag: the SDK sends If-Match: *, an unconditional delete.
	add(t, c, ent("p", "r2", nil))
	if _, err := c.UpdateEntity(ctx, marshal(t, ent("p", "r2", map[string]any{"A": "x"})), nil); err != nil {
		t.Fatalf("merge: %v", err)
	}
	if _, err := c.DeleteEntity(ctx, "p", "r2", nil); err != nil {
		t.Fatalf("delete with *: %v", err)
	}
	if exists(t, c, "p", "r2") {
		t.Fatal("r2 still there after delete with *")
	}
}

// TestMetadataLevels: Get Entity with no, minimal and full metadata.
func TestMetadataLevels(t *testing.T) {
	t.Parallel()
	c := newTable(t)
	add(t, c, ent("p", "r", map[string]any{"S": "s", "L": aztables.EDMInt64(5)}))

	none := getRaw(t, c, "p", "r", ptr(aztables.MetadataFormatNone))
	if _, ok := none["odata.etag"]; ok {
		t.Errorf("nometadata carries odata.etag: %v", keysOf(none))
	}
	if _, ok := none["L@odata.type"]; ok {
		t.Errorf("nometadata carries type annotations: %v", keysOf(none))
	}
	if string(none["S"]) != `"s"` || string(none["PartitionKey"]) != `"p"` {
		t.Errorf("nometadata: %v", none)
	}

	minimal := getRaw(t, c, "p", "r", ptr(aztables.MetadataFormatMinimal))
	for _, k := range []string{"odata.metadata", "odata.etag"} {
		if _, ok := minimal[k]; !ok {
			t.Errorf("minimalmetadata lacks %s: %v", k, keysOf(minimal))
		}
	}
	if string(minimal["L@odata.type"]) != `"Edm.Int64"` || string(minimal["L"]) != `"5"` {
		t.Errorf("minimalmetadata Int64: %s %s", minimal["L"], minimal["L@odata.type"])
	}

	full := getRaw(t, c, "p", "r", ptr(aztables.MetadataFormatFull))
	for _, k := range []string{"odata.metadata", "odata.etag", "odata.type", "odata.id", "odata.editLink", "Timestamp@odata.type"} {
		if _, ok := full[k]; !ok {
			t.Errorf("fullmetadata lacks %s: %v", k, keysOf(full))
		}
	}
	if !strings.Contains(string(full["odata.editLink"]), "PartitionKey='p',RowKey='r'") {
		t.Errorf("fullmetadata odata.editLink %s", full["odata.editLink"])
	}
}

func keysOf[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

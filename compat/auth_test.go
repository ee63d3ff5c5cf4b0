package compat

import (
	"encoding/base64"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/data/aztables"
)

// TestSharedKeyLite: the SDK signs with Shared Key Lite (every other test
// does too); a wrong key or no credential is refused.
func TestSharedKeyLite(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	c, name := newNamedTable(t)
	add(t, c, ent("p", "r", nil))

	// NewServiceClientWithSharedKey, not from a connection string.
	svc, err := aztables.NewServiceClientWithSharedKey(target.endpoint, target.cred, clientOpts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.NewClient(name).GetEntity(ctx, "p", "r", nil); err != nil {
		t.Fatalf("get with the shared key credential: %v", err)
	}

	wrongKey := base64.StdEncoding.EncodeToString([]byte(strings.Repeat("k", 64)))
	wrong, err := aztables.NewSharedKeyCredential(target.account, wrongKey)
	if err != nil {
		t.Fatal(err)
	}
	bad, err := aztables.NewServiceClientWithSharedKey(target.endpoint, wrong, clientOpts)
	if err != nil {
		t.Fatal(err)
	}
	_, err = bad.NewClient(name).GetEntity(ctx, "p", "r", nil)
	wantStatus(t, err, http.StatusForbidden)
	_, err = bad.CreateTable(ctx, uniqueName("Wrong"), nil)
	wantStatus(t, err, http.StatusForbidden)

	anon, err := aztables.NewServiceClientWithNoCredential(target.endpoint, clientOpts)
	if err != nil {
		t.Fatal(err)
	}
	_, err = anon.NewClient(name).GetEntity(ctx, "p", "r", nil)
	wantStatus(t, err, http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound)
	_, err = anon.CreateTable(ctx, uniqueName("Anon"), nil)
	wantStatus(t, err, http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound)
}

// TestSharedKeyFull: the Shared Key (not Lite) Table form, signed by
// hand since the Go SDK only signs Lite:
//
//	VERB \n Content-MD5 \n Content-Type \n Date \n CanonicalizedResource
func TestSharedKeyFull(t *testing.T) {
	t.Parallel()
	name := uniqueName("Full")
	resp, body := rawDo(t, "POST", "/Tables", nil, `{"TableName":"`+name+`"}`, target.key)
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusNoContent {
		t.Fatalf("create table with Shared Key: %d %s", resp.StatusCode, body)
	}
	t.Cleanup(func() { _, _ = target.svc.DeleteTable(t.Context(), name, nil) })
	resp, body = rawDo(t, "GET", "/Tables", nil, "", target.key)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, name) {
		t.Fatalf("query tables with Shared Key: %d %s", resp.StatusCode, body)
	}
	wrongKey := base64.StdEncoding.EncodeToString([]byte(strings.Repeat("k", 64)))
	resp, body = rawDo(t, "GET", "/Tables", nil, "", wrongKey)
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("query tables with a wrong Shared Key: %d %s", resp.StatusCode, body)
	}
}

// sasClient is a client of table name through a service SAS with perms.
func sasClient(t *testing.T, name, perms string, start, expiry time.Time) *aztables.Client {
	t.Helper()
	return sasClientFor(t, name, name, perms, start, expiry)
}

// sasClientFor is a client of table name through a service SAS of table
// sasTable.
func sasClientFor(t *testing.T, name, sasTable, perms string, start, expiry time.Time) *aztables.Client {
	t.Helper()
	sas, err := aztables.SASSignatureValues{
		Protocol:    aztables.SASProtocolHTTPSandHTTP,
		StartTime:   start,
		ExpiryTime:  expiry,
		Permissions: perms,
		TableName:   sasTable,
	}.Sign(target.cred)
	if err != nil {
		t.Fatal(err)
	}
	c, err := aztables.NewClientWithNoCredential(target.endpoint+"/"+name+"?"+sas, clientOpts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestServiceSAS: a table SAS grants what its permissions say on its
// table only: a read-only SAS reads and refuses writes with 403
// AuthorizationPermissionMismatch; an expired SAS and a SAS of another
// table are refused.
func TestServiceSAS(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	c, name := newNamedTable(t)
	add(t, c, ent("p", "r", map[string]any{"A": "a"}))
	now := time.Now().UTC()

	ro := sasClient(t, name, "r", now.Add(-time.Hour), now.Add(time.Hour))
	if _, err := ro.GetEntity(ctx, "p", "r", nil); err != nil {
		t.Fatalf("get through a read SAS: %v", err)
	}
	if n := len(keys(query(t, ro, nil))); n != 1 {
		t.Fatalf("query through a read SAS: %d entities", n)
	}
	_, err := ro.AddEntity(ctx, marshal(t, ent("p", "r2", nil)), nil)
	wantErr(t, err, http.StatusForbidden, "AuthorizationPermissionMismatch")
	_, err = ro.UpsertEntity(ctx, marshal(t, ent("p", "r", map[string]any{"A": "x"})), nil)
	wantErr(t, err, http.StatusForbidden, "AuthorizationPermissionMismatch")
	_, err = ro.DeleteEntity(ctx, "p", "r", nil)
	wantErr(t, err, http.StatusForbidden, "AuthorizationPermissionMismatch")
	_, err = ro.SubmitTransaction(ctx, []aztables.TransactionAction{act(t, aztables.TransactionTypeAdd, ent("p", "r3", nil), nil)}, nil)
	if err == nil {
		t.Fatal("a transaction through a read SAS succeeded")
	}
	if exists(t, c, "p", "r2") || exists(t, c, "p", "r3") {
		t.Fatal("a write through a read SAS applied")
	}

	rw := sasClient(t, name, "raud", now.Add(-time.Hour), now.Add(time.Hour))
	add(t, rw, ent("p", "w", map[string]any{"A": "w"}))
	if _, err := rw.UpdateEntity(ctx, marshal(t, ent("p", "w", map[string]any{"B": "b"})), nil); err != nil {
		t.Fatalf("merge through a raud SAS: %v", err)
	}
	if _, err := rw.DeleteEntity(ctx, "p", "w", nil); err != nil {
		t.Fatalf("delete through a raud SAS: %v", err)
	}

	addOnly := sasClient(t, name, "a", now.Add(-time.Hour), now.Add(time.Hour))
	add(t, addOnly, ent("p", "a", nil))
	_, err = addOnly.GetEntity(ctx, "p", "a", nil)
	wantErr(t, err, http.StatusForbidden, "AuthorizationPermissionMismatch")

	expired := sasClient(t, name, "r", now.Add(-2*time.Hour), now.Add(-time.Hour))
	_, err = expired.GetEntity(ctx, "p", "r", nil)
	wantStatus(t, err, http.StatusForbidden)

	// The SAS of table name, sent for another table.
	other, otherName := newNamedTable(t)
	add(t, other, ent("p", "r", nil))
	cross := sasClientFor(t, otherName, name, "r", now.Add(-time.Hour), now.Add(time.Hour))
	_, err = cross.GetEntity(ctx, "p", "r", nil)
	wantStatus(t, err, http.StatusForbidden)
}

// TestAccountSAS: an account SAS (ss=t) with read and list permissions
// lists tables and reads entities, and refuses to create a table.
func TestAccountSAS(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	c, name := newNamedTable(t)
	add(t, c, ent("p", "r", nil))
	now := time.Now().UTC()
	perms := aztables.AccountSASPermissions{Read: true, List: true}
	res := aztables.AccountSASResourceTypes{Service: true, Container: true, Object: true}
	qp, err := aztables.AccountSASSignatureValues{
		Protocol:      aztables.SASProtocolHTTPSandHTTP,
		StartTime:     now.Add(-time.Hour),
		ExpiryTime:    now.Add(time.Hour),
		Permissions:   perms.String(),
		Services:      "t",
		ResourceTypes: res.String(),
	}.Sign(target.cred)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := aztables.NewServiceClientWithNoCredential(target.endpoint+"/?"+qp.Encode(), clientOpts)
	if err != nil {
		t.Fatal(err)
	}
	f := "TableName eq '" + name + "'"
	resp, err := svc.NewListTablesPager(&aztables.ListTablesOptions{Filter: &f}).NextPage(ctx)
	if err != nil {
		t.Fatalf("list tables through a read/list account SAS: %v", err)
	}
	if len(resp.Tables) != 1 {
		t.Fatalf("list tables through an account SAS: %d tables", len(resp.Tables))
	}
	if _, err := svc.NewClient(name).GetEntity(ctx, "p", "r", nil); err != nil {
		t.Fatalf("get through a read account SAS: %v", err)
	}
	_, err = svc.CreateTable(ctx, uniqueName("Sas"), nil)
	wantErr(t, err, http.StatusForbidden, "AuthorizationPermissionMismatch")
	_, err = svc.NewClient(name).AddEntity(ctx, marshal(t, ent("p", "x", nil)), nil)
	wantErr(t, err, http.StatusForbidden, "AuthorizationPermissionMismatch")
}

package frontend_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/frontend"
	"github.com/tabuladb/tabula/frontend/sharedkey"
	"github.com/tabuladb/tabula/internal/testcluster"
)

// azure is a test's view of a gateway: an account and its key.
type azure struct {
	t       *testing.T
	url     string // the account's URL
	account string
	key     []byte
	masters []string
	cred    client.Credential
	// sasQuery, when set, is added to every request's query (and key
	// is nil: the SAS is the credential).
	sasQuery string
}

// startGateway starts a cluster, a tenant and a gateway over it.
func startGateway(t *testing.T) *azure {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tc, err := testcluster.Start(ctx, testcluster.Options{Servers: 3, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tc.Close() })
	cc, err := grpc.NewClient(tc.MasterAddr(), append(tc.Credential().DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	resp, err := api.NewMasterClient(cc).CreateTenant(ctx, &api.CreateTenantRequest{Tenant: "acct"})
	if err != nil {
		t.Fatal(err)
	}
	gw, err := frontend.New(ctx, frontend.Options{Masters: tc.MasterAddrs(), Credential: tc.Credential()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)
	return &azure{t: t, url: srv.URL + "/acct", account: "acct", key: resp.GetTenant().GetKeys()[0], masters: tc.MasterAddrs(), cred: tc.Credential()}
}

// do sends a signed request (Shared Key Lite, as aztables signs) and
// returns the status, headers and body.
func (a *azure) do(method, path string, hdr map[string]string, body any) (int, http.Header, []byte) {
	a.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			a.t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	u := a.url + path
	if a.sasQuery != "" {
		sep := "?"
		if strings.Contains(path, "?") {
			sep = "&"
		}
		u += sep + a.sasQuery
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		a.t.Fatal(err)
	}
	req.Header.Set("x-ms-version", "2019-02-02")
	req.Header.Set("Accept", "application/json;odata=minimalmetadata")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-ms-date", time.Now().UTC().Format(http.TimeFormat))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	if a.key != nil {
		sharedkey.SignSharedKeyLite(req, a.account, a.key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		a.t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, out
}

// want fails unless the status is as expected (and, for errors, the code).
func (a *azure) want(what string, status int, code string, gotStatus int, h http.Header, body []byte) {
	a.t.Helper()
	if gotStatus != status || (code != "" && h.Get("x-ms-error-code") != code) {
		a.t.Fatalf("%s: %d %s %s; want %d %s", what, gotStatus, h.Get("x-ms-error-code"), body, status, code)
	}
}

// TestGatewayTablesAndEntities drives the REST surface end to end: tables,
// every entity operation with ETags, queries with filters and pages, and
// refusals with the service's codes.
func TestGatewayTablesAndEntities(t *testing.T) {
	a := startGateway(t)
	st, h, b := a.do("POST", "/Tables", nil, map[string]string{"TableName": "People"})
	a.want("create table", 201, "", st, h, b)
	st, h, b = a.do("POST", "/Tables", nil, map[string]string{"TableName": "people"})
	a.want("create it again in lower case", 409, "TableAlreadyExists", st, h, b)
	st, h, b = a.do("POST", "/Tables", nil, map[string]string{"TableName": "1bad"})
	a.want("bad table name", 400, "", st, h, b)
	st, h, b = a.do("GET", "/Tables", nil, nil)
	a.want("query tables", 200, "", st, h, b)
	if !strings.Contains(string(b), `"TableName":"People"`) {
		t.Fatalf("query tables: %s", b)
	}

	ent := map[string]any{"PartitionKey": "p1", "RowKey": "r1", "Name": "Ada", "Age": 36,
		"Big": "9007199254740993", "Big@odata.type": "Edm.Int64", "Score": 2.5, "Active": true}
	st, h, b = a.do("POST", "/People", map[string]string{"Prefer": "return-content"}, ent)
	a.want("insert", 201, "", st, h, b)
	etag := h.Get("ETag")
	if !strings.HasPrefix(etag, `W/"datetime'`) {
		t.Fatalf("insert ETag %q", etag)
	}
	st, h, b = a.do("POST", "/people", nil, ent)
	a.want("insert again (table name in another case)", 409, "EntityAlreadyExists", st, h, b)
	st, h, b = a.do("GET", "/People(PartitionKey='p1',RowKey='r1')", nil, nil)
	a.want("get", 200, "", st, h, b)
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil || got["Name"] != "Ada" || got["Big"] != "9007199254740993" || got["Big@odata.type"] != "Edm.Int64" || h.Get("ETag") != etag {
		t.Fatalf("get: %s (ETag %q, want %q)", b, h.Get("ETag"), etag)
	}
	st, h, b = a.do("GET", "/People(PartitionKey='p1',RowKey='nope')", nil, nil)
	a.want("get missing", 404, "ResourceNotFound", st, h, b)

	// Replace with a stale ETag, then the right one; merge; upserts.
	stale := strings.Replace(etag, "datetime'20", "datetime'19", 1)
	st, h, b = a.do("PUT", "/People(PartitionKey='p1',RowKey='r1')", map[string]string{"If-Match": stale}, map[string]any{"Name": "Bob"})
	a.want("replace with a stale ETag", 412, "UpdateConditionNotSatisfied", st, h, b)
	st, h, b = a.do("PUT", "/People(PartitionKey='p1',RowKey='r1')", map[string]string{"If-Match": etag}, map[string]any{"Name": "Bob"})
	a.want("replace", 204, "", st, h, b)
	etag2 := h.Get("ETag")
	if etag2 == etag || etag2 == "" {
		t.Fatalf("replace: ETag %q after %q", etag2, etag)
	}
	st, h, b = a.do("MERGE", "/People(PartitionKey='p1',RowKey='r1')", map[string]string{"If-Match": "*"}, map[string]any{"City": "Paris"})
	a.want("merge", 204, "", st, h, b)
	_, _, b = a.do("GET", "/People(PartitionKey='p1',RowKey='r1')", nil, nil)
	got = nil
	if err := json.Unmarshal(b, &got); err != nil || got["Name"] != "Bob" || got["City"] != "Paris" || got["Age"] != nil {
		t.Fatalf("after replace and merge: %s", b)
	}
	st, h, b = a.do("MERGE", "/People(PartitionKey='p1',RowKey='r9')", map[string]string{"If-Match": "*"}, map[string]any{"City": "Rome"})
	a.want("merge into a missing entity", 404, "ResourceNotFound", st, h, b)
	st, h, b = a.do("PATCH", "/People(PartitionKey='p1',RowKey='r9')", nil, map[string]any{"City": "Rome"})
	a.want("insert or merge", 204, "", st, h, b)
	st, h, b = a.do("PUT", "/People(PartitionKey='p1',RowKey='r8')", nil, map[string]any{"City": "Oslo"})
	a.want("insert or replace", 204, "", st, h, b)

	// Queries: filters, pages of $top with continuation.
	for i := range 12 {
		st, h, b = a.do("POST", "/People", map[string]string{"Prefer": "return-no-content"}, map[string]any{"PartitionKey": "p2", "RowKey": fmt.Sprintf("r%02d", i), "N": i})
		a.want("insert p2", 204, "", st, h, b)
	}
	var keys []string
	next := ""
	pages := 0
	for {
		path := "/People()?$filter=" + url.QueryEscape("PartitionKey eq 'p2' and N ge 3") + "&$top=4" + next
		st, h, b = a.do("GET", path, nil, nil)
		a.want("query page", 200, "", st, h, b)
		var feed struct {
			Value []map[string]any `json:"value"`
		}
		if err := json.Unmarshal(b, &feed); err != nil {
			t.Fatalf("query: %s", b)
		}
		for _, e := range feed.Value {
			keys = append(keys, e["RowKey"].(string))
		}
		pages++
		npk, nrk := h.Get("x-ms-continuation-NextPartitionKey"), h.Get("x-ms-continuation-NextRowKey")
		if npk == "" {
			break
		}
		next = "&NextPartitionKey=" + url.QueryEscape(npk) + "&NextRowKey=" + url.QueryEscape(nrk)
	}
	if want := "r03 r04 r05 r06 r07 r08 r09 r10 r11"; strings.Join(keys, " ") != want || pages != 3 {
		t.Fatalf("paged query: %d pages, %q; want 3 pages, %q", pages, strings.Join(keys, " "), want)
	}
	st, h, b = a.do("GET", "/People()?$filter="+url.QueryEscape("City eq 'Rome' or City eq 'Oslo'")+"&$select=City", nil, nil)
	a.want("query with or and select", 200, "", st, h, b)
	if !strings.Contains(string(b), `"City":"Rome"`) || !strings.Contains(string(b), `"City":"Oslo"`) || strings.Contains(string(b), `"N"`) {
		t.Fatalf("query with or and select: %s", b)
	}
	st, h, b = a.do("GET", "/People()?$filter="+url.QueryEscape("N eq"), nil, nil)
	a.want("bad filter", 400, "InvalidInput", st, h, b)

	// Deletes; then the table goes.
	st, h, b = a.do("DELETE", "/People(PartitionKey='p1',RowKey='r1')", map[string]string{"If-Match": etag}, nil)
	a.want("delete with a stale ETag", 412, "UpdateConditionNotSatisfied", st, h, b)
	st, h, b = a.do("DELETE", "/People(PartitionKey='p1',RowKey='r1')", map[string]string{"If-Match": "*"}, nil)
	a.want("delete", 204, "", st, h, b)
	st, h, b = a.do("DELETE", "/People(PartitionKey='p1',RowKey='r1')", map[string]string{"If-Match": "*"}, nil)
	a.want("delete again", 404, "ResourceNotFound", st, h, b)
	st, h, b = a.do("DELETE", "/Tables('people')", nil, nil)
	a.want("delete table", 204, "", st, h, b)
	st, h, b = a.do("GET", "/People(PartitionKey='p2',RowKey='r01')", nil, nil)
	a.want("get from a deleted table", 404, "TableNotFound", st, h, b)
	st, h, b = a.do("DELETE", "/Tables('people')", nil, nil)
	a.want("delete a missing table", 404, "ResourceNotFound", st, h, b)

	// Signatures.
	a.key = []byte("not the key, not the key, not the key, not the key, not the key!!")
	st, h, b = a.do("GET", "/Tables", nil, nil)
	if st != 403 || !strings.Contains(string(b), "<Code>AuthenticationFailed</Code>") {
		t.Fatalf("wrong key: %d %s", st, b)
	}
	a.key = nil
	st, _, b = a.do("GET", "/Tables", nil, nil)
	if st != 403 {
		t.Fatalf("unsigned: %d %s", st, b)
	}
}

// batchBody builds a $batch body of one changeset, as the SDKs send it.
func batchBody(host string, ops []string) (contentType, body string) {
	var b strings.Builder
	b.WriteString("--batch_b1\r\nContent-Type: multipart/mixed; boundary=changeset_c1\r\n\r\n")
	for i, op := range ops {
		method, rest, _ := strings.Cut(op, " ")
		path, payload, _ := strings.Cut(rest, " ")
		fmt.Fprintf(&b, "--changeset_c1\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n\r\n")
		fmt.Fprintf(&b, "%s %s%s HTTP/1.1\r\nAccept: application/json;odata=minimalmetadata\r\nContent-Type: application/json\r\nContent-ID: %d\r\n", method, host, path, i+1)
		if method == "DELETE" {
			b.WriteString("If-Match: *\r\n")
		}
		fmt.Fprintf(&b, "\r\n%s\r\n", payload)
	}
	b.WriteString("--changeset_c1--\r\n--batch_b1--\r\n")
	return "multipart/mixed; boundary=batch_b1", b.String()
}

// TestGatewayBatch: an entity group transaction applies whole, and one
// failing operation (an insert of an entity that exists) applies
// nothing and names its index.
func TestGatewayBatch(t *testing.T) {
	a := startGateway(t)
	st, h, b := a.do("POST", "/Tables", nil, map[string]string{"TableName": "Batch"})
	a.want("create table", 201, "", st, h, b)
	host := strings.TrimSuffix(a.url, "/acct")
	var ops []string
	for i := range 100 {
		ops = append(ops, fmt.Sprintf(`POST /acct/Batch {"PartitionKey":"p","RowKey":"r%03d","N":%d}`, i, i))
	}
	ct, body := batchBody(host, ops)
	st, h, b = a.do("POST", "/$batch", map[string]string{"Content-Type": ct}, body)
	a.want("batch of 100 inserts", 202, "", st, h, b)
	if n := strings.Count(string(b), "HTTP/1.1 201"); n != 100 {
		t.Fatalf("batch of 100 inserts: %d created: %s", n, b)
	}
	// Update, merge, delete, and an insert that collides at index 3.
	ct, body = batchBody(host, []string{
		`PUT /acct/Batch(PartitionKey='p',RowKey='r000') {"N":1000}`,
		`MERGE /acct/Batch(PartitionKey='p',RowKey='r001') {"M":"merged"}`,
		`DELETE /acct/Batch(PartitionKey='p',RowKey='r002') `,
		`POST /acct/Batch {"PartitionKey":"p","RowKey":"r050","N":0}`,
	})
	st, h, b = a.do("POST", "/$batch", map[string]string{"Content-Type": ct}, body)
	a.want("failing batch", 202, "", st, h, b)
	if !strings.Contains(string(b), "409") || !strings.Contains(string(b), `3:The specified entity already exists.`) {
		t.Fatalf("failing batch: %s", b)
	}
	st, h, b = a.do("GET", "/Batch(PartitionKey='p',RowKey='r002')", nil, nil)
	a.want("the failed batch's delete did not apply", 200, "", st, h, b)
	// Without the collision it applies whole.
	ct, body = batchBody(host, []string{
		`PUT /acct/Batch(PartitionKey='p',RowKey='r000') {"N":1000}`,
		`MERGE /acct/Batch(PartitionKey='p',RowKey='r001') {"M":"merged"}`,
		`DELETE /acct/Batch(PartitionKey='p',RowKey='r002') `,
	})
	st, h, b = a.do("POST", "/$batch", map[string]string{"Content-Type": ct}, body)
	a.want("batch", 202, "", st, h, b)
	if n := strings.Count(string(b), "HTTP/1.1 204"); n != 3 {
		t.Fatalf("batch: %d of 3 answered 204: %s", n, b)
	}
	st, h, b = a.do("GET", "/Batch(PartitionKey='p',RowKey='r002')", nil, nil)
	a.want("deleted in the batch", 404, "ResourceNotFound", st, h, b)
	_, _, b = a.do("GET", "/Batch(PartitionKey='p',RowKey='r001')", nil, nil)
	if !strings.Contains(string(b), `"M":"merged"`) || !strings.Contains(string(b), `"N":1`) {
		t.Fatalf("merged in the batch: %s", b)
	}
	// Two partition keys, and 101 operations, are refused.
	ct, body = batchBody(host, []string{`POST /acct/Batch {"PartitionKey":"p","RowKey":"x1"}`, `POST /acct/Batch {"PartitionKey":"q","RowKey":"x2"}`})
	st, h, b = a.do("POST", "/$batch", map[string]string{"Content-Type": ct}, body)
	if st != 202 || !strings.Contains(string(b), "CommandsInBatchActOnDifferentPartitions") {
		t.Fatalf("batch over two partition keys: %d %s", st, b)
	}
	ops = append(ops, `POST /acct/Batch {"PartitionKey":"p","RowKey":"z"}`)
	ct, body = batchBody(host, ops)
	st, _, b = a.do("POST", "/$batch", map[string]string{"Content-Type": ct}, body)
	if !strings.Contains(string(b), "InvalidInput") {
		t.Fatalf("batch of 101: %d %s", st, b)
	}
}

// secondGateway starts another gateway over a's cluster, for a's account.
func (a *azure) secondGateway() *azure {
	a.t.Helper()
	gw, err := frontend.New(context.Background(), frontend.Options{Masters: a.masters, Credential: a.cred})
	if err != nil {
		a.t.Fatal(err)
	}
	a.t.Cleanup(func() { _ = gw.Close() })
	srv := httptest.NewServer(gw)
	a.t.Cleanup(srv.Close)
	return &azure{t: a.t, url: srv.URL + "/" + a.account, account: a.account, key: a.key, masters: a.masters, cred: a.cred}
}

// TestGatewayTwoGateways: a table dropped through one gateway can be
// created again through another that had it cached.
func TestGatewayTwoGateways(t *testing.T) {
	a := startGateway(t)
	st, h, b := a.do("POST", "/Tables", nil, map[string]string{"TableName": "Shared"})
	a.want("create table", 201, "", st, h, b)
	b2 := a.secondGateway()
	st, h, b = b2.do("GET", "/Shared()", nil, nil)
	a.want("query through the second gateway (caches the table)", 200, "", st, h, b)
	st, h, b = a.do("DELETE", "/Tables('Shared')", nil, nil)
	a.want("drop through the first", 204, "", st, h, b)
	st, h, b = b2.do("POST", "/Tables", nil, map[string]string{"TableName": "Shared"})
	a.want("create again through the second", 201, "", st, h, b)
}

// TestGatewayTableNameCase: names that differ only in case are one table.
// Two gateways creating one name in two cases at once: one create wins,
// the other is told the table exists, and one table remains. Tables the
// SDK made in two cases are read as the older one by every gateway.
func TestGatewayTableNameCase(t *testing.T) {
	a := startGateway(t)
	b := a.secondGateway()
	c, err := client.New(context.Background(), client.Options{Masters: a.masters, Credential: a.cred, Tenant: "acct"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for round := range 8 {
		names := []string{fmt.Sprintf("Race%d", round), fmt.Sprintf("rACE%d", round)}
		var wg sync.WaitGroup
		statuses := make([]int, 2)
		for i, gw := range []*azure{a, b} {
			wg.Go(func() {
				statuses[i], _, _ = gw.do("POST", "/Tables", nil, map[string]string{"TableName": names[i]})
			})
		}
		wg.Wait()
		slices.Sort(statuses)
		if statuses[0] != 201 || statuses[1] != 409 {
			t.Fatalf("round %d: creates of %v answered %v; want one 201 and one 409", round, names, statuses)
		}
		ts, err := c.ListTables(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, tb := range ts {
			if strings.EqualFold(tb.GetName(), names[0]) {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("round %d: %d tables named %s in some case; want 1", round, n, names[0])
		}
	}

	// Made in two cases around the gateways: the older is the table.
	for _, name := range []string{"Older", "older"} {
		if _, err := c.CreateTable(context.Background(), name, api.TableKind_TABLE_KIND_ORDERED, &api.TableOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, gw := range []*azure{a, b} {
		st, h, body := gw.do("GET", "/Tables('OLDER')", nil, nil)
		gw.want("get a table made in two cases", 200, "", st, h, body)
		if !strings.Contains(string(body), `"TableName":"Older"`) {
			t.Fatalf("table made in two cases reads as %s; want the older, Older", body)
		}
	}
}

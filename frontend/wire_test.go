package frontend_test

import (
	"bufio"
	"bytes"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// batchParts reads a $batch answer's operation responses, in order.
func batchParts(t *testing.T, h http.Header, body []byte) []*http.Response {
	t.Helper()
	_, params, err := mime.ParseMediaType(h.Get("Content-Type"))
	if err != nil {
		t.Fatalf("batch answer Content-Type %q: %v", h.Get("Content-Type"), err)
	}
	mr := multipart.NewReader(bytes.NewReader(body), params["boundary"])
	part, err := mr.NextPart()
	if err != nil {
		t.Fatalf("batch answer: %v: %s", err, body)
	}
	var out []*http.Response
	read := func(p *multipart.Part) {
		raw, err := io.ReadAll(p)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), nil)
		if err != nil {
			t.Fatalf("operation response %q: %v", raw, err)
		}
		out = append(out, resp)
	}
	mt, params, _ := mime.ParseMediaType(part.Header.Get("Content-Type"))
	if mt != "multipart/mixed" {
		read(part)
		return out
	}
	cs := multipart.NewReader(part, params["boundary"])
	for {
		p, err := cs.NextPart()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("changeset answer: %v: %s", err, body)
		}
		read(p)
	}
}

// TestGatewayBatchLocation: each insert and upsert of a changeset
// answers with the entity's URL in Location and DataServiceId, keys
// quoted as in an entity's address; @azure/data-tables reads each row
// key from them. Updates and deletes carry none.
func TestGatewayBatchLocation(t *testing.T) {
	a := startGateway(t)
	st, h, b := a.do("POST", "/Tables", nil, map[string]string{"TableName": "Loc"})
	a.want("create table", 201, "", st, h, b)
	host := strings.TrimSuffix(a.url, "/acct")
	ct, body := batchBody(host, []string{
		`POST /acct/Loc {"PartitionKey":"%it's","RowKey":"r 1"}`,
		`POST /acct/Loc {"PartitionKey":"%it's","RowKey":"r2"}`,
		`PUT /acct/Loc(PartitionKey='%25it''s',RowKey='up''1') {"N":1}`,
		`MERGE /acct/Loc(PartitionKey='%25it''s',RowKey='up2') {"N":2}`,
	})
	st, h, b = a.do("POST", "/$batch", map[string]string{"Content-Type": ct}, body)
	a.want("batch of inserts and upserts", 202, "", st, h, b)
	parts := batchParts(t, h, b)
	want := []string{
		a.url + "/Loc(PartitionKey='%25it''s',RowKey='r%201')",
		a.url + "/Loc(PartitionKey='%25it''s',RowKey='r2')",
		a.url + "/Loc(PartitionKey='%25it''s',RowKey='up''1')",
		a.url + "/Loc(PartitionKey='%25it''s',RowKey='up2')",
	}
	if len(parts) != len(want) {
		t.Fatalf("%d operation responses, want %d: %s", len(parts), len(want), b)
	}
	for i, p := range parts {
		if p.Header.Get("Location") != want[i] || p.Header.Get("DataServiceId") != want[i] || p.Header.Get("ETag") == "" {
			t.Errorf("operation %d: %d Location %q DataServiceId %q ETag %q; want %s", i, p.StatusCode,
				p.Header.Get("Location"), p.Header.Get("DataServiceId"), p.Header.Get("ETag"), want[i])
		}
	}
	// The address is one the gateway serves.
	u, err := url.Parse(parts[0].Header.Get("Location"))
	if err != nil {
		t.Fatal(err)
	}
	st, h, b = a.do("GET", strings.TrimPrefix(u.EscapedPath(), "/acct"), nil, nil)
	a.want("get by the Location", 200, "", st, h, b)
	if !strings.Contains(string(b), `"RowKey":"r 1"`) {
		t.Fatalf("get by the Location: %s", b)
	}

	ct, body = batchBody(host, []string{
		`PUT /acct/Loc(PartitionKey='%25it''s',RowKey='r2') {"N":3}`,
		`DELETE /acct/Loc(PartitionKey='%25it''s',RowKey='up2') `,
	})
	body = strings.Replace(body, "Content-ID: 1\r\n", "Content-ID: 1\r\nIf-Match: *\r\n", 1)
	st, h, b = a.do("POST", "/$batch", map[string]string{"Content-Type": ct}, body)
	a.want("batch of an update and a delete", 202, "", st, h, b)
	for i, p := range batchParts(t, h, b) {
		if p.StatusCode != 204 || p.Header.Get("Location") != "" || p.Header.Get("DataServiceId") != "" {
			t.Errorf("operation %d: %d Location %q DataServiceId %q; want 204 and neither", i, p.StatusCode, p.Header.Get("Location"), p.Header.Get("DataServiceId"))
		}
	}
}

// TestGatewayWireParsing: If-Match, x-ms-version, Boolean literals,
// legacy batch parts and $top are read as the service reads them.
func TestGatewayWireParsing(t *testing.T) {
	a := startGateway(t)
	st, h, b := a.do("POST", "/Tables", nil, map[string]string{"TableName": "Wire"})
	a.want("create table", 201, "", st, h, b)
	st, h, b = a.do("POST", "/Wire", map[string]string{"Prefer": "return-no-content"}, map[string]any{"PartitionKey": "p", "RowKey": "r", "myBool": true})
	a.want("insert", 204, "", st, h, b)
	etag := h.Get("ETag")
	const ent = "/Wire(PartitionKey='p',RowKey='r')"
	host := strings.TrimSuffix(a.url, "/acct")
	// sub runs one part of the test with its own t.
	sub := func(name string, f func(a *azure, t *testing.T)) {
		t.Run(name, func(t *testing.T) {
			c := *a
			c.t = t
			f(&c, t)
		})
	}

	sub("weak ETags", func(a *azure, t *testing.T) {
		// A weak ETag the gateway never gave is well-formed and matches
		// nothing (412); one that is not a weak ETag is refused (400). The
		// W of our own form may be lower case.
		for _, m := range []string{`W/"wrong"`, `w/"wrong"`, `W/"datetime'2015-01-01T23%3A14%3A33.4980000Z'"`, `w/"datetime'2015-01-01T23%3A14%3A33.4980000Z'"`} {
			for _, method := range []string{"PUT", "MERGE", "DELETE"} {
				st, h, b = a.do(method, ent, map[string]string{"If-Match": m}, map[string]any{"N": 1})
				a.want(method+" If-Match "+m, 412, "UpdateConditionNotSatisfied", st, h, b)
			}
		}
		for _, m := range []string{`"wrong"`, `"datetime'2015-01-01T23%3A14%3A33.4980000Z'"`, "wrong", `"`} {
			st, h, b = a.do("PUT", ent, map[string]string{"If-Match": m}, map[string]any{"N": 1})
			a.want("PUT If-Match "+m, 400, "InvalidInput", st, h, b)
		}
		st, h, b = a.do("GET", ent, nil, nil)
		a.want("get", 200, "", st, h, b)
		if h.Get("ETag") != etag {
			t.Fatalf("ETag %s after refused writes; want %s", h.Get("ETag"), etag)
		}
		st, h, b = a.do("PUT", ent, map[string]string{"If-Match": "w" + strings.TrimPrefix(etag, "W")}, map[string]any{"myBool": false})
		a.want("PUT with our ETag, w/ in lower case", 204, "", st, h, b)
		// In a batch too.
		ct, body := batchBody(host, []string{`PUT /acct/Wire(PartitionKey='p',RowKey='r') {"N":2}`})
		body = strings.Replace(body, "Content-ID: 1\r\n", "Content-ID: 1\r\nIf-Match: W/\"wrong\"\r\n", 1)
		st, h, b = a.do("POST", "/$batch", map[string]string{"Content-Type": ct}, body)
		a.want("batch update with a foreign weak ETag", 202, "", st, h, b)
		if p := batchParts(t, h, b); len(p) != 1 || p[0].StatusCode != 412 || p[0].Header.Get("x-ms-error-code") != "UpdateConditionNotSatisfied" {
			t.Fatalf("batch update with a foreign weak ETag: %s", b)
		}
	})

	sub("x-ms-version", func(a *azure, t *testing.T) {
		// x-ms-version: a version of the service is echoed; anything else is
		// refused before anything is done.
		for _, v := range []string{"2019-02-02", "2009-04-14", "2026-06-06"} {
			st, h, b = a.do("GET", "/Tables", map[string]string{"x-ms-version": v}, nil)
			a.want("x-ms-version "+v, 200, "", st, h, b)
			if h.Get("x-ms-version") != v {
				t.Fatalf("x-ms-version %s answered as %s", v, h.Get("x-ms-version"))
			}
		}
		for _, v := range []string{"invalid", "2019-02-03", "2030-01-01", "2019-2-2"} {
			st, h, b = a.do("POST", "/Tables", map[string]string{"x-ms-version": v}, map[string]string{"TableName": "NotMade"})
			a.want("create table at x-ms-version "+v, 400, "InvalidHeaderValue", st, h, b)
		}
		st, h, b = a.do("GET", "/Tables('NotMade')", nil, nil)
		a.want("the table refused for its version", 404, "", st, h, b)
	})

	sub("Boolean literals", func(a *azure, t *testing.T) {
		// Boolean literals in any case.
		st, h, b := a.do("PUT", "/Wire(PartitionKey='p',RowKey='b')", nil, map[string]any{"myBool": false})
		a.want("upsert b", 204, "", st, h, b)
		for _, f := range []string{"myBool eq False", "(PartitionKey eq 'p')and(myBool eq FALSE )", "not (myBool eq TRUE)"} {
			st, h, b = a.do("GET", "/Wire()?$filter="+url.QueryEscape(f), nil, nil)
			a.want("filter "+f, 200, "", st, h, b)
			if !strings.Contains(string(b), `"RowKey":"b"`) {
				t.Fatalf("filter %s: %s", f, b)
			}
		}
	})

	sub("$top", func(a *azure, t *testing.T) {
		// $top: at most 1,000, for entities and tables.
		st, h, b = a.do("GET", "/Wire()?$top=1000", nil, nil)
		a.want("$top=1000", 200, "", st, h, b)
		for _, path := range []string{"/Wire()?$top=1001", "/Tables?$top=1001"} {
			st, h, b = a.do("GET", path, nil, nil)
			a.want(path, 400, "InvalidInput", st, h, b)
		}
	})

	sub("legacy batch parts", func(a *azure, t *testing.T) {
		// Legacy batch parts: body-less operations whose headers run into
		// the next boundary, as Azurite's REST replay tests send them.
		st, h, b := a.do("POST", "/Wire", map[string]string{"Prefer": "return-no-content"}, map[string]any{"PartitionKey": "p", "RowKey": "r2"})
		a.want("insert r2", 204, "", st, h, b)
		del := func(rk string) string {
			return "--changeset_L\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n\r\n" +
				"DELETE " + host + "/acct/Wire(PartitionKey='p',RowKey='" + rk + "') HTTP/1.1\r\nAccept: application/json;odata=nometadata\r\nIf-Match: *\r\n"
		}
		body := "--batch_L\r\nContent-Type: multipart/mixed; boundary=changeset_L\r\n\r\n" + del("r") + del("r2") + "\r\n--changeset_L--\r\n--batch_L--\r\n"
		st, h, b = a.do("POST", "/$batch", map[string]string{"Content-Type": "multipart/mixed; boundary=batch_L"}, body)
		a.want("legacy batch of deletes", 202, "", st, h, b)
		if p := batchParts(t, h, b); len(p) != 2 || p[0].StatusCode != 204 || p[1].StatusCode != 204 {
			t.Fatalf("legacy batch of deletes: %s", b)
		}
		st, h, b = a.do("POST", "/Wire", map[string]string{"Prefer": "return-no-content"}, map[string]any{"PartitionKey": "Channel_19", "RowKey": "2"})
		a.want("insert Channel_19", 204, "", st, h, b)
		body = "--batch_Q\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n\r\n" +
			"GET " + host + "/acct/Wire(PartitionKey='Channel_19',RowKey='2')? HTTP/1.1\r\nAccept: application/json;odata=minimalmetadata\r\n--batch_Q--\r\n"
		st, h, b = a.do("POST", "/$batch", map[string]string{"Content-Type": "multipart/mixed; boundary=batch_Q"}, body)
		a.want("legacy query batch", 202, "", st, h, b)
		if p := batchParts(t, h, b); len(p) != 1 || p[0].StatusCode != 200 {
			t.Fatalf("legacy query batch: %s", b)
		}
	})
}

package batch

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"math/rand"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"
)

// clientParts reads a batch response the way aztables v1.4.1 does (see
// the comment in response.go): boundaries from the first line of the
// body and of the first part, then each part with http.ReadResponse.
func clientParts(t *testing.T, body []byte) []*http.Response {
	t.Helper()
	if len(body) == 0 || body[0] == '{' {
		t.Fatalf("body %q is not multipart", body)
	}
	firstLine := func(b []byte) string {
		end := bytes.IndexByte(b, '\n')
		if end < 3 || !bytes.HasPrefix(b, []byte("--")) {
			t.Fatalf("no boundary line at the start of %q", b)
		}
		if b[end-1] == '\r' {
			end--
		}
		return string(b[2:end])
	}
	outer, err := multipart.NewReader(bytes.NewReader(body), firstLine(body)).NextPart()
	if err != nil {
		t.Fatal(err)
	}
	inner, err := io.ReadAll(outer)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("POST", "http://127.0.0.1:10002/devstoreaccount1/$batch", nil)
	var out []*http.Response
	mr := multipart.NewReader(bytes.NewReader(inner), firstLine(inner))
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		raw, err := io.ReadAll(p)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), req)
		if err != nil {
			t.Fatalf("part %q: %v", raw, err)
		}
		out = append(out, resp)
	}
	return out
}

func TestWriteResponseRoundTrip(t *testing.T) {
	bb, cb, err := NewBoundaries(rand.New(rand.NewSource(1)))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(bb, "batchresponse_") || !strings.HasPrefix(cb, "changesetresponse_") || len(bb) != 14+36 {
		t.Fatalf("boundaries %q %q", bb, cb)
	}
	etag := `W/"datetime'2021-06-09T01%3A17%3A13.0459392Z'"`
	results := []Result{
		{Status: 204, Header: http.Header{"Etag": {etag}, "Preference-Applied": {"return-no-content"}}},
		{Status: 201, ContentID: "2", Header: http.Header{"Content-Type": {"application/json;odata=minimalmetadata;streaming=true;charset=utf-8"}}, Body: []byte(`{"PartitionKey":"p","RowKey":"2"}`)},
		{Status: 204},
	}
	var buf bytes.Buffer
	if err := WriteResponse(&buf, bb, cb, results); err != nil {
		t.Fatal(err)
	}
	parts := clientParts(t, buf.Bytes())
	if len(parts) != 3 {
		t.Fatalf("%d parts", len(parts))
	}
	if parts[0].StatusCode != 204 || parts[0].Header.Get("ETag") != etag || parts[0].Header.Get("X-Content-Type-Options") != "nosniff" ||
		parts[0].Header.Get("DataServiceVersion") != "3.0;" || parts[0].Header.Get("Cache-Control") != "no-cache" {
		t.Errorf("part 0: %d %v", parts[0].StatusCode, parts[0].Header)
	}
	b1, _ := io.ReadAll(parts[1].Body)
	if parts[1].StatusCode != 201 || parts[1].Header.Get("Content-ID") != "2" || string(b1) != string(results[1].Body) {
		t.Errorf("part 1: %d %v %q", parts[1].StatusCode, parts[1].Header, b1)
	}
	// The standard library's reader, given the Content-Type, agrees.
	mr := multipart.NewReader(bytes.NewReader(buf.Bytes()), bb)
	if p, err := mr.NextPart(); err != nil || p.Header.Get("Content-Type") != ContentType(cb) {
		t.Fatalf("outer part: %v %v", err, p.Header)
	}
	if _, err := mr.NextPart(); err != io.EOF {
		t.Fatalf("a second outer part: %v", err)
	}
}

// The bytes match the service's answer to three inserts, as recorded by
// the JS SDK's tests against the service.
func TestWriteResponseServiceBytes(t *testing.T) {
	loc := "https://acct.table.core.windows.net/t(PartitionKey='batchTest',RowKey='1')"
	etag := `W/"datetime'2021-06-09T01%3A17%3A13.0459392Z'"`
	var buf bytes.Buffer
	err := WriteResponse(&buf, "batchresponse_a", "changesetresponse_b", []Result{{Status: 204, Header: http.Header{
		"Preference-Applied": {"return-no-content"}, "Location": {loc}, "Dataserviceid": {loc}, "Etag": {etag},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	want := "--batchresponse_a\r\nContent-Type: multipart/mixed; boundary=changesetresponse_b\r\n\r\n" +
		"--changesetresponse_b\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n\r\n" +
		"HTTP/1.1 204 No Content\r\nX-Content-Type-Options: nosniff\r\nCache-Control: no-cache\r\nPreference-Applied: return-no-content\r\n" +
		"DataServiceVersion: 3.0;\r\nLocation: " + loc + "\r\nDataServiceId: " + loc + "\r\nETag: " + etag + "\r\n\r\n\r\n" +
		"--changesetresponse_b--\r\n--batchresponse_a--\r\n"
	if buf.String() != want {
		t.Fatalf("got\n%q\nwant\n%q", buf.String(), want)
	}
}

func TestWriteFailure(t *testing.T) {
	body := `{"odata.error":{"code":"EntityAlreadyExists","message":{"lang":"en-US","value":"The specified entity already exists.\nRequestId:r-1\nTime:2024-01-01T00:00:00.0000000Z"}}}`
	var buf bytes.Buffer
	err := WriteFailure(&buf, "batchresponse_a", "changesetresponse_b", 1, Result{ContentID: "2", Status: 409, Body: []byte(body)})
	if err != nil {
		t.Fatal(err)
	}
	parts := clientParts(t, buf.Bytes())
	if len(parts) != 1 || parts[0].StatusCode != 409 || parts[0].Header.Get("Content-ID") != "2" ||
		!strings.HasPrefix(parts[0].Header.Get("Content-Type"), "application/json;odata=minimalmetadata") {
		t.Fatalf("parts %+v", parts)
	}
	var e odataError
	raw, _ := io.ReadAll(parts[0].Body)
	if err := json.Unmarshal(raw, &e); err != nil {
		t.Fatalf("%q: %v", raw, err)
	}
	if e.Error.Code != "EntityAlreadyExists" || e.Error.Message.Lang != "en-US" ||
		!strings.HasPrefix(e.Error.Message.Value, "1:The specified entity already exists.\nRequestId:r-1") {
		t.Fatalf("error %+v", e)
	}
	if bytes.Contains(raw, []byte(`\u003c`)) || !bytes.HasPrefix(raw, []byte(`{"odata.error":{"code":`)) {
		t.Fatalf("body %q", raw)
	}

	// A query batch fails with its single part, no changeset.
	buf.Reset()
	err = WriteFailure(&buf, "batchresponse_a", "", 0, Result{Status: 404, Body: []byte(`{"odata.error":{"code":"ResourceNotFound","message":{"lang":"en-US","value":"The specified resource does not exist."}}}`)})
	if err != nil {
		t.Fatal(err)
	}
	p, err := multipart.NewReader(&buf, "batchresponse_a").NextPart()
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(p), nil)
	if err != nil || resp.StatusCode != 404 {
		t.Fatalf("query failure: %v %v", err, resp)
	}
}

func TestWriteRefuses(t *testing.T) {
	ok := []Result{{Status: 204}}
	cases := []struct {
		name string
		err  error
	}{
		{"bad batch boundary", WriteResponse(io.Discard, "", "c", ok)},
		{"boundary with CR", WriteResponse(io.Discard, "b\r\nX: y", "c", ok)},
		{"long boundary", WriteResponse(io.Discard, strings.Repeat("b", 71), "c", ok)},
		{"no results", WriteResponse(io.Discard, "b", "c", nil)},
		{"two query results", WriteResponse(io.Discard, "b", "", []Result{{Status: 200}, {Status: 200}})},
		{"body on 204", WriteResponse(io.Discard, "b", "c", []Result{{Status: 204, Body: []byte("x")}})},
		{"header injection", WriteResponse(io.Discard, "b", "c", []Result{{Status: 204, Header: http.Header{"Etag": {"x\r\nEvil: 1"}}}})},
		{"bad header name", WriteResponse(io.Discard, "b", "c", []Result{{Status: 204, Header: http.Header{"A B": {"x"}}}})},
		{"content-id injection", WriteResponse(io.Discard, "b", "c", []Result{{Status: 204, ContentID: "1\r\n"}})},
		{"failure with success status", WriteFailure(io.Discard, "b", "c", 0, Result{Status: 204})},
		{"failure body not odata", WriteFailure(io.Discard, "b", "c", 0, Result{Status: 400, Body: []byte("oops")})},
		{"failure index", WriteFailure(io.Discard, "b", "c", 100, Result{Status: 400, Body: []byte(`{"odata.error":{"code":"X","message":{"value":"m"}}}`)})},
	}
	for _, c := range cases {
		if c.err == nil {
			t.Errorf("%s: accepted", c.name)
		}
	}
}

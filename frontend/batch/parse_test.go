package batch

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

const (
	goBatch = "batch_0b0c81a6-3c4e-4d57-8f5a-6c3a8e1f2b9d"
	goCS    = "changeset_5f1d5b40-3a5e-4f43-9b1e-2c4f7d3e8a10"
)

// goBody builds a body the way aztables v1.4.1 writes one: Go's
// multipart writer (part headers sorted, no preamble), request lines
// with absolute URIs and $format, http.Header's canonical keys written
// sorted, CRLF, then the JSON body.
func goBody(ops []string) string {
	var b strings.Builder
	b.WriteString("--" + goBatch + "\r\nContent-Type: multipart/mixed; boundary=" + goCS + "\r\n\r\n")
	for _, op := range ops {
		b.WriteString("--" + goCS + "\r\nContent-Transfer-Encoding: binary\r\nContent-Type: application/http\r\n\r\n")
		b.WriteString(op)
		b.WriteString("\r\n")
	}
	b.WriteString("--" + goCS + "--\r\n--" + goBatch + "--\r\n")
	return b.String()
}

func goInsert(rk string) string {
	body := fmt.Sprintf(`{"PartitionKey":"p","RowKey":%q,"Value":1}`, rk)
	return "POST http://127.0.0.1:10002/devstoreaccount1/mytable?%24format=application%2Fjson%3Bodata%3Dminimalmetadata HTTP/1.1\r\n" +
		"Accept: application/json;odata=minimalmetadata\r\n" +
		fmt.Sprintf("Content-Length: %d\r\n", len(body)) +
		"Content-Type: application/json\r\n" +
		"Dataserviceversion: 3.0\r\n" +
		"Prefer: return-no-content\r\n" +
		"X-Ms-Version: 2019-02-02\r\n" +
		"\r\n" + body
}

func TestParseGoSDK(t *testing.T) {
	ops := []string{
		goInsert("r0"),
		"DELETE http://127.0.0.1:10002/devstoreaccount1/mytable(PartitionKey='p',RowKey='r1')?%24format=application%2Fjson%3Bodata%3Dminimalmetadata HTTP/1.1\r\n" +
			"Accept: application/json;odata=minimalmetadata\r\nDataserviceversion: 3.0\r\nIf-Match: *\r\nX-Ms-Version: 2019-02-02\r\n\r\n",
		"MERGE http://127.0.0.1:10002/devstoreaccount1/mytable(PartitionKey='p',RowKey='r%27x') HTTP/1.1\r\n" +
			"Content-Type: application/json\r\nDataserviceversion: 3.0\r\nIf-Match: W/\"datetime'2024-01-01T00%3A00%3A00.0000000Z'\"\r\n\r\n{\"PartitionKey\":\"p\",\"RowKey\":\"r'x\"}",
		"PUT http://otherhost:11002/devstoreaccount1/mytable(PartitionKey='p',RowKey='r3') HTTP/1.1\r\n" +
			"Content-Type: application/json\r\n\r\n{\"PartitionKey\":\"p\",\"RowKey\":\"r3\"}",
	}
	b, err := Parse("multipart/mixed; boundary="+goBatch, strings.NewReader(goBody(ops)), 0)
	if err != nil {
		t.Fatal(err)
	}
	if !b.Changeset || len(b.Ops) != 4 {
		t.Fatalf("changeset %t, %d ops", b.Changeset, len(b.Ops))
	}
	want := []struct {
		method, path, ifMatch, body string
	}{
		{"POST", "/devstoreaccount1/mytable", "", `{"PartitionKey":"p","RowKey":"r0","Value":1}`},
		{"DELETE", "/devstoreaccount1/mytable(PartitionKey='p',RowKey='r1')", "*", ""},
		{"MERGE", "/devstoreaccount1/mytable(PartitionKey='p',RowKey='r'x')", `W/"datetime'2024-01-01T00%3A00%3A00.0000000Z'"`, `{"PartitionKey":"p","RowKey":"r'x"}`},
		{"PUT", "/devstoreaccount1/mytable(PartitionKey='p',RowKey='r3')", "", `{"PartitionKey":"p","RowKey":"r3"}`},
	}
	for i, w := range want {
		op := b.Ops[i]
		if op.Index != i || op.Method != w.method || op.URL.Path != w.path || op.Header.Get("If-Match") != w.ifMatch || string(op.Body) != w.body {
			t.Errorf("op %d = %d %s %s if-match %q body %q; want %+v", i, op.Index, op.Method, op.URL.Path, op.Header.Get("If-Match"), op.Body, w)
		}
	}
	if got := b.Ops[0].Header.Get("Prefer"); got != "return-no-content" {
		t.Errorf("Prefer = %q", got)
	}
	if got := b.Ops[0].URL.Query().Get("$format"); got != "application/json;odata=minimalmetadata" {
		t.Errorf("$format = %q", got)
	}
	if b.Ops[3].URL.Host != "otherhost:11002" {
		t.Errorf("host = %q", b.Ops[3].URL.Host)
	}
}

// The JS SDK (@azure/data-tables) as recorded against the service: a
// blank line before the first changeset boundary, lower-case headers and
// a blank line before each body.
func TestParseJSSDK(t *testing.T) {
	body := "--batch_fakeId\r\ncontent-type: multipart/mixed; boundary=changeset_fakeId\r\n\r\n\r\n" +
		"--changeset_fakeId\r\ncontent-type: application/http\r\ncontent-transfer-encoding: binary\r\n\r\n" +
		"POST https://acct.table.core.windows.net/batchTable HTTP/1.1\r\ncontent-type: application/json;odata=nometadata\r\n" +
		"accept: application/json;odata=minimalmetadata\r\ndataserviceversion: 3.0\r\nprefer: return-no-content\r\n\r\n\r\n" +
		"{\"PartitionKey\":\"batchTest\",\"RowKey\":\"1\",\"name\":\"first\"}\r\n" +
		"--changeset_fakeId\r\ncontent-type: application/http\r\ncontent-transfer-encoding: binary\r\n\r\n" +
		"PATCH https://acct.table.core.windows.net/batchTable(PartitionKey='batchTest',RowKey='2') HTTP/1.1\r\ncontent-type: application/json;odata=nometadata\r\n" +
		"if-match: *\r\n\r\n\r\n" +
		"{\"PartitionKey\":\"batchTest\",\"RowKey\":\"2\",\"name\":\"second\"}\r\n" +
		"--changeset_fakeId--\r\n--batch_fakeId--\r\n"
	b, err := Parse("multipart/mixed; boundary=batch_fakeId", strings.NewReader(body), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Ops) != 2 || b.Ops[0].Method != "POST" || b.Ops[1].Method != "PATCH" {
		t.Fatalf("ops %+v", b.Ops)
	}
	if got := string(b.Ops[0].Body); got != `{"PartitionKey":"batchTest","RowKey":"1","name":"first"}` {
		t.Errorf("body %q", got)
	}
	if b.Ops[0].Header.Get("Prefer") != "return-no-content" || b.Ops[1].Header.Get("If-Match") != "*" {
		t.Errorf("headers %v %v", b.Ops[0].Header, b.Ops[1].Header)
	}
}

// The .NET SDKs: the boundary quoted in the Content-Type, Content-ID in
// the MIME part headers (the OData place) or in the request's.
func TestParseDotNetSDK(t *testing.T) {
	body := "--batch_7c2e\r\nContent-Type: multipart/mixed; boundary=changeset_91ab\r\n\r\n" +
		"--changeset_91ab\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary\r\nContent-ID: 1\r\n\r\n" +
		"POST http://127.0.0.1:10002/devstoreaccount1/People HTTP/1.1\r\nAccept: application/json; odata=minimalmetadata\r\n" +
		"Content-Type: application/json; odata=nometadata\r\nPrefer: return-no-content\r\nDataServiceVersion: 3.0;\r\n\r\n" +
		"{\"PartitionKey\":\"Smith\",\"RowKey\":\"Ben\"}\r\n" +
		"--changeset_91ab\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n\r\n" +
		"DELETE http://127.0.0.1:10002/devstoreaccount1/People(PartitionKey='Smith',RowKey='Jeff') HTTP/1.1\r\nContent-ID: 2\r\nIf-Match: *\r\n\r\n" +
		"\r\n--changeset_91ab--\r\n--batch_7c2e--\r\n"
	b, err := Parse(`multipart/mixed; boundary="batch_7c2e"`, strings.NewReader(body), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Ops) != 2 || b.Ops[0].ContentID != "1" || b.Ops[1].ContentID != "2" || b.Ops[1].Body != nil {
		t.Fatalf("ops %+v", b.Ops)
	}
}

// Some SDKs and hand-written scripts end lines with LF alone.
func TestParseLF(t *testing.T) {
	body := strings.ReplaceAll(goBody([]string{goInsert("a"), goInsert("b")}), "\r\n", "\n")
	b, err := Parse("multipart/mixed; boundary="+goBatch, strings.NewReader(body), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Ops) != 2 || string(b.Ops[1].Body) != `{"PartitionKey":"p","RowKey":"b","Value":1}` {
		t.Fatalf("ops %+v", b.Ops)
	}
}

func TestParseQuery(t *testing.T) {
	body := "--batch_q\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n\r\n" +
		"GET http://127.0.0.1:10002/devstoreaccount1/t(PartitionKey='p',RowKey='r') HTTP/1.1\r\nAccept: application/json;odata=nometadata\r\n\r\n" +
		"\r\n--batch_q--\r\n"
	b, err := Parse("multipart/mixed; boundary=batch_q", strings.NewReader(body), 0)
	if err != nil {
		t.Fatal(err)
	}
	if b.Changeset || len(b.Ops) != 1 || b.Ops[0].Method != "GET" {
		t.Fatalf("%+v", b)
	}
}

// Legacy clients end a body-less operation's headers at the next
// boundary, with no blank line: a delete in a changeset (its last CRLF
// is the delimiter's) and a query whose last header has no CRLF at all,
// as in Azurite's REST replay tests. The service takes both.
func TestParseLegacyHeadersWithoutBlankLine(t *testing.T) {
	del := "DELETE http://127.0.0.1:10002/devstoreaccount1/t(PartitionKey='p',RowKey='r1') HTTP/1.1\r\n" +
		"Accept: application/json;odata=nometadata\r\nContent-Type: application/json\r\nIf-Match: *\r\n"
	body := "--batch_L\r\nContent-Type: multipart/mixed; boundary=changeset_L\r\n\r\n" +
		"--changeset_L\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n\r\n" + del +
		"--changeset_L\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n\r\n" +
		strings.Replace(del, "r1", "r2", 1) + "\r\n" +
		"--changeset_L--\r\n--batch_L--\r\n"
	b, err := Parse("multipart/mixed; boundary=batch_L", strings.NewReader(body), 0)
	if err != nil {
		t.Fatalf("changeset of deletes without blank lines: %v", err)
	}
	if len(b.Ops) != 2 || b.Ops[0].Method != "DELETE" || b.Ops[1].URL.Path != "/devstoreaccount1/t(PartitionKey='p',RowKey='r2')" ||
		b.Ops[0].Header.Get("If-Match") != "*" || b.Ops[1].Header.Get("If-Match") != "*" || b.Ops[0].Body != nil || b.Ops[1].Body != nil {
		t.Fatalf("ops %+v", b.Ops)
	}

	query := "--batch_f351702c\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n\r\n" +
		"GET http://127.0.0.1:10002/devstoreaccount1/t(PartitionKey='Channel_19',RowKey='2')? HTTP/1.1\r\n" +
		"Accept: application/json;odata=minimalmetadata\r\n--batch_f351702c--\r\n"
	for _, crlf := range []string{"\r\n", "\n"} {
		b, err = Parse("multipart/mixed; boundary=batch_f351702c", strings.NewReader(strings.ReplaceAll(query, "\r\n", crlf)), 0)
		if err != nil {
			t.Fatalf("query without a blank line: %v", err)
		}
		if b.Changeset || len(b.Ops) != 1 || b.Ops[0].Method != "GET" || b.Ops[0].Header.Get("Accept") != "application/json;odata=minimalmetadata" {
			t.Fatalf("query %+v", b)
		}
	}

	// A body where the blank line should be is still no header.
	_, err = Parse("multipart/mixed; boundary=batch_L", strings.NewReader(strings.Replace(body, "If-Match: *\r\n--changeset_L\r\nContent-Type", "If-Match: *\r\n{\"a\":1}\r\n--changeset_L\r\nContent-Type", 1)), 0)
	var e *Error
	if !errors.As(err, &e) || !strings.Contains(e.Message, "malformed HTTP request") {
		t.Fatalf("body without a blank line before it: %v", err)
	}
}

func opsBody(n int) string {
	ops := make([]string, n)
	for i := range ops {
		ops[i] = goInsert(fmt.Sprint("r", i))
	}
	return goBody(ops)
}

func TestParseOperationLimit(t *testing.T) {
	b, err := Parse("multipart/mixed; boundary="+goBatch, strings.NewReader(opsBody(100)), 0)
	if err != nil || len(b.Ops) != 100 || b.Ops[99].Index != 99 {
		t.Fatalf("100 operations: %v", err)
	}
	_, err = Parse("multipart/mixed; boundary="+goBatch, strings.NewReader(opsBody(101)), 0)
	var e *Error
	if !errors.As(err, &e) || e.Code != "InvalidInput" || e.Status != 400 || !e.Batched || e.Index != 0 ||
		e.Message != "The batch request operation exceeds the maximum 100 changes per change set." {
		t.Fatalf("101 operations: %#v", err)
	}
}

func TestParseSizeLimit(t *testing.T) {
	// A body of exactly MaxBodySize bytes passes; one byte more is 413.
	base := goBody([]string{goInsert("a")})
	pad := MaxBodySize - len(base)
	body := strings.Replace(base, `"Value":1}`, `"Value":1`+strings.Repeat(" ", pad)+"}", 1)
	if len(body) != MaxBodySize {
		t.Fatalf("built %d bytes", len(body))
	}
	if _, err := Parse("multipart/mixed; boundary="+goBatch, strings.NewReader(body), 0); err != nil {
		t.Fatalf("4 MiB: %v", err)
	}
	_, err := Parse("multipart/mixed; boundary="+goBatch, strings.NewReader(body+" "), 0)
	var e *Error
	if !errors.As(err, &e) || e.Code != "RequestBodyTooLarge" || e.Status != http.StatusRequestEntityTooLarge || e.Batched {
		t.Fatalf("4 MiB + 1: %#v", err)
	}
	// An explicit limit applies the same way.
	if _, err := Parse("multipart/mixed; boundary="+goBatch, strings.NewReader(base), int64(len(base))); err != nil {
		t.Fatal(err)
	}
	if _, err := Parse("multipart/mixed; boundary="+goBatch, strings.NewReader(base), int64(len(base)-1)); !errors.As(err, &e) || e.Status != 413 {
		t.Fatalf("limit-1: %v", err)
	}
}

func TestParseRefuses(t *testing.T) {
	get := "GET http://h/devstoreaccount1/t() HTTP/1.1\r\n\r\n"
	part := func(ct, req string) string {
		return "Content-Type: " + ct + "\r\nContent-Transfer-Encoding: binary\r\n\r\n" + req + "\r\n"
	}
	cs := func(name string, reqs ...string) string {
		s := "Content-Type: multipart/mixed; boundary=" + name + "\r\n\r\n"
		for _, r := range reqs {
			s += "--" + name + "\r\n" + part("application/http", r)
		}
		return s + "--" + name + "--\r\n"
	}
	batch := func(parts ...string) string {
		s := ""
		for _, p := range parts {
			s += "--B\r\n" + p
		}
		return s + "--B--\r\n"
	}
	ins := goInsert("x")
	cases := []struct {
		name, ct, body, want string
	}{
		{"not multipart", "application/json", batch(cs("C", ins)), "Content-Type"},
		{"no boundary", "multipart/mixed", batch(cs("C", ins)), "boundary"},
		{"empty", "multipart/mixed; boundary=B", "--B--\r\n", "no operations"},
		{"nothing", "multipart/mixed; boundary=B", "", "no operations"},
		{"empty changeset", "multipart/mixed; boundary=B", batch("Content-Type: multipart/mixed; boundary=C\r\n\r\n--C--\r\n"), "no operations"},
		{"two changesets", "multipart/mixed; boundary=B", batch(cs("C", ins), cs("D", ins)), "more than one changeset"},
		{"query and changeset", "multipart/mixed; boundary=B", batch(part("application/http", get), cs("C", ins)), "only operation"},
		{"two queries", "multipart/mixed; boundary=B", batch(part("application/http", get), part("application/http", get)), "only operation"},
		{"query in changeset", "multipart/mixed; boundary=B", batch(cs("C", ins, get)), "only operation"},
		{"write outside changeset", "multipart/mixed; boundary=B", batch(part("application/http", ins)), "outside a changeset"},
		{"nested changeset", "multipart/mixed; boundary=B", batch("Content-Type: multipart/mixed; boundary=C\r\n\r\n--C\r\n" + cs("D", ins) + "--C--\r\n"), "another multipart"},
		{"part not http", "multipart/mixed; boundary=B", batch("Content-Type: multipart/mixed; boundary=C\r\n\r\n--C\r\n" + part("application/json", "{}") + "--C--\r\n"), "want application/http"},
		{"base64 part", "multipart/mixed; boundary=B", batch("Content-Type: multipart/mixed; boundary=C\r\n\r\n--C\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: base64\r\n\r\nUE9TVA==\r\n--C--\r\n"), "Content-Transfer-Encoding"},
		{"bad request line", "multipart/mixed; boundary=B", batch(cs("C", "POST\r\n\r\n{}")), "malformed HTTP request"},
		{"bad method", "multipart/mixed; boundary=B", batch(cs("C", "CONNECT http://h/a/t HTTP/1.1\r\n\r\n")), "not allowed"},
		{"chunked", "multipart/mixed; boundary=B", batch(cs("C", "POST http://h/a/t HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n")), "Transfer-Encoding"},
		{"truncated", "multipart/mixed; boundary=B", batch(cs("C", ins))[:200], "malformed"},
		{"no final boundary", "multipart/mixed; boundary=B", "--B\r\n" + cs("C", ins), "malformed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(c.ct, strings.NewReader(c.body), 0)
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("err = %v, want *Error", err)
			}
			if e.Code != "InvalidInput" || e.Status != 400 || e.Batched || !strings.Contains(e.Message, c.want) {
				t.Fatalf("err = %#v, want InvalidInput mentioning %q", e, c.want)
			}
		})
	}
}

type failReader struct{}

func (failReader) Read([]byte) (int, error) { return 0, errors.New("connection reset") }

func TestParseReadError(t *testing.T) {
	_, err := Parse("multipart/mixed; boundary=B", failReader{}, 0)
	var e *Error
	if err == nil || errors.As(err, &e) || !strings.Contains(err.Error(), "connection reset") {
		t.Fatalf("err = %v", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(goBody([]string{goInsert("a"), goInsert("b")})))
	f.Add([]byte(strings.ReplaceAll(goBody([]string{goInsert("a")}), "\r\n", "\n")))
	f.Add([]byte("--" + goBatch + "\r\nContent-Type: application/http\r\n\r\nGET http://h/a/t() HTTP/1.1\r\n\r\n\r\n--" + goBatch + "--\r\n"))
	f.Add([]byte(opsBody(3)[:300]))
	f.Add([]byte("--" + goBatch + "\r\nContent-Type: application/http\r\n\r\nGET http://h/a/t(PartitionKey='p',RowKey='r') HTTP/1.1\r\nAccept: */*\r\n--" + goBatch + "--\r\n"))
	f.Add([]byte{})
	const limit = 64 << 10
	f.Fuzz(func(t *testing.T, body []byte) {
		b, err := Parse("multipart/mixed; boundary="+goBatch, bytes.NewReader(body), limit)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Code == "" || e.Status == 0 || e.Message == "" {
				t.Fatalf("error %#v is not a service error", err)
			}
			if len(body) > limit && e.Status != 413 {
				t.Fatalf("%d bytes over the limit: %v", len(body), err)
			}
			return
		}
		if len(body) > limit {
			t.Fatalf("accepted %d bytes over the limit", len(body))
		}
		if len(b.Ops) == 0 || len(b.Ops) > MaxOperations || (!b.Changeset && len(b.Ops) != 1) {
			t.Fatalf("%d ops, changeset %t", len(b.Ops), b.Changeset)
		}
		total := 0
		for i, op := range b.Ops {
			total += len(op.Body)
			if op.Index != i || op.URL == nil || !methods[op.Method] || (b.Changeset == (op.Method == "GET")) {
				t.Fatalf("op %d: %+v", i, op)
			}
		}
		if total > len(body) {
			t.Fatalf("bodies %d bytes from %d", total, len(body))
		}
	})
}

package batch

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// What a client needs from a batch response. aztables v1.4.1
// (transactional_batch.go, buildTransactionResponse) reads it like this,
// and the byte layout below, copied from the service's own answers,
// satisfies it:
//   - A body whose first byte is '{' is taken as a JSON error for the
//     whole batch; anything else must be multipart.
//   - The batch boundary is taken from the body's first line (bytes 2 up
//     to the line end), not from the Content-Type header, so the body
//     must start with "--" and the boundary, with no preamble; a leading
//     blank line makes it slice out of range.
//   - The first part's body is read whole and its boundary taken the same
//     way, so it too must start at once with "--" and the changeset
//     boundary.
//   - Each changeset part is read with http.ReadResponse: a status line,
//     headers, a blank line, the body (read to the part's end; no
//     Content-Length needed). A status >= 400 makes the transaction fail
//     with that part's odata.error body.
//   - It stores the parts in a slice as long as the operations sent, so
//     there must never be more parts than operations: a failure is one
//     part.
//   - The batch's own status must be 202 (or 204).
//
// The service's layout, CRLF throughout:
//
//	--batchresponse_B
//	Content-Type: multipart/mixed; boundary=changesetresponse_C
//
//	--changesetresponse_C
//	Content-Type: application/http
//	Content-Transfer-Encoding: binary
//
//	HTTP/1.1 204 No Content
//	X-Content-Type-Options: nosniff
//	Cache-Control: no-cache
//	Preference-Applied: return-no-content
//	DataServiceVersion: 3.0;
//	Location: http://127.0.0.1:10002/devstoreaccount1/t(PartitionKey='p',RowKey='1')
//	DataServiceId: http://127.0.0.1:10002/devstoreaccount1/t(PartitionKey='p',RowKey='1')
//	ETag: W/"datetime'2021-06-09T01%3A17%3A13.0459392Z'"
//
//
//	--changesetresponse_C--
//	--batchresponse_B--

// Result is the outcome of one operation, as the operation would have
// answered alone.
type Result struct {
	ContentID string      // echoed as a Content-ID header when not ""
	Status    int         // e.g. 204, 201, 404
	Header    http.Header // ETag, Location, Preference-Applied, Content-Type...
	Body      []byte      // empty for 204
}

// ContentType is the Content-Type of a batch response with this
// boundary.
func ContentType(boundary string) string {
	return "multipart/mixed; boundary=" + boundary
}

// NewBoundaries returns a batch and a changeset response boundary in the
// service's form (batchresponse_<uuid>, changesetresponse_<uuid>), the
// uuids read from rand (crypto/rand.Reader in production).
func NewBoundaries(rand io.Reader) (batchBoundary, changesetBoundary string, err error) {
	var b [32]byte
	if _, err := io.ReadFull(rand, b[:]); err != nil {
		return "", "", fmt.Errorf("batch: boundaries: %w", err)
	}
	return "batchresponse_" + uuid(b[:16]), "changesetresponse_" + uuid(b[16:]), nil
}

func uuid(b []byte) string {
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	const hex = "0123456789abcdef"
	out := make([]byte, 0, 36)
	for i, c := range b {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			out = append(out, '-')
		}
		out = append(out, hex[c>>4], hex[c&15])
	}
	return string(out)
}

// WriteResponse writes the answer to a batch that succeeded: for a
// changeset, one changeset response (boundary changesetBoundary) with a
// part per result, in order; for a lone query (Batch.Changeset false),
// changesetBoundary is "" and results holds its one result, written as
// the batch's only part. Headers the service always sends
// (X-Content-Type-Options, DataServiceVersion, and Cache-Control on
// success) are added unless results carry them.
func WriteResponse(w io.Writer, batchBoundary, changesetBoundary string, results []Result) error {
	if err := checkBoundary(batchBoundary); err != nil {
		return err
	}
	var buf bytes.Buffer
	if changesetBoundary == "" {
		if len(results) != 1 {
			return fmt.Errorf("batch: a query batch answers with 1 result, not %d", len(results))
		}
		fmt.Fprintf(&buf, "--%s\r\n", batchBoundary)
		if err := writePart(&buf, results[0]); err != nil {
			return err
		}
		fmt.Fprintf(&buf, "\r\n--%s--\r\n", batchBoundary)
		_, err := w.Write(buf.Bytes())
		return err
	}
	if err := checkBoundary(changesetBoundary); err != nil {
		return err
	}
	if len(results) == 0 || len(results) > MaxOperations {
		return fmt.Errorf("batch: %d results; a changeset has 1 to %d", len(results), MaxOperations)
	}
	fmt.Fprintf(&buf, "--%s\r\nContent-Type: %s\r\n\r\n", batchBoundary, ContentType(changesetBoundary))
	for _, r := range results {
		fmt.Fprintf(&buf, "--%s\r\n", changesetBoundary)
		if err := writePart(&buf, r); err != nil {
			return err
		}
		buf.WriteString("\r\n")
	}
	fmt.Fprintf(&buf, "--%s--\r\n--%s--\r\n", changesetBoundary, batchBoundary)
	_, err := w.Write(buf.Bytes())
	return err
}

// WriteFailure writes the answer to a transaction that failed at
// operation index (0-based): one changeset response with a single part
// carrying res. res.Body is the odata.error JSON the operation would
// have answered alone ({"odata.error":{"code":..,"message":{"lang":..,
// "value":..}}}); WriteFailure prefixes the message value with
// "index:" as the service does ("1:The specified entity already
// exists."). res.Status must be an error status (>= 400). For a failed
// query batch pass changesetBoundary "".
func WriteFailure(w io.Writer, batchBoundary, changesetBoundary string, index int, res Result) error {
	if res.Status < 400 || res.Status > 599 {
		return fmt.Errorf("batch: failure status %d is not an error status", res.Status)
	}
	if index < 0 || index >= MaxOperations {
		return fmt.Errorf("batch: failure index %d out of range", index)
	}
	body, err := prefixMessage(res.Body, index)
	if err != nil {
		return err
	}
	res.Body = body
	h := res.Header.Clone()
	if h == nil {
		h = http.Header{}
	}
	if h.Get("Content-Type") == "" {
		h.Set("Content-Type", "application/json;odata=minimalmetadata;streaming=true;charset=utf-8")
	}
	res.Header = h
	return WriteResponse(w, batchBoundary, changesetBoundary, []Result{res})
}

type odataError struct {
	Error struct {
		Code    string `json:"code"`
		Message struct {
			Lang  string `json:"lang"`
			Value string `json:"value"`
		} `json:"message"`
	} `json:"odata.error"`
}

func prefixMessage(body []byte, index int) ([]byte, error) {
	var e odataError
	if err := json.Unmarshal(body, &e); err != nil || e.Error.Code == "" {
		return nil, fmt.Errorf("batch: failure body is not an odata.error: %q", body)
	}
	prefix := strconv.Itoa(index) + ":"
	if !strings.HasPrefix(e.Error.Message.Value, prefix) {
		e.Error.Message.Value = prefix + e.Error.Message.Value
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(&e); err != nil {
		return nil, fmt.Errorf("batch: failure body: %w", err)
	}
	return bytes.TrimSuffix(out.Bytes(), []byte("\n")), nil
}

// headerOrder is the order the service writes an operation's headers
// in; others follow, sorted.
var headerOrder = []string{
	"X-Content-Type-Options", "Cache-Control", "Preference-Applied", "Dataserviceversion",
	"Content-Type", "Location", "Dataserviceid", "Etag",
}

// writePart writes one application/http part without the delimiter's
// CRLF that follows it.
func writePart(buf *bytes.Buffer, r Result) error {
	if r.Status < 100 || r.Status > 599 {
		return fmt.Errorf("batch: status %d", r.Status)
	}
	if len(r.Body) > 0 && (r.Status == http.StatusNoContent || r.Status == http.StatusNotModified || r.Status < 200) {
		return fmt.Errorf("batch: a %d response has no body", r.Status)
	}
	if !validValue(r.ContentID) {
		return fmt.Errorf("batch: Content-ID %q", r.ContentID)
	}
	h := r.Header.Clone()
	if h == nil {
		h = http.Header{}
	}
	h.Del("Content-ID")
	h.Del("Content-Length")
	if h.Get("X-Content-Type-Options") == "" {
		h.Set("X-Content-Type-Options", "nosniff")
	}
	if r.Status < 400 && h.Get("Cache-Control") == "" {
		h.Set("Cache-Control", "no-cache")
	}
	if h.Get("DataServiceVersion") == "" {
		h.Set("DataServiceVersion", "3.0;")
	}
	buf.WriteString("Content-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n\r\n")
	text := http.StatusText(r.Status)
	if text == "" {
		text = "Status " + strconv.Itoa(r.Status)
	}
	fmt.Fprintf(buf, "HTTP/1.1 %d %s\r\n", r.Status, text)
	if r.ContentID != "" {
		fmt.Fprintf(buf, "Content-ID: %s\r\n", r.ContentID)
	}
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		ia, ib := rank(a), rank(b)
		if ia != ib {
			return ia - ib
		}
		return strings.Compare(a, b)
	})
	for _, k := range keys {
		if !validName(k) {
			return fmt.Errorf("batch: header name %q", k)
		}
		for _, v := range h[k] {
			if !validValue(v) {
				return fmt.Errorf("batch: header %s value %q", k, v)
			}
			fmt.Fprintf(buf, "%s: %s\r\n", wireName(k), v)
		}
	}
	buf.WriteString("\r\n")
	buf.Write(r.Body)
	return nil
}

func rank(canonical string) int {
	if i := slices.Index(headerOrder, canonical); i >= 0 {
		return i
	}
	return len(headerOrder)
}

// wireName spells the headers the service spells unusually as it does.
func wireName(canonical string) string {
	switch canonical {
	case "Dataserviceversion":
		return "DataServiceVersion"
	case "Dataserviceid":
		return "DataServiceId"
	case "Etag":
		return "ETag"
	}
	return canonical
}

func validName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

func validValue(s string) bool {
	return !strings.ContainsAny(s, "\r\n\x00")
}

// checkBoundary applies RFC 2046's rules: 1 to 70 characters from its
// set, not ending in a space.
func checkBoundary(b string) error {
	if len(b) < 1 || len(b) > 70 || b[len(b)-1] == ' ' {
		return fmt.Errorf("batch: invalid boundary %q", b)
	}
	for _, c := range []byte(b) {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("'()+_,-./:=? ", c) >= 0:
		default:
			return errors.New("batch: invalid boundary " + strconv.Quote(b))
		}
	}
	return nil
}

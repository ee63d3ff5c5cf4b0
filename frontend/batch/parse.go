package batch

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"
)

// The service's limits on one entity group transaction.
const (
	MaxOperations = 100     // operations in a changeset
	MaxBodySize   = 4 << 20 // bytes of the whole $batch body (4 MiB)
)

// Batch is a parsed $batch request body.
type Batch struct {
	// Ops are the operations in the order they were sent. A changeset
	// holds 1 to MaxOperations of them; a query batch exactly one GET.
	Ops []Op
	// Changeset is true when Ops came in a changeset, false for a lone
	// query. It decides the shape of the answer (WriteResponse).
	Changeset bool
}

// Op is one operation of a batch: a full HTTP request as the client
// wrote it.
type Op struct {
	Index     int    // 0-based position in the batch
	ContentID string // the Content-ID header (of the request, else of its MIME part); "" if none
	Method    string // as sent: POST, PUT, MERGE, PATCH, DELETE or GET; X-HTTP-Method is left to the gateway
	// URL is the request target, usually absolute. Route by URL.Path
	// (the account is its first segment); ignore the host, which may
	// name another host:port than the $batch request's.
	URL    *url.URL
	Header http.Header // canonical keys; Host is in URL.Host
	// Body is the request body with surrounding blank lines trimmed
	// (the JS SDK puts an empty line before it). The MIME part's end
	// delimits it; a Content-Length header is not consulted.
	Body []byte
}

// Parse reads a $batch request body. contentType is the request's
// Content-Type header (multipart/mixed with a boundary). limit caps the
// body's size in bytes; limit <= 0 means MaxBodySize. Parse reads at most
// limit+1 bytes from body.
//
// A batch the service refuses is an *Error (use errors.As); an error
// reading body is returned wrapped as it is.
func Parse(contentType string, body io.Reader, limit int64) (*Batch, error) {
	if limit <= 0 {
		limit = MaxBodySize
	}
	boundary, err := boundaryOf(contentType)
	if err != nil {
		return nil, invalid("the batch request's Content-Type: %v", err)
	}
	data, err := io.ReadAll(io.LimitReader(body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("batch: read body: %w", err)
	}
	if int64(len(data)) > limit {
		return nil, &Error{Code: CodeRequestBodyTooLarge, Status: http.StatusRequestEntityTooLarge, Message: msgBodyTooLarge}
	}

	mr := multipart.NewReader(bytes.NewReader(data), boundary)
	part, err := mr.NextRawPart()
	if errors.Is(err, io.EOF) {
		return nil, invalid("the batch holds no operations")
	}
	if err != nil {
		return nil, invalid("malformed batch body: %v", err)
	}
	mt, params, err := mime.ParseMediaType(part.Header.Get("Content-Type"))
	if err != nil {
		return nil, invalid("batch part: bad Content-Type %q: %v", part.Header.Get("Content-Type"), err)
	}
	content, err := io.ReadAll(part)
	if err != nil {
		return nil, invalid("malformed batch body: %v", err)
	}
	var b *Batch
	switch mt {
	case "multipart/mixed":
		cs := params["boundary"]
		if cs == "" {
			return nil, invalid("changeset: Content-Type has no boundary")
		}
		ops, err := parseChangeset(content, cs)
		if err != nil {
			return nil, err
		}
		b = &Batch{Ops: ops, Changeset: true}
	case "application/http":
		op, err := parseOp(0, part.Header, content)
		if err != nil {
			return nil, err
		}
		if op.Method != http.MethodGet {
			return nil, invalid("operation 0: %s outside a changeset; only a query (GET) may stand alone", op.Method)
		}
		b = &Batch{Ops: []Op{op}}
	default:
		return nil, invalid("batch part: Content-Type %q, want multipart/mixed (a changeset) or application/http (a query)", mt)
	}

	next, err := mr.NextRawPart()
	switch {
	case err == nil:
		nt, _, _ := mime.ParseMediaType(next.Header.Get("Content-Type"))
		if b.Changeset && nt == "multipart/mixed" {
			return nil, invalid("the batch holds more than one changeset; the service supports only one")
		}
		return nil, invalid("a query must be the only operation in its batch")
	case errors.Is(err, io.EOF):
		return b, nil
	default:
		return nil, invalid("malformed batch body: %v", err)
	}
}

func boundaryOf(contentType string) (string, error) {
	mt, params, err := mime.ParseMediaType(contentType)
	if err != nil {
		return "", err
	}
	if mt != "multipart/mixed" {
		return "", fmt.Errorf("%q, want multipart/mixed", mt)
	}
	b := params["boundary"]
	if b == "" {
		return "", errors.New("no boundary")
	}
	return b, nil
}

func parseChangeset(content []byte, boundary string) ([]Op, error) {
	mr := multipart.NewReader(bytes.NewReader(content), boundary)
	var ops []Op
	for {
		part, err := mr.NextRawPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, invalid("malformed changeset: %v", err)
		}
		if len(ops) == MaxOperations {
			// The service answers this one inside a 202 batch response,
			// blaming operation 0.
			return nil, &Error{Code: CodeInvalidInput, Status: http.StatusBadRequest, Message: msgTooManyOps, Batched: true}
		}
		mt, _, err := mime.ParseMediaType(part.Header.Get("Content-Type"))
		if err != nil {
			return nil, invalid("operation %d: bad Content-Type %q: %v", len(ops), part.Header.Get("Content-Type"), err)
		}
		if strings.HasPrefix(mt, "multipart/") {
			return nil, invalid("operation %d: a changeset cannot hold another multipart part", len(ops))
		}
		raw, err := io.ReadAll(part)
		if err != nil {
			return nil, invalid("malformed changeset: %v", err)
		}
		op, err := parseOp(len(ops), part.Header, raw)
		if err != nil {
			return nil, err
		}
		if op.Method == http.MethodGet {
			return nil, invalid("operation %d: a query must be the only operation in its batch, outside a changeset", op.Index)
		}
		ops = append(ops, op)
	}
	if len(ops) == 0 {
		return nil, invalid("the changeset holds no operations")
	}
	return ops, nil
}

var methods = map[string]bool{
	http.MethodGet: true, http.MethodPost: true, http.MethodPut: true,
	http.MethodPatch: true, http.MethodDelete: true, "MERGE": true,
}

// parseOp reads one application/http part: a request line, headers, a
// blank line and the body.
func parseOp(index int, partHeader textproto.MIMEHeader, raw []byte) (Op, error) {
	if mt, _, err := mime.ParseMediaType(partHeader.Get("Content-Type")); err != nil || mt != "application/http" {
		return Op{}, invalid("operation %d: part Content-Type %q, want application/http", index, partHeader.Get("Content-Type"))
	}
	switch cte := strings.ToLower(strings.TrimSpace(partHeader.Get("Content-Transfer-Encoding"))); cte {
	case "", "binary", "8bit", "7bit":
	default:
		return Op{}, invalid("operation %d: Content-Transfer-Encoding %q, want binary", index, cte)
	}
	br := bufio.NewReader(bytes.NewReader(endHead(bytes.TrimLeft(raw, "\r\n"))))
	req, err := http.ReadRequest(br)
	if err != nil {
		return Op{}, invalid("operation %d: malformed HTTP request: %v", index, err)
	}
	if !methods[req.Method] {
		return Op{}, invalid("operation %d: method %q is not allowed in a batch", index, req.Method)
	}
	if len(req.TransferEncoding) > 0 {
		return Op{}, invalid("operation %d: Transfer-Encoding is not allowed in a batch operation", index)
	}
	if req.URL == nil || req.URL.Path == "" {
		return Op{}, invalid("operation %d: request target has no path", index)
	}
	rest, _ := io.ReadAll(br) // a bytes.Reader underneath: no error
	op := Op{
		Index:     index,
		ContentID: req.Header.Get("Content-ID"),
		Method:    req.Method,
		URL:       req.URL,
		Header:    req.Header,
		Body:      bytes.TrimSpace(rest),
	}
	if op.ContentID == "" {
		op.ContentID = partHeader.Get("Content-ID")
	}
	if len(op.Body) == 0 {
		op.Body = nil
	}
	return op, nil
}

// endHead ends the header section of a request that has none ending it:
// a body-less GET or DELETE whose last header runs into the next
// boundary without a blank line (captured from legacy clients, in
// Azurite's REST replay tests; the service accepts it). A request whose
// headers end, with or without a body, is returned as it is.
func endHead(req []byte) []byte {
	if bytes.Contains(req, []byte("\n\n")) || bytes.Contains(req, []byte("\n\r\n")) {
		return req
	}
	req = bytes.TrimRight(req, "\r\n")
	return append(req[:len(req):len(req)], "\r\n\r\n"...)
}

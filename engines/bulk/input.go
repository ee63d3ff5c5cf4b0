package bulk

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Format is an input file format. Every format holds one record per line
// (csv: per CSV record); blank lines are skipped; lines end in "\n" or
// "\r\n"; the last line may lack its newline.
//
//   - FormatTSV: "key<TAB>value". The key is everything before the first
//     tab, the value everything after it (tabs included). In a delta build
//     a line with no tab, "key", deletes key.
//   - FormatCSV: RFC 4180 records (encoding/csv; quotes allow commas and
//     newlines in fields) of two fields, key,value. In a delta build a
//     record of one field deletes that key. No header line.
//   - FormatJSONL: one JSON object per line, {"key": "...", "value": "..."};
//     in a delta build {"key": "...", "delete": true} deletes key. Other
//     fields are an error.
//
// Without Base64, keys and values are the bytes of the text (JSON strings:
// their UTF-8). With Base64 they are standard base64 (RFC 4648, padded), so
// any bytes fit. Keys are 1..api.MaxKeyBytes bytes.
type Format int

// The formats.
const (
	FormatTSV Format = iota
	FormatCSV
	FormatJSONL
)

// ParseFormat reads "tsv", "csv" or "jsonl".
func ParseFormat(s string) (Format, error) {
	switch strings.ToLower(s) {
	case "tsv":
		return FormatTSV, nil
	case "csv":
		return FormatCSV, nil
	case "jsonl":
		return FormatJSONL, nil
	}
	return 0, fmt.Errorf("bulk: unknown input format %q (want tsv, csv or jsonl)", s)
}

func (f Format) String() string {
	switch f {
	case FormatTSV:
		return "tsv"
	case FormatCSV:
		return "csv"
	case FormatJSONL:
		return "jsonl"
	}
	return fmt.Sprintf("Format(%d)", int(f))
}

// MalformedError is a line of input that does not parse.
type MalformedError struct {
	Pos    Position
	Reason string
}

func (e *MalformedError) Error() string { return fmt.Sprintf("bulk: %s: %s", e.Pos, e.Reason) }

// parser reads records from one input.
type parser struct {
	name   string
	format Format
	b64    bool
	delta  bool

	br   *bufio.Reader
	cr   *csv.Reader
	line int64
	kbuf []byte
	vbuf []byte
}

func newParser(name string, r io.Reader, format Format, b64, delta bool) *parser {
	p := &parser{name: name, format: format, b64: b64, delta: delta}
	if format == FormatCSV {
		p.cr = csv.NewReader(bufio.NewReaderSize(r, 1<<20))
		p.cr.FieldsPerRecord = -1
		p.cr.ReuseRecord = true
	} else {
		p.br = bufio.NewReaderSize(r, 1<<20)
	}
	return p
}

func (p *parser) bad(format string, args ...any) error {
	return &MalformedError{Pos: Position{p.name, p.line}, Reason: fmt.Sprintf(format, args...)}
}

// next returns the next record (aliasing the parser's buffers until the
// next call), or io.EOF.
func (p *parser) next() (rec Record, pos Position, n int, err error) {
	if p.format == FormatCSV {
		return p.nextCSV()
	}
	for {
		line, err := p.br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// A line longer than the buffer: gather it.
			long := append([]byte(nil), line...)
			for errors.Is(err, bufio.ErrBufferFull) {
				line, err = p.br.ReadSlice('\n')
				long = append(long, line...)
			}
			line = long
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return rec, pos, 0, fmt.Errorf("bulk: read %s: %w", p.name, err)
		}
		if len(line) == 0 && errors.Is(err, io.EOF) {
			return rec, pos, 0, io.EOF
		}
		p.line++
		n = len(line)
		line = bytes.TrimSuffix(line, []byte("\n"))
		line = bytes.TrimSuffix(line, []byte("\r"))
		if len(line) == 0 {
			if errors.Is(err, io.EOF) {
				return rec, pos, 0, io.EOF
			}
			continue
		}
		pos = Position{p.name, p.line}
		if p.format == FormatTSV {
			rec, err = p.tsv(line)
		} else {
			rec, err = p.jsonl(line)
		}
		return rec, pos, n, err
	}
}

func (p *parser) field(dst []byte, what string, s []byte) ([]byte, error) {
	if !p.b64 {
		return append(dst[:0], s...), nil
	}
	dst = dst[:0]
	if need := base64.StdEncoding.DecodedLen(len(s)); cap(dst) < need {
		dst = make([]byte, 0, need)
	}
	n, err := base64.StdEncoding.Decode(dst[:cap(dst)], s)
	if err != nil {
		return dst, p.bad("%s is not valid base64: %v", what, err)
	}
	return dst[:n], nil
}

func (p *parser) tsv(line []byte) (Record, error) {
	var err error
	k, v, ok := bytes.Cut(line, []byte("\t"))
	if !ok {
		if !p.delta {
			return Record{}, p.bad("no tab: want key<TAB>value (a line with a key alone deletes it, in delta builds only)")
		}
		if p.kbuf, err = p.field(p.kbuf, "key", k); err != nil {
			return Record{}, err
		}
		return Record{Key: p.kbuf, Delete: true}, nil
	}
	if p.kbuf, err = p.field(p.kbuf, "key", k); err != nil {
		return Record{}, err
	}
	if p.vbuf, err = p.field(p.vbuf, "value", v); err != nil {
		return Record{}, err
	}
	return Record{Key: p.kbuf, Value: p.vbuf}, nil
}

type jsonLine struct {
	Key    *string `json:"key"`
	Value  *string `json:"value"`
	Delete bool    `json:"delete"`
}

func (p *parser) jsonl(line []byte) (Record, error) {
	var j jsonLine
	d := json.NewDecoder(bytes.NewReader(line))
	d.DisallowUnknownFields()
	if err := d.Decode(&j); err != nil {
		return Record{}, p.bad("not a JSON object of key and value: %v", err)
	}
	if d.More() {
		return Record{}, p.bad("more than one JSON value on the line")
	}
	var err error
	switch {
	case j.Key == nil:
		return Record{}, p.bad(`no "key"`)
	case j.Delete && !p.delta:
		return Record{}, p.bad(`"delete" in a full (not delta) build`)
	case j.Delete && j.Value != nil:
		return Record{}, p.bad(`"delete" with a "value"`)
	case !j.Delete && j.Value == nil:
		return Record{}, p.bad(`no "value"`)
	}
	if p.kbuf, err = p.field(p.kbuf, "key", []byte(*j.Key)); err != nil {
		return Record{}, err
	}
	if j.Delete {
		return Record{Key: p.kbuf, Delete: true}, nil
	}
	if p.vbuf, err = p.field(p.vbuf, "value", []byte(*j.Value)); err != nil {
		return Record{}, err
	}
	return Record{Key: p.kbuf, Value: p.vbuf}, nil
}

func (p *parser) nextCSV() (Record, Position, int, error) {
	fields, err := p.cr.Read()
	if errors.Is(err, io.EOF) {
		return Record{}, Position{}, 0, io.EOF
	}
	line, _ := p.cr.FieldPos(0)
	p.line = int64(line)
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		p.line = int64(pe.Line)
		return Record{}, Position{}, 0, p.bad("csv: %v", pe.Err)
	}
	if err != nil {
		return Record{}, Position{}, 0, fmt.Errorf("bulk: read %s: %w", p.name, err)
	}
	pos := Position{p.name, p.line}
	n := 2
	for _, f := range fields {
		n += len(f) + 1
	}
	switch {
	case len(fields) == 1 && p.delta:
		if p.kbuf, err = p.field(p.kbuf, "key", []byte(fields[0])); err != nil {
			return Record{}, pos, n, err
		}
		return Record{Key: p.kbuf, Delete: true}, pos, n, nil
	case len(fields) != 2:
		return Record{}, pos, n, p.bad("%d fields, want 2 (key,value)", len(fields))
	}
	if p.kbuf, err = p.field(p.kbuf, "key", []byte(fields[0])); err != nil {
		return Record{}, pos, n, err
	}
	if p.vbuf, err = p.field(p.vbuf, "value", []byte(fields[1])); err != nil {
		return Record{}, pos, n, err
	}
	return Record{Key: p.kbuf, Value: p.vbuf}, pos, n, nil
}

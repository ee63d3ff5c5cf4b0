package bulk

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
)

// Format is an input file format. The text formats hold one record per
// line (csv: per CSV record); blank lines are skipped; lines end in "\n" or
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
//     fields are an error. BuildOptions.KeyColumn and ValueColumn rename
//     "key" and "value" (a renamed field matches its name exactly; the
//     default names match in any case, as encoding/json's do).
//   - FormatParquet (read by package engines/bulk/parquetinput, which a
//     program reading Parquet imports): a Parquet file, one record per row,
//     its key and value in the top-level columns named by
//     BuildOptions.KeyColumn and ValueColumn ("key" and "value" by
//     default); other columns are not read. A column is BYTE_ARRAY (plain,
//     STRING, ENUM, JSON or BSON: its bytes), FIXED_LEN_BYTE_ARRAY (plain
//     or UUID: its bytes) or INT32/INT64 (plain or an INT logical type: its
//     decimal text, unsigned for UINT types); any other type, a repeated
//     column or a group is refused naming the column and its type. A null
//     key is an error; a null value deletes the key in a delta build and is
//     an error in a full one. Errors name the row: row 1 is the file's
//     first (across row groups).
//
// Without Base64, keys and values are the bytes of the text (JSON strings:
// their UTF-8; Parquet: as above). With Base64 they are standard base64
// (RFC 4648, padded), so any bytes fit; in Parquet only BYTE_ARRAY columns
// are decoded. Keys are 1..api.MaxKeyBytes bytes.
type Format int

// The formats. Never reorder: BuildOptions carries them by value.
const (
	FormatTSV Format = iota
	FormatCSV
	FormatJSONL
	FormatParquet
)

// ParseFormat reads "tsv", "csv", "jsonl" or "parquet".
func ParseFormat(s string) (Format, error) {
	switch strings.ToLower(s) {
	case "tsv":
		return FormatTSV, nil
	case "csv":
		return FormatCSV, nil
	case "jsonl":
		return FormatJSONL, nil
	case "parquet":
		return FormatParquet, nil
	}
	return 0, fmt.Errorf("bulk: unknown input format %q (want tsv, csv, jsonl or parquet)", s)
}

func (f Format) String() string {
	switch f {
	case FormatTSV:
		return "tsv"
	case FormatCSV:
		return "csv"
	case FormatJSONL:
		return "jsonl"
	case FormatParquet:
		return "parquet"
	}
	return fmt.Sprintf("Format(%d)", int(f))
}

// MalformedError is a record of input that does not parse: a line of a
// text format, a row of a Parquet file, or (Pos.Row with Pos.Line 0) a
// Parquet file as a whole (not Parquet, no such column, a column of
// another type).
type MalformedError struct {
	Pos    Position
	Reason string
	// Err is the error underneath, if any (the Parquet reader's).
	Err error
}

func (e *MalformedError) Error() string { return fmt.Sprintf("bulk: %s: %s", e.Pos, e.Reason) }

func (e *MalformedError) Unwrap() error { return e.Err }

// The default field (jsonl) and column (parquet) names of key and value.
const (
	DefaultKeyColumn   = "key"
	DefaultValueColumn = "value"
)

// InputOptions say how an input is read: BuildOptions.InputOptions.
type InputOptions struct {
	Format Format
	Base64 bool
	// Delta: the input may hold deletions (a delta build).
	Delta bool
	// KeyColumn and ValueColumn as in BuildOptions ("": the defaults).
	KeyColumn, ValueColumn string
}

// InputOptions returns how BuildTable reads o's inputs.
func (o BuildOptions) InputOptions() InputOptions {
	return InputOptions{Format: o.Format, Base64: o.Base64, Delta: o.DeltaOf != 0, KeyColumn: o.KeyColumn, ValueColumn: o.ValueColumn}
}

// InputFile is an input being read (a vfs.File is one).
type InputFile interface {
	io.Reader
	io.ReaderAt
	Size() (int64, error)
}

// RecordReader reads the records of one input, in order. It is not safe
// for concurrent use.
type RecordReader interface {
	// Next returns the next record (aliasing the reader's buffers until
	// the next call), where it came from and about how many bytes of
	// input it took, or io.EOF after the last. Input that does not parse
	// is a *MalformedError. A reader may not check a key's or a value's
	// length (BuildTable does).
	Next() (rec Record, pos Position, n int, err error)
}

// OpenInputFunc returns the reader of input name, read from f.
type OpenInputFunc func(name string, f InputFile, o InputOptions) (RecordReader, error)

// registered holds the readers of the formats registered by other
// packages (FormatParquet: package parquetinput).
var registered struct {
	mu   sync.Mutex
	open map[Format]OpenInputFunc // guarded by mu
}

// RegisterFormat makes OpenInput (and so BuildTable) read inputs of format
// with open. Package engines/bulk/parquetinput registers FormatParquet
// when imported, so that the Parquet library is linked only into the
// programs that read Parquet. The text formats cannot be replaced. Safe
// for concurrent use; normally called from init.
func RegisterFormat(format Format, open OpenInputFunc) {
	if format <= FormatJSONL || open == nil {
		panic(fmt.Sprintf("bulk: RegisterFormat(%s): only other formats, with a reader", format))
	}
	registered.mu.Lock()
	defer registered.mu.Unlock()
	if registered.open == nil {
		registered.open = map[Format]OpenInputFunc{}
	}
	registered.open[format] = open
}

// registeredFormat returns format's registered reader, or nil.
func registeredFormat(format Format) OpenInputFunc {
	registered.mu.Lock()
	defer registered.mu.Unlock()
	return registered.open[format]
}

// ErrFormatNotLinked is returned (wrapped) for an input format whose
// reader is not linked into the program.
var ErrFormatNotLinked = errors.New("bulk: input format not linked into this program")

// OpenInput returns the reader of input name, read from f: the reader
// BuildTable uses, for a builder of its own (a batch pipeline) that must
// read inputs as BuildTable does. FormatParquet needs package
// engines/bulk/parquetinput imported (else ErrFormatNotLinked).
func OpenInput(name string, f InputFile, o InputOptions) (RecordReader, error) {
	switch o.Format {
	case FormatTSV, FormatCSV, FormatJSONL:
		return newParser(name, f, o), nil
	}
	open := registeredFormat(o.Format)
	if open == nil {
		return nil, fmt.Errorf("bulk: read %s as %s: %w (import github.com/tabuladb/tabula/engines/bulk/parquetinput)", name, o.Format, ErrFormatNotLinked)
	}
	return open(name, f, o)
}

// parser reads records from one input of a text format.
type parser struct {
	name   string
	format Format
	b64    bool
	delta  bool
	// keyCol and valCol rename the jsonl fields; both "" for the defaults
	// (decoded into a jsonLine).
	keyCol, valCol string

	br   *bufio.Reader
	cr   *csv.Reader
	line int64
	kbuf []byte
	vbuf []byte
}

func newParser(name string, r io.Reader, o InputOptions) *parser {
	p := &parser{name: name, format: o.Format, b64: o.Base64, delta: o.Delta}
	if (o.KeyColumn != "" && o.KeyColumn != DefaultKeyColumn) || (o.ValueColumn != "" && o.ValueColumn != DefaultValueColumn) {
		p.keyCol, p.valCol = cmp.Or(o.KeyColumn, DefaultKeyColumn), cmp.Or(o.ValueColumn, DefaultValueColumn)
	}
	if o.Format == FormatCSV {
		p.cr = csv.NewReader(bufio.NewReaderSize(r, 1<<20))
		p.cr.FieldsPerRecord = -1
		p.cr.ReuseRecord = true
	} else {
		p.br = bufio.NewReaderSize(r, 1<<20)
	}
	return p
}

func (p *parser) bad(format string, args ...any) error {
	return &MalformedError{Pos: Position{File: p.name, Line: p.line}, Reason: fmt.Sprintf(format, args...)}
}

// Next implements RecordReader.
func (p *parser) Next() (rec Record, pos Position, n int, err error) {
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
		pos = Position{File: p.name, Line: p.line}
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
	keyCol, valCol := DefaultKeyColumn, DefaultValueColumn
	if p.keyCol == "" {
		d.DisallowUnknownFields()
		if err := d.Decode(&j); err != nil {
			return Record{}, p.bad("not a JSON object of key and value: %v", err)
		}
	} else {
		keyCol, valCol = p.keyCol, p.valCol
		var err error
		if j, err = p.renamedJSON(d); err != nil {
			return Record{}, err
		}
	}
	if d.More() {
		return Record{}, p.bad("more than one JSON value on the line")
	}
	var err error
	switch {
	case j.Key == nil:
		return Record{}, p.bad("no %q", keyCol)
	case j.Delete && !p.delta:
		return Record{}, p.bad(`"delete" in a full (not delta) build`)
	case j.Delete && j.Value != nil:
		return Record{}, p.bad(`"delete" with a %q`, valCol)
	case !j.Delete && j.Value == nil:
		return Record{}, p.bad("no %q", valCol)
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

// renamedJSON decodes a JSON object whose key and value fields are named
// p.keyCol and p.valCol (matched exactly; "delete" as always); other
// fields are an error. A field given twice: the last counts, as in
// encoding/json.
func (p *parser) renamedJSON(d *json.Decoder) (jsonLine, error) {
	var j jsonLine
	var m map[string]json.RawMessage
	if err := d.Decode(&m); err != nil {
		return j, p.bad("not a JSON object of %q and %q: %v", p.keyCol, p.valCol, err)
	}
	if m == nil {
		return j, p.bad("not a JSON object of %q and %q: null", p.keyCol, p.valCol)
	}
	names := make([]string, 0, len(m))
	for name := range m {
		names = append(names, name)
	}
	slices.Sort(names) // the first unknown field reported does not depend on map order
	for _, name := range names {
		raw := m[name]
		var dst any
		switch name {
		case p.keyCol:
			dst = &j.Key
		case p.valCol:
			dst = &j.Value
		case "delete":
			dst = &j.Delete
		default:
			return j, p.bad("unknown field %q (want %q, %q or \"delete\")", name, p.keyCol, p.valCol)
		}
		if err := json.Unmarshal(raw, dst); err != nil {
			return j, p.bad("field %q: %v", name, err)
		}
	}
	return j, nil
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
	pos := Position{File: p.name, Line: p.line}
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

package parquetinput

import (
	"cmp"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/deprecated"
	"github.com/parquet-go/parquet-go/format"

	"github.com/tabuladb/tabula/engines/bulk"
)

func init() { bulk.RegisterFormat(bulk.FormatParquet, Open) }

// Open returns the reader of the Parquet file name, read from f, as
// bulk.FormatParquet describes: the bulk.OpenInputFunc this package
// registers. Errors in the file are *bulk.MalformedError (the file as a
// whole: Pos.Row with Pos.Line 0); o.Format is not looked at.
func Open(name string, f bulk.InputFile, o bulk.InputOptions) (bulk.RecordReader, error) {
	size, err := f.Size()
	if err != nil {
		return nil, fmt.Errorf("parquetinput: size of input %s: %w", name, err)
	}
	r, err := NewReader(name, f, size, o)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// parquetBatch is how many values of a column are decoded at once.
const parquetBatch = 256

// Reader reads the records of a Parquet file (bulk.FormatParquet): one per
// row, its key and value from two top-level columns read page by page side
// by side; the other columns are not read. It implements bulk.RecordReader
// and is not safe for concurrent use.
//
// The library (github.com/parquet-go/parquet-go, see RATIONALE.md) decodes
// bytes nobody checked: a panic in it is recovered and reported as a
// *bulk.MalformedError, like any other undecodable input.
type Reader struct {
	name       string
	b64, delta bool
	rows       int64 // the file's rows
	row        int64 // rows returned
	key, val   parquetColumn
	kbuf, vbuf []byte
	done       bool
}

// parquetKind is how a column's values become bytes.
type parquetKind int

const (
	parquetBytes    parquetKind = iota // BYTE_ARRAY: the bytes (base64 when asked)
	parquetFixed                       // FIXED_LEN_BYTE_ARRAY: the bytes
	parquetSigned                      // INT32/INT64: decimal text
	parquetUnsigned                    // INT32/INT64 of a UINT type: decimal text
)

// parquetColumn reads one column's values across pages and row groups.
type parquetColumn struct {
	what   string // "key column \"k\""
	kind   parquetKind
	int32  bool // parquetSigned/Unsigned: INT32, not INT64
	pages  parquet.Pages
	page   parquet.Page // being read; nil before the first and after the last
	values parquet.ValueReader
	buf    []parquet.Value
	i, n   int // buf[i:n] are not returned yet
}

// NewReader returns the reader of the Parquet file name of size bytes,
// read from r; see Open.
func NewReader(name string, r io.ReaderAt, size int64, o bulk.InputOptions) (pr *Reader, err error) {
	fileErr := func(inner error, format string, args ...any) error {
		return &bulk.MalformedError{Pos: bulk.Position{File: name, Row: true}, Reason: fmt.Sprintf(format, args...), Err: inner}
	}
	defer func() {
		if v := recover(); v != nil {
			pr, err = nil, fileErr(nil, "parquet reader panicked opening the file: %v", v)
		}
	}()
	// The footer's length is checked here: the library allocates what
	// the file claims before reading it.
	if size < 12 {
		return nil, fileErr(nil, "not a parquet file: %d bytes", size)
	}
	var tail [8]byte
	if _, err := r.ReadAt(tail[:], size-8); err != nil {
		return nil, fmt.Errorf("parquetinput: read %s: %w", name, err)
	}
	if string(tail[4:]) != "PAR1" {
		return nil, fileErr(nil, "not a parquet file (no PAR1 at its end; an encrypted file is not read)")
	}
	if footer := int64(tail[0]) | int64(tail[1])<<8 | int64(tail[2])<<16 | int64(tail[3])<<24; footer > size-12 {
		return nil, fileErr(nil, "parquet footer of %d bytes in a file of %d", footer, size)
	}
	f, err := parquet.OpenFile(r, size, parquet.SkipPageIndex(true), parquet.SkipBloomFilters(true), parquet.ReadBufferSize(1<<20))
	if err != nil {
		return nil, fileErr(err, "not a parquet file: %v", err)
	}
	pr = &Reader{name: name, b64: o.Base64, delta: o.Delta, rows: f.NumRows()}
	if pr.rows < 0 {
		return nil, fileErr(nil, "parquet file of %d rows", pr.rows)
	}
	keyName, valName := cmp.Or(o.KeyColumn, bulk.DefaultKeyColumn), cmp.Or(o.ValueColumn, bulk.DefaultValueColumn)
	for _, c := range []struct {
		dst        *parquetColumn
		role, name string
	}{{&pr.key, "key", keyName}, {&pr.val, "value", valName}} {
		col := f.Root().Column(c.name)
		if col == nil {
			var names []string
			for _, ch := range f.Root().Columns() {
				names = append(names, strconv.Quote(ch.Name()))
			}
			return nil, fileErr(nil, "no %s column %q; the file's columns: %s", c.role, c.name, strings.Join(names, ", "))
		}
		what := fmt.Sprintf("%s column %q", c.role, c.name)
		kind, is32, err := parquetColumnKind(col)
		if err != nil {
			return nil, fileErr(nil, "%s: %v", what, err)
		}
		*c.dst = parquetColumn{what: what, kind: kind, int32: is32, pages: col.Pages(), buf: make([]parquet.Value, parquetBatch)}
	}
	return pr, nil
}

// parquetColumnKind says how col's values become bytes, or why they
// cannot.
func parquetColumnKind(col *parquet.Column) (parquetKind, bool, error) {
	const want = "want BYTE_ARRAY (plain, STRING, ENUM, JSON or BSON), FIXED_LEN_BYTE_ARRAY (plain or UUID) or INT32/INT64 (plain, INT or UINT)"
	switch {
	case !col.Leaf():
		return 0, false, fmt.Errorf("a group (nested columns), %s", want)
	case col.Repeated():
		return 0, false, fmt.Errorf("repeated (a list of values per row), %s", want)
	}
	t := col.Type()
	var logical format.LogicalTypeValue
	if lt := t.LogicalType(); lt != nil {
		logical = lt.Value
	}
	var conv *deprecated.ConvertedType
	if ct := t.ConvertedType(); ct != nil {
		conv = ct
	}
	convIs := func(cts ...deprecated.ConvertedType) bool {
		for _, ct := range cts {
			if *conv == ct {
				return true
			}
		}
		return false
	}
	refuse := func() (parquetKind, bool, error) {
		return 0, false, fmt.Errorf("of type %s, %s", parquetTypeName(t), want)
	}
	switch t.Kind() {
	case parquet.ByteArray:
		switch logical.(type) {
		case nil, *format.StringType, *format.EnumType, *format.JsonType, *format.BsonType:
		default:
			return refuse()
		}
		if conv != nil && !convIs(deprecated.UTF8, deprecated.Enum, deprecated.Json, deprecated.Bson) {
			return refuse()
		}
		return parquetBytes, false, nil
	case parquet.FixedLenByteArray:
		switch logical.(type) {
		case nil, *format.UUIDType:
		default:
			return refuse()
		}
		if conv != nil {
			return refuse()
		}
		return parquetFixed, false, nil
	case parquet.Int32, parquet.Int64:
		unsigned := false
		switch lt := logical.(type) {
		case nil:
		case *format.IntType:
			unsigned = !lt.IsSigned
		default:
			return refuse()
		}
		if conv != nil {
			switch {
			case convIs(deprecated.Uint8, deprecated.Uint16, deprecated.Uint32, deprecated.Uint64):
				unsigned = true
			case !convIs(deprecated.Int8, deprecated.Int16, deprecated.Int32, deprecated.Int64):
				return refuse()
			}
		}
		kind := parquetSigned
		if unsigned {
			kind = parquetUnsigned
		}
		return kind, t.Kind() == parquet.Int32, nil
	}
	return refuse()
}

// parquetTypeName names t as the Parquet docs do: the physical type, and
// the logical (or converted) one if any.
func parquetTypeName(t parquet.Type) string {
	name := t.Kind().String()
	if lt := t.LogicalType(); lt != nil && lt.Value != nil {
		return name + " (" + lt.String() + ")"
	}
	if ct := t.ConvertedType(); ct != nil {
		if int(*ct) >= 0 && int(*ct) < len(convertedNames) {
			return name + " (" + convertedNames[*ct] + ")"
		}
		return fmt.Sprintf("%s (converted type %d)", name, int(*ct))
	}
	return name
}

// convertedNames are the names of the converted types, by value.
var convertedNames = []string{"UTF8", "MAP", "MAP_KEY_VALUE", "LIST", "ENUM", "DECIMAL", "DATE",
	"TIME_MILLIS", "TIME_MICROS", "TIMESTAMP_MILLIS", "TIMESTAMP_MICROS",
	"UINT_8", "UINT_16", "UINT_32", "UINT_64", "INT_8", "INT_16", "INT_32", "INT_64",
	"JSON", "BSON", "INTERVAL"}

func (p *Reader) bad(inner error, format string, args ...any) error {
	return &bulk.MalformedError{Pos: bulk.Position{File: p.name, Line: p.row, Row: true}, Reason: fmt.Sprintf(format, args...), Err: inner}
}

// Next implements bulk.RecordReader.
func (p *Reader) Next() (rec bulk.Record, pos bulk.Position, n int, err error) {
	if p.done {
		return rec, pos, 0, io.EOF
	}
	defer func() {
		if v := recover(); v != nil {
			p.done = true
			rec, n, err = bulk.Record{}, 0, p.bad(nil, "parquet reader panicked: %v", v)
		}
	}()
	k, kerr := p.key.next()
	v, verr := p.val.next()
	p.row++
	pos = bulk.Position{File: p.name, Line: p.row, Row: true}
	switch {
	case errors.Is(kerr, io.EOF) && errors.Is(verr, io.EOF):
		p.done = true
		p.row--
		if p.row != p.rows {
			return rec, pos, 0, p.bad(nil, "the columns end after %d rows, the file says %d", p.row, p.rows)
		}
		return rec, pos, 0, io.EOF
	case errors.Is(kerr, io.EOF) || errors.Is(verr, io.EOF):
		p.done = true
		return rec, pos, 0, p.bad(nil, "the key and value columns hold different numbers of rows")
	case kerr != nil:
		p.done = true
		return rec, pos, 0, p.bad(kerr, "read %s: %v", p.key.what, kerr)
	case verr != nil:
		p.done = true
		return rec, pos, 0, p.bad(verr, "read %s: %v", p.val.what, verr)
	case p.row > p.rows:
		p.done = true
		return rec, pos, 0, p.bad(nil, "more rows than the file's %d", p.rows)
	case k.IsNull():
		return rec, pos, 0, p.bad(nil, "%s is null", p.key.what)
	case v.IsNull() && !p.delta:
		return rec, pos, 0, p.bad(nil, "%s is null (a null value deletes the key, in delta builds only)", p.val.what)
	}
	if p.kbuf, err = p.field(p.kbuf, &p.key, k); err != nil {
		return rec, pos, 0, err
	}
	if v.IsNull() {
		return bulk.Record{Key: p.kbuf, Delete: true}, pos, len(p.kbuf), nil
	}
	if p.vbuf, err = p.field(p.vbuf, &p.val, v); err != nil {
		return rec, pos, 0, err
	}
	return bulk.Record{Key: p.kbuf, Value: p.vbuf}, pos, len(p.kbuf) + len(p.vbuf), nil
}

// field appends the bytes of c's value v to dst[:0].
func (p *Reader) field(dst []byte, c *parquetColumn, v parquet.Value) ([]byte, error) {
	dst = dst[:0]
	switch c.kind {
	case parquetBytes:
		b := v.ByteArray()
		if !p.b64 {
			return append(dst, b...), nil
		}
		if need := base64.StdEncoding.DecodedLen(len(b)); cap(dst) < need {
			dst = make([]byte, 0, need)
		}
		n, err := base64.StdEncoding.Decode(dst[:cap(dst)], b)
		if err != nil {
			return dst, p.bad(err, "%s is not valid base64: %v", c.what, err)
		}
		return dst[:n], nil
	case parquetFixed:
		return append(dst, v.ByteArray()...), nil
	case parquetSigned:
		if c.int32 {
			return strconv.AppendInt(dst, int64(v.Int32()), 10), nil
		}
		return strconv.AppendInt(dst, v.Int64(), 10), nil
	default:
		if c.int32 {
			return strconv.AppendUint(dst, uint64(uint32(v.Int32())), 10), nil
		}
		return strconv.AppendUint(dst, uint64(v.Int64()), 10), nil
	}
}

// next returns the column's next value (valid until the next call), or
// io.EOF after the last.
func (c *parquetColumn) next() (parquet.Value, error) {
	for empty := 0; c.i == c.n; {
		if c.values == nil {
			page, err := c.pages.ReadPage()
			if err != nil {
				return parquet.Value{}, err
			}
			c.page, c.values = page, page.Values()
		}
		n, err := c.values.ReadValues(c.buf)
		c.i, c.n = 0, n
		switch {
		case n > 0:
		case errors.Is(err, io.EOF):
			// Every value of the page was returned (and copied).
			parquet.Release(c.page)
			c.page, c.values = nil, nil
		case err != nil:
			return parquet.Value{}, err
		default:
			if empty++; empty > 100 {
				return parquet.Value{}, errors.New("the page reader returns no values and no error")
			}
		}
	}
	v := c.buf[c.i]
	c.i++
	return v, nil
}

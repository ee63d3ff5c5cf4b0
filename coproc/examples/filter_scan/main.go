//go:build wasip1

// Command filter_scan is a coprocessor that filters and projects the
// records of a key range. Records are text "field=value,field=value".
//
// Call "filter" as a range call (or on every partition); the input is
// lines of clauses:
//
//	where <field><op><value>   op: = != < <= > >=; numbers compare as numbers
//	select <field>,<field>     fields to keep (default: all)
//	limit <n>                  at most n records per partition (default: all)
//
// Every where clause must hold. It emits one line per match:
// "<key>\t<projected record>\n". It has no merge export, so a scatter-gather
// call's result is the partitions' outputs concatenated.
package main

import (
	"errors"
	"strconv"
	"strings"

	"github.com/tabuladb/tabula/coproc/guest"
)

type clause struct {
	field, op, value string
}

var ops = []string{"<=", ">=", "!=", "=", "<", ">"}

//go:wasmexport filter
func filter(n int32) int32 { return guest.Serve(n, filterHandler) }

var errLimit = errors.New("limit reached")

func filterHandler(c *guest.Call) error {
	var (
		where  []clause
		fields []string
		limit  = -1
	)
	for _, line := range strings.Split(string(c.Input()), "\n") {
		line = strings.TrimSpace(line)
		verb, arg, _ := strings.Cut(line, " ")
		switch verb {
		case "":
		case "where":
			cl, ok := parseClause(arg)
			if !ok {
				return guest.Failf(3, "filter_scan: bad clause %q", arg)
			}
			where = append(where, cl)
		case "select":
			fields = strings.Split(arg, ",")
		case "limit":
			n, err := strconv.Atoi(arg)
			if err != nil || n < 0 {
				return guest.Failf(3, "filter_scan: bad limit %q", arg)
			}
			limit = n
		default:
			return guest.Failf(3, "filter_scan: unknown verb %q", verb)
		}
	}
	start, end, err := c.Range()
	if err != nil {
		return err
	}
	var out []byte
	matched := 0
	err = c.Scan(start, end, func(key, value []byte) error {
		if limit >= 0 && matched >= limit {
			return errLimit
		}
		rec := parse(string(value))
		for _, cl := range where {
			if !cl.holds(rec) {
				return nil
			}
		}
		matched++
		out = append(out, key...)
		out = append(out, '\t')
		out = append(out, project(rec, fields)...)
		out = append(out, '\n')
		return nil
	})
	if err != nil && err != errLimit {
		return err
	}
	return c.Emit(out)
}

func parseClause(s string) (clause, bool) {
	for _, op := range ops {
		if i := strings.Index(s, op); i > 0 {
			return clause{strings.TrimSpace(s[:i]), op, strings.TrimSpace(s[i+len(op):])}, true
		}
	}
	return clause{}, false
}

type field struct{ name, value string }

func parse(s string) []field {
	var rec []field
	for _, kv := range strings.Split(s, ",") {
		k, v, _ := strings.Cut(kv, "=")
		rec = append(rec, field{k, v})
	}
	return rec
}

func lookup(rec []field, name string) (string, bool) {
	for _, f := range rec {
		if f.name == name {
			return f.value, true
		}
	}
	return "", false
}

func (cl clause) holds(rec []field) bool {
	v, ok := lookup(rec, cl.field)
	if !ok {
		return false
	}
	var cmp int
	a, errA := strconv.ParseFloat(v, 64)
	b, errB := strconv.ParseFloat(cl.value, 64)
	switch {
	case errA == nil && errB == nil:
		cmp = compare(a < b, a > b)
	default:
		cmp = strings.Compare(v, cl.value)
	}
	switch cl.op {
	case "=":
		return cmp == 0
	case "!=":
		return cmp != 0
	case "<":
		return cmp < 0
	case "<=":
		return cmp <= 0
	case ">":
		return cmp > 0
	default:
		return cmp >= 0
	}
}

func compare(less, greater bool) int {
	switch {
	case less:
		return -1
	case greater:
		return 1
	}
	return 0
}

func project(rec []field, fields []string) string {
	if fields == nil {
		parts := make([]string, len(rec))
		for i, f := range rec {
			parts[i] = f.name + "=" + f.value
		}
		return strings.Join(parts, ",")
	}
	var parts []string
	for _, name := range fields {
		if v, ok := lookup(rec, name); ok {
			parts = append(parts, name+"="+v)
		}
	}
	return strings.Join(parts, ",")
}

func main() {}

package odata

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxPageSize is the most entities one page of a query returns.
const MaxPageSize = 1000

// ValidName says whether name is a valid property name: C# identifier
// rules (a letter or underscore, then letters, decimal digits and
// underscores), at most 255 characters. Names are case-sensitive. The
// $filter keywords (and, or, not, eq, ne, gt, ge, lt, le, true, false,
// null, INF, NaN) are valid names but cannot be used in a $filter.
func ValidName(name string) bool {
	if name == "" || utf8.RuneCountInString(name) > maxNameLen {
		return false
	}
	for i, r := range name {
		if r == utf8.RuneError {
			return false
		}
		if i == 0 && !identStart(r) || !identPart(r) {
			return false
		}
	}
	return true
}

// ParseSelect parses a $select: property names separated by commas,
// blanks around each trimmed. It returns nil for "*" (or any item "*"),
// and for the empty text: every property. Duplicates are dropped, the
// first occurrence kept. Errors are *SyntaxError wrapping
// ErrInvalidSelect.
func ParseSelect(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var names []string
	seen := make(map[string]bool)
	off := 0
	for _, item := range strings.Split(s, ",") {
		name := strings.TrimSpace(item)
		at := off + strings.Index(item, name)
		off += len(item) + 1
		switch {
		case name == "*":
			return nil, nil
		case name == "":
			return nil, &SyntaxError{Option: "$select", Offset: at, Msg: "empty property name"}
		case !ValidName(name):
			return nil, &SyntaxError{Option: "$select", Offset: at, Msg: fmt.Sprintf("%q is not a property name (letters, digits and _, not starting with a digit, at most %d characters)", name, maxNameLen)}
		case seen[name]:
			continue
		}
		seen[name] = true
		names = append(names, name)
	}
	return names, nil
}

// ParseTop parses a $top: a decimal integer from 1 to MaxPageSize, the
// most entities per page. Above MaxPageSize is an error, as the service
// answers 400 there (Learn: "Query operators supported for the Table
// service", Take); Azurite accepts it. Errors are *SyntaxError wrapping
// ErrInvalidTop.
func ParseTop(s string) (int, error) {
	t := strings.TrimSpace(s)
	at := strings.Index(s, t)
	if t == "" {
		return 0, &SyntaxError{Option: "$top", Offset: at, Msg: "empty value: want a number from 1 to 1000"}
	}
	n := 0
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !isDigit(c) {
			return 0, &SyntaxError{Option: "$top", Offset: at + i, Msg: fmt.Sprintf("%q is not a positive integer", t)}
		}
		if n <= MaxPageSize {
			n = n*10 + int(c-'0')
		}
	}
	switch {
	case n == 0:
		return 0, &SyntaxError{Option: "$top", Offset: at, Msg: "must be at least 1"}
	case n > MaxPageSize:
		return 0, &SyntaxError{Option: "$top", Offset: at, Msg: fmt.Sprintf("%s is more than %d, the most entities a page holds", t, MaxPageSize)}
	}
	return n, nil
}

package odata

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestValidName(t *testing.T) {
	good := []string{"a", "A", "_", "_1", "Name", "name_2", "Größe", "名前", "PartitionKey", "and", strings.Repeat("x", 255)}
	bad := []string{"", "1a", "a-b", "a b", "a.b", "a/b", "$a", "a\x00", "\xff", strings.Repeat("x", 256)}
	for _, n := range good {
		if !ValidName(n) {
			t.Errorf("ValidName(%q) = false", n)
		}
	}
	for _, n := range bad {
		if ValidName(n) {
			t.Errorf("ValidName(%q) = true", n)
		}
	}
}

func TestParseSelect(t *testing.T) {
	cases := []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"  ", nil},
		{"*", nil},
		{"Name,*", nil},
		{" * ", nil},
		{"Name", []string{"Name"}},
		{"Name,Age", []string{"Name", "Age"}},
		{" Name , Age ", []string{"Name", "Age"}},
		{"Name,Age,Name", []string{"Name", "Age"}},
		{"PartitionKey,RowKey,Timestamp", []string{"PartitionKey", "RowKey", "Timestamp"}},
	}
	for _, c := range cases {
		got, err := ParseSelect(c.in)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("ParseSelect(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	bad := []struct {
		in, want string
		off      int
	}{
		{"Name,", "empty property name", 5},
		{",Name", "empty property name", 0},
		{"a,,b", "empty property name", 2},
		{"Name, 1st", `"1st" is not a property name`, 6},
		{"a-b", `"a-b" is not a property name`, 0},
		{"a b", `"a b" is not a property name`, 0},
		{"x," + strings.Repeat("y", 256), "is not a property name", 2},
	}
	for _, c := range bad {
		_, err := ParseSelect(c.in)
		var se *SyntaxError
		if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, ErrInvalidSelect) ||
			!errors.As(err, &se) || se.Offset != c.off || errors.Is(err, ErrInvalidFilter) {
			t.Errorf("ParseSelect(%q) error %v, want %q at offset %d wrapping ErrInvalidSelect", c.in, err, c.want, c.off)
		}
	}
}

func TestParseTop(t *testing.T) {
	cases := []struct {
		in   string
		want int
	}{
		{"1", 1}, {"5", 5}, {" 20 ", 20}, {"007", 7}, {"999", 999}, {"1000", 1000}, {"0001000", 1000},
	}
	for _, c := range cases {
		got, err := ParseTop(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseTop(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	// Above the page limit the service answers 400 (Take > 1,000).
	for _, in := range []string{"", " ", "0", "000", "-1", "+1", "1.5", "abc", "1e3", "1 2",
		"1001", "5000", "99999999999999999999999999"} {
		_, err := ParseTop(in)
		if err == nil || !errors.Is(err, ErrInvalidTop) || !strings.HasPrefix(err.Error(), "$top: ") {
			t.Errorf("ParseTop(%q) error %v, want ErrInvalidTop", in, err)
		}
	}
}

package api

import (
	"regexp"
	"testing"
)

var nameRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]*$`)

// validName is the byte-loop form of nameRE.
func FuzzValidName(f *testing.F) {
	for _, s := range []string{"", "a", "A1_-", "1a", "_a", "-", "a b", "ä", "tenant-01", "x\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := validName(s), nameRE.MatchString(s); got != want {
			t.Fatalf("validName(%q) = %v, the pattern says %v", s, got, want)
		}
	})
}

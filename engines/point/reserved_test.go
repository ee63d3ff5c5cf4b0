package point

import (
	"testing"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/engines"
)

// TestReservedKeysSurviveReopen: the count of reserved keys is rebuilt when
// an SSD engine reopens, from its index blocks (closed cleanly) and from
// its log.
func TestReservedKeysSurviveReopen(t *testing.T) {
	dir := t.TempDir()
	open := func() engines.Engine {
		t.Helper()
		e, err := engines.Open(engines.KindPoint, engines.Options{Dir: dir, Storage: StorageSSD})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	e := open()
	w := e.(engines.Writer)
	var batch []engines.Mutation
	for i := range 50 {
		batch = append(batch, engines.Mutation{Key: []byte{'k', byte(i)}, Value: []byte("v")})
	}
	for i := range 7 {
		batch = append(batch, engines.Mutation{Key: append([]byte(api.ReservedKeyPrefix+"req/"), byte(i)), Value: []byte("r")})
	}
	if err := w.Apply(batch); err != nil {
		t.Fatal(err)
	}
	check := func(what string, e engines.Engine) {
		t.Helper()
		if s := e.Stats(); s.Keys != 57 || s.ReservedKeys != 7 {
			t.Fatalf("%s: %d keys, %d reserved; want 57 and 7", what, s.Keys, s.ReservedKeys)
		}
	}
	check("written", e)
	for round := range 2 {
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		e = open()
		check([]string{"reopened", "reopened again"}[round], e)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
}

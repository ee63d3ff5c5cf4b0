package entity

import (
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/tabuladb/tabula/frontend/edm"
)

// seeded is a random source whose seed the test prints, so a failure
// can be rerun: go test -run X -args ... (set seed in the code).
func seeded(t testing.TB) *rand.Rand {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// sameEntity reports how a and b differ (exactly: types, bits of
// doubles, order of properties), or "" when they do not.
func sameEntity(a, b *edm.Entity, withTimestamp bool) string {
	if a.PartitionKey != b.PartitionKey || a.RowKey != b.RowKey {
		return fmt.Sprintf("keys (%q,%q) vs (%q,%q)", a.PartitionKey, a.RowKey, b.PartitionKey, b.RowKey)
	}
	if withTimestamp && !a.Timestamp.Equal(b.Timestamp) {
		return fmt.Sprintf("timestamp %v vs %v", a.Timestamp, b.Timestamp)
	}
	if len(a.Props) != len(b.Props) {
		return fmt.Sprintf("%d props vs %d", len(a.Props), len(b.Props))
	}
	for i := range a.Props {
		pa, pb := a.Props[i], b.Props[i]
		if pa.Name != pb.Name || pa.Value.GoString() != pb.Value.GoString() {
			return fmt.Sprintf("prop %d: %q=%#v vs %q=%#v", i, pa.Name, pa.Value, pb.Name, pb.Value)
		}
	}
	return ""
}

// wantCode checks err is an *Error with the code.
func wantCode(t *testing.T, what string, err error, code string) {
	t.Helper()
	var e *Error
	switch {
	case code == "" && err != nil:
		t.Errorf("%s: unexpected error %v", what, err)
	case code == "":
	case !errors.As(err, &e):
		t.Errorf("%s: error %v, want code %s", what, err, code)
	case e.Code != code:
		t.Errorf("%s: code %s (%v), want %s", what, e.Code, err, code)
	}
}

const alphabet = "aZ_09 é€😀'\"\\/\x00\x01\x7f"

func randString(r *rand.Rand, max int) string {
	runes := []rune(alphabet)
	n := r.IntN(max + 1)
	var b strings.Builder
	for i := 0; i < n; i++ {
		b.WriteRune(runes[r.IntN(len(runes))])
	}
	return b.String()
}

func randValue(r *rand.Rand) edm.Value {
	switch edm.Type(1 + r.IntN(8)) {
	case edm.String:
		return edm.Str(randString(r, 20))
	case edm.Int32:
		return edm.I32(int32(r.Uint32()))
	case edm.Int64:
		return edm.I64(int64(r.Uint64()))
	case edm.Double:
		switch r.IntN(6) {
		case 0:
			return edm.F64(math.NaN())
		case 1:
			return edm.F64(math.Inf(1 - 2*r.IntN(2)))
		case 2:
			return edm.F64(float64(r.IntN(1000) - 500)) // integral
		case 3:
			return edm.F64(math.Float64frombits(r.Uint64())) // anything, maybe NaN payloads
		}
		return edm.F64(r.NormFloat64() * math.Pow(10, float64(r.IntN(40)-20)))
	case edm.Boolean:
		return edm.Bool(r.IntN(2) == 1)
	case edm.DateTime:
		return edm.Time(time.Unix(0, r.Int64N(1<<62)-1<<61))
	case edm.Guid:
		var g [16]byte
		for i := range g {
			g[i] = byte(r.Uint32())
		}
		return edm.GUID(g)
	}
	b := make([]byte, r.IntN(20))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return edm.Bin(b)
}

func randEntity(r *rand.Rand) *edm.Entity {
	e := &edm.Entity{
		PartitionKey: randString(r, 8),
		RowKey:       randString(r, 8),
		Timestamp:    time.Unix(0, r.Int64N(1<<62)).UTC().Truncate(edm.Ticks),
	}
	n := r.IntN(12)
	for i := 0; i < n; i++ {
		e.Props = append(e.Props, edm.Property{Name: fmt.Sprintf("P%d_%d", i, r.IntN(100)), Value: randValue(r)})
	}
	return e
}

func errorsIs(err, target error) bool { return errors.Is(fmt.Errorf("wrapped: %w", err), target) }
func errorsAs(err error, target any) bool {
	return errors.As(fmt.Errorf("wrapped: %w", err), target)
}

func crc32Checksum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

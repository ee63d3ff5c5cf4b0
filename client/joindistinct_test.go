package client

import (
	"errors"
	"strings"
	"testing"

	"github.com/tabuladb/tabula/api"
)

// A coprocessor error from every partition reads as one error with a
// count; different errors each appear once, and stay reachable.
func TestJoinDistinct(t *testing.T) {
	trap := func() error {
		return api.Errorf(api.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, "trap", "coprocessor m trapped: unreachable")
	}
	errs := []error{trap(), trap(), trap()}
	err := joinDistinct(errs)
	if n := strings.Count(err.Error(), "trapped"); n != 1 {
		t.Fatalf("%q mentions the trap %d times, want once", err, n)
	}
	if !strings.Contains(err.Error(), "the same on 2 more partitions") {
		t.Fatalf("%q does not count the other partitions", err)
	}
	if api.DetailOf(err).GetReason() != "trap" {
		t.Fatalf("detail lost: %v", api.DetailOf(err))
	}
	plain := errors.New("connection reset")
	err = joinDistinct([]error{trap(), plain, trap()})
	if !errors.Is(err, plain) || strings.Count(err.Error(), "trapped") != 1 || strings.Count(err.Error(), "connection reset") != 1 {
		t.Fatalf("mixed errors: %q", err)
	}
}

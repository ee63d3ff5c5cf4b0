package main

import (
	"strings"
	"testing"
	"time"
)

// What a new user hits first (issue 16, item 8): a command with no
// master running fails at once (two tries 0.2 s apart: nothing listens;
// it waited 2 s before, issue 32 item 9) with one line naming the address; --partitions 0 and --kind ordered are refused before anything
// is sent.
func TestFirstUserErrors(t *testing.T) {
	addr := freeAddr(t) // nothing listens there
	t0 := time.Now()
	_, errOut, err := cli(t, addr, nil, "table", "list")
	took := time.Since(t0)
	if err == nil {
		t.Fatal("table list with no master succeeded")
	}
	if got := lines(errOut); len(got) != 1 || !strings.Contains(got[0], "no master answers at "+addr) {
		t.Fatalf("stderr %q: want one line saying no master answers at %s", errOut, addr)
	}
	if took > 1800*time.Millisecond {
		t.Fatalf("took %v to say no master answers (want about 0.2 s)", took)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"table", "create", "x", "--partitions", "0"}, "--partitions 0: want 1 to 4096"},
		{[]string{"table", "create", "x", "--kind", "nope"}, "want point, bulk or ordered"},
		{[]string{"table", "create", "x", "--kind", "ordered", "--partitions", "4"}, "--split-points"},
	} {
		_, errOut, err := cli(t, addr, nil, c.args...)
		if err == nil || !strings.Contains(errOut, c.want) || len(lines(errOut)) != 1 {
			t.Errorf("tabula %s: err %v, stderr %q; want one line with %q", strings.Join(c.args, " "), err, errOut, c.want)
		}
	}
}

// An error about a 5 KB key quotes its start and its length, not all of it.
func TestShowKey(t *testing.T) {
	if got := showKey("k1"); got != `"k1"` {
		t.Fatalf("showKey(k1) = %s", got)
	}
	got := showKey(strings.Repeat("k", 5000))
	if len(got) > 100 || !strings.Contains(got, "(5000 bytes)") {
		t.Fatalf("showKey of a 5000-byte key = %q", got)
	}
}

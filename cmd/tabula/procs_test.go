package main

import "testing"

func TestServerProcsFor(t *testing.T) {
	for _, c := range []struct {
		env        bool
		cur, cores int
		want       int
	}{
		{false, 2, 2, minServerProcs}, // a small machine: raised
		{false, 1, 1, minServerProcs},
		{false, 8, 8, 8},  // enough already
		{true, 2, 2, 2},   // the operator's GOMAXPROCS stays
		{false, 1, 2, 1},  // a CPU quota (cgroup) below the cores stays
		{false, 2, 16, 2}, // likewise
	} {
		if got := serverProcsFor(c.env, c.cur, c.cores); got != c.want {
			t.Errorf("serverProcsFor(env %v, %d procs, %d cores) = %d, want %d", c.env, c.cur, c.cores, got, c.want)
		}
	}
}

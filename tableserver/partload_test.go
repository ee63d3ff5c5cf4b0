package tableserver

import (
	"runtime"
	"testing"
	"time"
)

// A replica's busy time is one counter shared by every copy of its
// struct (hostTable copies it on each map change), so a map change does
// not reset it.
func TestPartLoadSharedAcrossCopies(t *testing.T) {
	r := &replica{load: new(partLoad)}
	r.load.since(time.Now().Add(-time.Millisecond))
	cp := *r
	cp.load.since(time.Now().Add(-2 * time.Millisecond))
	if got := r.load.busy(); got < uint64(3*time.Millisecond) {
		t.Fatalf("busy = %v, want at least 3ms from both copies", time.Duration(got))
	}
	var none *partLoad
	none.since(time.Now()) // a replica without one counts nothing, and does not panic
	if none.busy() != 0 {
		t.Fatal("nil partLoad reports busy time")
	}
}

func TestCapacityReportsDataDir(t *testing.T) {
	s := &Server{opts: Options{DataDir: t.TempDir(), BulkCapacity: 12345}}
	c := s.capacity()
	if c.GetBulkCapacityBytes() != 12345 || c.GetCpus() == 0 {
		t.Fatalf("capacity = %v", c)
	}
	if runtime.GOOS == "linux" {
		if c.GetDiskBytes() == 0 || c.GetDiskFreeBytes() > c.GetDiskBytes() || c.GetMemoryBytes() == 0 || c.GetProcessCpuNs() == 0 {
			t.Fatalf("capacity on linux = %v: want disk, memory and CPU time", c)
		}
	}
}

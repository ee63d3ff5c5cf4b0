package tableserver

import (
	"os/exec"
	"runtime"
	"strconv"
	"strings"
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

// TestDiskSpaceAsDfShowsIt: the size a server reports is what it can
// use (used + available, as df shows it), not the raw block count with
// root's reserve, so the balancer's fill limit means what df says.
func TestDiskSpaceAsDfShowsIt(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("diskSpace reads statfs on Linux only")
	}
	dir := t.TempDir()
	out, err := exec.Command("df", "-B1", "--output=used,avail", dir).Output()
	if err != nil {
		t.Skipf("df: %v", err)
	}
	f := strings.Fields(string(out))
	used, err1 := strconv.ParseUint(f[len(f)-2], 10, 64)
	avail, err2 := strconv.ParseUint(f[len(f)-1], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("df output %q", out)
	}
	total, free := diskSpace(dir)
	// Other processes write meanwhile: within 1% of the size.
	slack := total / 100
	if diff := int64(total) - int64(used+avail); diff > int64(slack) || -diff > int64(slack) {
		t.Errorf("size %d, df used+avail %d", total, used+avail)
	}
	if diff := int64(free) - int64(avail); diff > int64(slack) || -diff > int64(slack) {
		t.Errorf("free %d, df avail %d", free, avail)
	}
}

package tableserver

import (
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/point"
	"github.com/tabuladb/tabula/engines/vfs"
)

// TestReopenable: a write error marks the engine faulted (reported once,
// every later call refused with errReopening); the engine does not
// reopen while the disk still fails; once it heals it reopens with what
// was durable, and the wrapper serves the new incarnation.
func TestReopenable(t *testing.T) {
	fs := vfs.NewMem()
	opts := engines.Options{Dir: "/p", FS: fs, Storage: point.StorageSSD, Logger: slog.New(slog.DiscardHandler)}
	open := func() (engines.Engine, error) { return point.Open(opts) }
	e, err := open()
	if err != nil {
		t.Fatal(err)
	}
	r := newReopenable(e, open)
	defer r.Close()
	var faults atomic.Int32
	r.onFault = func(err error) {
		if !isDiskFault(err) {
			t.Errorf("reported a fault that is no disk fault: %v", err)
		}
		faults.Add(1)
	}
	for i := range 20 {
		if err := r.Apply([]engines.Mutation{{Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, "v%d", i)}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := r.Apply([]engines.Mutation{{}}); err == nil || isDiskFault(err) || faults.Load() != 0 {
		t.Fatalf("an invalid mutation: %v (disk fault %v, faults %d)", err, isDiskFault(err), faults.Load())
	}

	fs.Inject(vfs.Fault{Ops: vfs.OpWrite | vfs.OpSync | vfs.OpCreate, Sticky: true})
	err = r.Apply([]engines.Mutation{{Key: []byte("lost"), Value: []byte("x")}})
	if err == nil {
		err = r.Sync()
	}
	if !isDiskFault(err) {
		t.Fatalf("write on a failing disk: %v, want a disk fault", err)
	}
	if _, _, err := r.Get([]byte("k1")); !errors.Is(err, errReopening) {
		t.Fatalf("get after the fault: %v, want errReopening", err)
	}
	if err := r.Sync(); !errors.Is(err, errReopening) {
		t.Fatalf("sync after the fault: %v, want errReopening", err)
	}
	if n := faults.Load(); n != 1 {
		t.Fatalf("%d faults reported, want 1", n)
	}

	if err := r.closeCurrent(); err != nil {
		t.Logf("close the faulted engine: %v", err)
	}
	if _, _, err := r.Get([]byte("k1")); !errors.Is(err, errReopening) {
		t.Fatalf("get while reopening: %v, want errReopening", err)
	}
	if _, err := r.openFresh(); !isDiskFault(err) {
		t.Fatalf("reopen on a failing disk: %v, want a disk fault", err)
	}
	fs.ClearFaults()
	fresh, err := r.openFresh()
	if err != nil {
		t.Fatalf("reopen on a healed disk: %v", err)
	}
	if err := r.install(fresh, true); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.Get([]byte("k1")); !errors.Is(err, errReopening) {
		t.Fatalf("get from an incarnation held back: %v, want errReopening", err)
	}
	if v, _, err := r.inner().Get([]byte("k1")); err != nil || string(v) != "v1" {
		t.Fatalf("the replica's own get from an incarnation held back: %q, %v", v, err)
	}
	r.serve()
	for i := range 20 {
		v, _, err := r.Get(fmt.Appendf(nil, "k%d", i))
		if err != nil || string(v) != fmt.Sprintf("v%d", i) {
			t.Fatalf("k%d after the reopen: %q, %v", i, v, err)
		}
	}
	if _, _, err := r.Get(probeKey); !errors.Is(err, engines.ErrNotFound) {
		t.Fatalf("the probe key after the reopen: %v, want not found", err)
	}
	if err := r.Apply([]engines.Mutation{{Key: []byte("after"), Value: []byte("y")}}); err != nil {
		t.Fatalf("write after the reopen: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.Get([]byte("after")); !errors.Is(err, engines.ErrClosed) {
		t.Fatalf("get after close: %v, want ErrClosed", err)
	}
	if err := r.install(fresh, false); !errors.Is(err, engines.ErrClosed) {
		t.Fatalf("install after close: %v, want ErrClosed", err)
	}
}

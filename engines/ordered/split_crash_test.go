package ordered

import (
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/enginetest"
)

var errStop = errors.New("stopped here")

// TestSplitStopsAtEveryStep stops a split after each of its steps (as a
// process killed there would: pebble's checkpoints and flushes are synced
// when they return) and checks that the parent is then intact and not
// marked split, and that the split, redone over the half-made children,
// completes.
func TestSplitStopsAtEveryStep(t *testing.T) {
	for stop := 0; ; stop++ {
		root := t.TempDir()
		clock := enginetest.NewClock()
		o := func(name string) engines.Options {
			return engines.Options{Dir: filepath.Join(root, name), Storage: StorageSSD, Replayable: true, Now: clock.Now}
		}
		p, err := Open(o("parent"))
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{}
		for i := range 200 {
			k := fmt.Sprintf("k%03d", i)
			want[k] = "v" + k
		}
		want[engines.SharedPrefix+"log/applied"] = "lsn"
		var batch []engines.Mutation
		for k, v := range want {
			batch = append(batch, engines.Mutation{Key: []byte(k), Value: []byte(v)})
		}
		if err := p.Apply(batch); err != nil {
			t.Fatal(err)
		}
		steps := 0
		splitHook = func(step string) error {
			steps++
			if steps > stop {
				return fmt.Errorf("%s: %w", step, errStop)
			}
			return nil
		}
		spec := engines.SplitSpec{Key: []byte("k100"), Left: o("left"), Right: o("right")}
		l, r, err := p.Split(spec)
		splitHook = nil
		if err == nil {
			if stop < steps {
				t.Fatalf("stop after %d steps: split went on", stop)
			}
			t.Logf("split has %d steps", steps)
			_ = l.Close()
			_ = r.Close()
			return
		}
		if !errors.Is(err, errStop) {
			t.Fatalf("stop after %d: %v", stop, err)
		}
		if _, _, done, err := engines.SplitDone(nil, o("parent").Dir); done || err != nil {
			t.Fatalf("stop after %d: SplitDone = %v, %v", stop, done, err)
		}
		p, err = Open(o("parent"))
		if err != nil {
			t.Fatalf("stop after %d: reopen parent: %v", stop, err)
		}
		got := map[string]string{}
		if err := p.Scan(func(r engines.Record) error { got[string(r.Key)] = string(r.Value); return nil }); err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Fatalf("stop after %d: parent holds %d keys, want %d", stop, len(got), len(want))
		}
		l, r, err = p.Split(spec)
		if err != nil {
			t.Fatalf("stop after %d: split again: %v", stop, err)
		}
		for _, c := range []struct {
			e    engines.Engine
			n    int
			name string
		}{{l, 101, "left"}, {r, 101, "right"}} {
			n := 0
			if err := c.e.Scan(func(engines.Record) error { n++; return nil }); err != nil {
				t.Fatal(err)
			}
			if n != c.n {
				t.Fatalf("stop after %d: %s child holds %d keys, want %d", stop, c.name, n, c.n)
			}
		}
		if err := errors.Join(l.Close(), r.Close()); err != nil {
			t.Fatal(err)
		}
	}
}

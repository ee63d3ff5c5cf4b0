package main

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/engines/bulk"
)

// catalogIn is one operation of the master nemesis history. name is the
// object it acts on, the unit porcupine checks alone: a table name, the
// bulk table or the coprocessor.
type catalogIn struct {
	// op: create, drop, describe (a table); publish, status (the bulk
	// table's versions); deploy, list (the coprocessor's versions).
	op   string
	name string
	// n: publish's version; deploy's module.
	n uint64
}

// catalogOut is an outcome: res is ok, exists, missing, or unknown (no
// answer, or an error that does not say whether it was applied).
type catalogOut struct {
	res string
	// n: status's serving version; deploy's version.
	n uint64
	// versions: list's (version, module) pairs.
	versions [][2]uint64
}

// catalogState is one object's state (the fields of its kind; comparable,
// for porcupine's cache).
type catalogState struct {
	exists  bool   // a table
	serving uint64 // the bulk table's serving version
	// The coprocessor: the next version a new module gets, and the
	// versions given so far as ",module=version,".
	next     uint64
	assigned string
}

// coprocVersion returns the version module k got (0: none yet).
func (s catalogState) coprocVersion(k uint64) uint64 {
	tag := fmt.Sprintf(",%d=", k)
	i := strings.Index(s.assigned, tag)
	if i < 0 {
		return 0
	}
	rest := s.assigned[i+len(tag):]
	v, _ := strconv.ParseUint(rest[:strings.IndexByte(rest, ',')], 10, 64)
	return v
}

func (s catalogState) deploy(k uint64) catalogState {
	if s.assigned == "" {
		s.assigned = ","
	}
	s.assigned += fmt.Sprintf("%d=%d,", k, s.next)
	s.next++
	return s
}

// catalogModel: each object is independent.
//
// A table exists or not. A create that answers ALREADY_EXISTS only says
// the table existed at some point of the call; likewise a drop's
// NOT_FOUND. A retried create or drop takes effect once (request ids).
//
// The bulk table serves one version; a single publisher publishes
// increasing versions, so a publish that succeeded switched it to its
// version at one point of the call (never back), and one with no answer
// did so at some point after its start, or never (a newer version took
// its place first).
//
// The coprocessor's versions are numbered from 1 as modules are deployed,
// each module once: a deploy answers the version its module got, a new
// one the next, and a retried deploy of the same module the same one;
// a list shows versions that agree, the newest being the last given.
//
// An operation with no answer may have taken effect: its return is after
// everything, so porcupine may place it last.
var catalogModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		var names []string
		for _, op := range history {
			n := op.Input.(catalogIn).name
			if by[n] == nil {
				names = append(names, n)
			}
			by[n] = append(by[n], op)
		}
		out := make([][]porcupine.Operation, 0, len(names))
		for _, n := range names {
			out = append(out, by[n])
		}
		return out
	},
	Init: func() any { return catalogState{next: 1} },
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.(catalogState), input.(catalogIn), output.(catalogOut)
		switch in.op {
		case "create":
			if out.res == "missing" { // refused: no such tenant
				return true, s
			}
			ok := out.res != "ok" || !s.exists
			s.exists = true
			return ok, s
		case "drop":
			ok := out.res != "ok" || s.exists
			s.exists = false
			return ok, s
		case "describe":
			switch out.res {
			case "ok":
				return s.exists, s
			case "missing":
				return !s.exists, s
			}
			return true, s
		case "publish":
			if out.res == "ok" {
				ok := s.serving < in.n
				s.serving = in.n
				return ok, s
			}
			s.serving = max(s.serving, in.n)
			return true, s
		case "status":
			return s.serving == out.n, s
		case "deploy":
			if v := s.coprocVersion(in.n); v != 0 {
				return out.res != "ok" || out.n == v, s
			}
			ok := out.res != "ok" || out.n == s.next
			return ok, s.deploy(in.n)
		case "list":
			newest := uint64(0)
			for _, p := range out.versions {
				if s.coprocVersion(p[1]) != p[0] {
					return false, s
				}
				newest = max(newest, p[0])
			}
			return newest == s.next-1, s
		}
		return false, s
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(catalogIn), output.(catalogOut)
		switch in.op {
		case "publish", "deploy":
			return fmt.Sprintf("%s(%s, %d) -> %s %d", in.op, in.name, in.n, out.res, out.n)
		case "status":
			return fmt.Sprintf("status(%s) -> serving %d", in.name, out.n)
		case "list":
			return fmt.Sprintf("list(%s) -> %v", in.name, out.versions)
		}
		return fmt.Sprintf("%s(%s) -> %s", in.op, in.name, out.res)
	},
}

// outcome maps a call's error to the history's outcome.
func outcome(err error) string {
	switch api.CodeOf(err) {
	case api.ErrorCode_ERROR_CODE_UNSPECIFIED:
		if err != nil {
			return "unknown"
		}
		return "ok"
	case api.ErrorCode_ERROR_CODE_ALREADY_EXISTS:
		return "exists"
	case api.ErrorCode_ERROR_CODE_NOT_FOUND:
		return "missing"
	}
	return "unknown"
}

// nemesisModule returns a minimal coprocessor module (the ABI exports and
// one handler, "m<k>"): a different module, and sha256, for each k.
func nemesisModule(k uint64) []byte {
	uleb := func(v uint64) []byte {
		var b []byte
		for {
			c := byte(v & 0x7f)
			if v >>= 7; v == 0 {
				return append(b, c)
			}
			b = append(b, c|0x80)
		}
	}
	vec := func(items ...[]byte) []byte {
		b := uleb(uint64(len(items)))
		for _, it := range items {
			b = append(b, it...)
		}
		return b
	}
	str := func(s string) []byte { return append(uleb(uint64(len(s))), s...) }
	sec := func(id byte, body []byte) []byte {
		return append(append([]byte{id}, uleb(uint64(len(body)))...), body...)
	}
	export := func(name string, kind byte, idx uint64) []byte { return append(append(str(name), kind), uleb(idx)...) }
	code := func(body ...byte) []byte { return append(uleb(uint64(len(body)+1)), append([]byte{0}, body...)...) }
	b := []byte("\x00asm\x01\x00\x00\x00")
	b = append(b, sec(1, vec([]byte{0x60, 0, 0}, []byte{0x60, 1, 0x7f, 1, 0x7f}))...) // ()->(), (i32)->(i32)
	b = append(b, sec(3, vec([]byte{0}, []byte{1}, []byte{1}))...)
	b = append(b, sec(5, vec([]byte{0, 1}))...) // one page
	b = append(b, sec(7, vec(export("tabula_abi_v1", 0, 0), export("tabula_reserve", 0, 1), export(fmt.Sprintf("m%d", k), 0, 2), export("memory", 2, 0)))...)
	b = append(b, sec(10, vec(code(0x0b), code(0x41, 0, 0x0b), code(0x41, 0, 0x0b)))...)
	return b
}

// nemesisBulkVersion builds version v of a bulk table of 3 partitions in
// dir: every key holds v.
func nemesisBulkVersion(ctx context.Context, dir string, v uint64) (client.BulkPublish, error) {
	var b strings.Builder
	for i := range 300 {
		fmt.Fprintf(&b, "k%03d\tv%d\n", i, v)
	}
	in := filepath.Join(dir, fmt.Sprintf("v%d.tsv", v))
	if err := os.WriteFile(in, []byte(b.String()), 0o644); err != nil {
		return client.BulkPublish{}, err
	}
	parts, err := bulk.BuildTable(ctx, []string{in}, filepath.Join(dir, fmt.Sprintf("v%d", v)), bulk.BuildOptions{Partitions: 3, Version: v, Workers: 1})
	if err != nil {
		return client.BulkPublish{}, err
	}
	p := client.BulkPublish{Version: v}
	for _, f := range parts {
		p.Files = append(p.Files, client.BulkFile{Path: f.Path, Size: uint64(f.FileBytes), CRC32C: f.CRC, Records: f.Records})
	}
	return p, nil
}

// TestMasterNemesis: three master processes on raft and three table
// servers; clients create, drop and describe tables, a publisher
// publishes versions of a bulk table and a deployer deploys coprocessor
// modules (each reading the versions back), while a nemesis kills (kill
// -9, then restarts) or stops (SIGSTOP, then SIGCONT) the leader again and
// again, and every fourth time kills a table server (kill -9, then
// restarts it). The history of every object is linearizable, and writes to
// a replicated table never fail: primaries keep their leases through
// every new leader. TABULA_MASTER_NEMESIS_SERVERS=0 leaves the table
// servers alone; TABULA_MASTER_NEMESIS_DURATION sets the length.
func TestMasterNemesis(t *testing.T) {
	duration := envDuration(t, "TABULA_MASTER_NEMESIS_DURATION", 12*time.Second)
	serverFaults := os.Getenv("TABULA_MASTER_NEMESIS_SERVERS") != "0"
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	dir := t.TempDir()
	var addrs, peers []string
	for i := range 3 {
		a := freeAddr(t)
		addrs = append(addrs, a)
		peers = append(peers, fmt.Sprintf("%d=%s", i+1, a))
	}
	masterList := strings.Join(addrs, ",")
	masters := make([]*proc, 3)
	startMaster := func(i int) {
		masters[i] = start(t, fmt.Sprintf("master-%d", i+1), "master", "--id", fmt.Sprint(i+1), "--peers", strings.Join(peers, ","),
			"--data", filepath.Join(dir, fmt.Sprintf("m%d", i+1)))
	}
	for i := range 3 {
		startMaster(i)
	}
	servers := make([]*proc, 3)
	startServer := func(i int) {
		servers[i] = start(t, fmt.Sprintf("server-%d", i), "server", "--master", masterList, "--listen", freeAddr(t),
			"--data", filepath.Join(dir, fmt.Sprintf("s%d", i)), "--fault-domain", fmt.Sprintf("fd-%d", i),
			"--coproc-cache", filepath.Join(dir, "coproc-cache"))
	}
	for i := range 3 {
		startServer(i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), duration+2*time.Minute)
	defer cancel()
	c, err := client.New(ctx, client.Options{Credential: testCred, Masters: addrs, RetryTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitFor(t, 30*time.Second, "three servers registered", func() (bool, error) {
		s, err := c.ListServers(ctx)
		return err == nil && len(s) == 3, err
	})
	if _, err := c.CreateTable(ctx, "data", api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: 3, Replication: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateTable(ctx, "model", api.TableKind_TABLE_KIND_BULK, &api.TableOptions{Partitions: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateTable(ctx, "cop", api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: 1, Replication: 1, Storage: "memory"}); err != nil {
		t.Fatal(err)
	}
	data, model, cop := c.Table("data"), c.Table("model"), c.Table("cop")
	waitFor(t, 30*time.Second, "the data table writable", func() (bool, error) {
		err := data.Put(ctx, []byte("probe"), []byte("x"))
		return err == nil, err
	})

	leader := func() int {
		for i, a := range addrs {
			if !masters[i].running() {
				continue
			}
			out, _, err := cli(t, a, nil, "master", "members", "--timeout", "2s")
			if err != nil {
				continue
			}
			for _, l := range lines(out) {
				if f := strings.Fields(l); len(f) >= 3 && f[2] == "leader" {
					for k, b := range addrs {
						if b == f[1] {
							return k
						}
					}
				}
			}
		}
		return -1
	}

	var (
		mu      sync.Mutex
		history []porcupine.Operation
		t0      = time.Now()
	)
	now := func() int64 { return int64(time.Since(t0)) }
	record := func(cl int, in catalogIn, call int64, out catalogOut) {
		ret := now()
		if out.res == "unknown" {
			ret = 1 << 62
		}
		mu.Lock()
		history = append(history, porcupine.Operation{ClientId: cl, Input: in, Call: call, Output: out, Return: ret})
		mu.Unlock()
	}
	stop := make(chan struct{})
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	var wg sync.WaitGroup
	for cl := range 3 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(cl)+10))
			for !stopped() {
				in := catalogIn{op: []string{"create", "drop", "describe"}[r.IntN(3)], name: fmt.Sprintf("c%d", r.IntN(3))}
				call := now()
				octx, ocancel := context.WithTimeout(ctx, 6*time.Second)
				var err error
				switch in.op {
				case "create":
					_, err = c.CreateTable(octx, in.name, api.TableKind_TABLE_KIND_POINT, &api.TableOptions{Partitions: 1, Replication: 1, Storage: "memory"})
				case "drop":
					err = c.DropTable(octx, in.name)
				default:
					_, err = c.DescribeTable(octx, in.name)
				}
				ocancel()
				out := catalogOut{res: outcome(err)}
				if in.op == "describe" && out.res == "unknown" {
					continue // a read that returned nothing constrains nothing
				}
				record(cl, in, call, out)
			}
		})
	}
	var publishes, deploys atomic.Int64
	// The publisher: versions 1, 2, ... of the bulk table, one at a time,
	// each read back with the serving version.
	wg.Go(func() {
		bdir := filepath.Join(dir, "bulk")
		if err := os.MkdirAll(bdir, 0o755); err != nil {
			t.Error(err)
			return
		}
		for v := uint64(1); !stopped(); v++ {
			p, err := nemesisBulkVersion(ctx, bdir, v)
			if err != nil {
				t.Errorf("build bulk version %d: %v", v, err)
				return
			}
			// One operation: the same version again until it is
			// published (a publish resumes where it stopped), so at
			// most the last one of the run has no answer.
			call, err := now(), error(nil)
			for {
				pctx, pcancel := context.WithTimeout(ctx, 8*time.Second)
				err = model.PublishBulk(pctx, p, client.PublishOptions{})
				pcancel()
				if err == nil || stopped() {
					break
				}
				t.Logf("publish of version %d (trying again): %v", v, err)
			}
			if err == nil {
				publishes.Add(1)
			}
			record(3, catalogIn{op: "publish", name: "model", n: v}, call, catalogOut{res: map[bool]string{true: "ok", false: "unknown"}[err == nil]})
			call = now()
			sctx, scancel := context.WithTimeout(ctx, 6*time.Second)
			st, err := model.BulkStatus(sctx)
			scancel()
			if err == nil {
				record(3, catalogIn{op: "status", name: "model"}, call, catalogOut{res: "ok", n: st.GetCurrent()})
			}
		}
	})
	// The deployer: a new module each time, each deploy followed by a
	// list of the versions.
	wg.Go(func() {
		for k := uint64(1); !stopped(); k++ {
			// One operation: the same module again until it is
			// deployed (the same bytes get the same version), so at
			// most the last one of the run has no answer.
			call := now()
			var v uint64
			var err error
			for {
				dctx, dcancel := context.WithTimeout(ctx, 6*time.Second)
				v, err = cop.DeployCoprocBytes(dctx, "f", nemesisModule(k))
				dcancel()
				if err == nil || stopped() {
					break
				}
				t.Logf("deploy of module %d (trying again): %v", k, err)
			}
			out := catalogOut{res: "ok", n: v}
			if err != nil {
				out = catalogOut{res: "unknown"}
			} else {
				deploys.Add(1)
			}
			record(4, catalogIn{op: "deploy", name: "coproc", n: k}, call, out)
			call = now()
			lctx, lcancel := context.WithTimeout(ctx, 6*time.Second)
			cs, err := cop.Coprocs(lctx)
			lcancel()
			if err != nil {
				continue
			}
			out = catalogOut{res: "ok"}
			for _, cp := range cs {
				for _, cv := range cp.GetVersions() {
					var m uint64
					if len(cv.GetMethods()) != 1 || cp.GetName() != "f" {
						t.Errorf("coprocessor %s version %d: methods %v", cp.GetName(), cv.GetVersion(), cv.GetMethods())
						continue
					}
					if _, err := fmt.Sscanf(cv.GetMethods()[0], "m%d", &m); err != nil {
						t.Errorf("coprocessor version %d: method %q", cv.GetVersion(), cv.GetMethods()[0])
					}
					out.versions = append(out.versions, [2]uint64{cv.GetVersion(), m})
				}
			}
			record(4, catalogIn{op: "list", name: "coproc"}, call, out)
			time.Sleep(100 * time.Millisecond) // servers compile each version
		}
	})
	var writes, failed atomic.Int64
	var firstFail atomic.Value
	for w := range 2 {
		wg.Go(func() {
			for i := 0; !stopped(); i++ {
				wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
				err := data.Put(wctx, fmt.Appendf(nil, "w%d-%d", w, i%200), []byte("v"))
				wcancel()
				writes.Add(1)
				if err != nil {
					failed.Add(1)
					firstFail.CompareAndSwap(nil, err.Error())
				}
			}
		})
	}
	faults := 0
	for end := time.Now().Add(duration); time.Now().Before(end); {
		time.Sleep(time.Duration(1500+rng.IntN(1500)) * time.Millisecond)
		i := leader()
		if i < 0 {
			continue
		}
		faults++
		if serverFaults && faults%4 == 0 {
			// A table server dies too: its primaries fail over (through
			// whichever master leads), and it comes back.
			k := rng.IntN(len(servers))
			t.Logf("kill -9 table server %d", k)
			servers[k].kill()
			time.Sleep(time.Duration(500+rng.IntN(1000)) * time.Millisecond)
			startServer(k)
		}
		if rng.IntN(2) == 0 {
			t.Logf("kill -9 the leader, master %d", i+1)
			masters[i].kill()
			time.Sleep(time.Duration(300+rng.IntN(1000)) * time.Millisecond)
			startMaster(i)
		} else {
			d := time.Duration(500+rng.IntN(1500)) * time.Millisecond
			t.Logf("SIGSTOP the leader, master %d, for %v", i+1, d)
			_ = masters[i].cmd.Process.Signal(syscall.SIGSTOP)
			time.Sleep(d)
			_ = masters[i].cmd.Process.Signal(syscall.SIGCONT)
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("%d leader faults; %d operations (%d publishes, %d deploys succeeded); %d writes, %d failed",
		faults, len(history), publishes.Load(), deploys.Load(), writes.Load(), failed.Load())
	if publishes.Load() == 0 || deploys.Load() == 0 {
		t.Errorf("no publish or no deploy succeeded: the nemesis checked nothing of them")
	}
	res, info := porcupine.CheckOperationsVerbose(catalogModel, history, time.Minute)
	if res == porcupine.Unknown {
		t.Fatalf("the checker ran out of time on %d operations (seed %d)", len(history), seed)
	}
	if res != porcupine.Ok {
		path := filepath.Join(os.TempDir(), fmt.Sprintf("tabula-master-nemesis-%d.html", seed))
		_ = porcupine.VisualizePath(catalogModel, info, path)
		illegal := func(h []porcupine.Operation) bool {
			return porcupine.CheckOperationsTimeout(catalogModel, h, 10*time.Second) == porcupine.Illegal
		}
		for _, part := range catalogModel.Partition(history) {
			if !illegal(part) {
				continue
			}
			slices.SortFunc(part, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
			// The shortest prefix (by call) that has no linearization ends
			// with the operation that broke it: print its last ones.
			n := sort.Search(len(part), func(n int) bool { return illegal(part[:n+1]) }) + 1
			var b strings.Builder
			for _, op := range part[max(0, n-60):n] {
				ret := "never"
				if op.Return < 1<<62 {
					ret = fmt.Sprintf("%.3fs", float64(op.Return)/1e9)
				}
				fmt.Fprintf(&b, "  client %d  %.3fs..%s  %s\n", op.ClientId, float64(op.Call)/1e9, ret, catalogModel.DescribeOperation(op.Input, op.Output))
			}
			t.Logf("a history with no linearization (the last %d of the %d operations of the shortest such prefix):\n%s", min(n, 60), n, b.String())
			break
		}
		t.Fatalf("catalog history not linearizable (seed %d); see %s", seed, path)
	}
	if failed.Load() > 0 {
		t.Errorf("%d of %d writes failed across leader faults (first: %v; seed %d)", failed.Load(), writes.Load(), firstFail.Load(), seed)
	}
}

// TestCatalogModel: the checker of TestMasterNemesis refuses histories a
// single authority could not produce.
func TestCatalogModel(t *testing.T) {
	op := func(cl int, o, name string, call, ret int64, res string) porcupine.Operation {
		return porcupine.Operation{ClientId: cl, Input: catalogIn{op: o, name: name}, Call: call, Output: catalogOut{res: res}, Return: ret}
	}
	opN := func(cl int, o string, n uint64, call, ret int64, res string, outN uint64) porcupine.Operation {
		return porcupine.Operation{ClientId: cl, Input: catalogIn{op: o, name: "x", n: n}, Call: call, Output: catalogOut{res: res, n: outN}, Return: ret}
	}
	list := func(call, ret int64, versions ...[2]uint64) porcupine.Operation {
		return porcupine.Operation{ClientId: 9, Input: catalogIn{op: "list", name: "x"}, Call: call, Output: catalogOut{res: "ok", versions: versions}, Return: ret}
	}
	const never = 1 << 62
	cases := []struct {
		name string
		h    []porcupine.Operation
		want bool // linearizable
	}{
		{"two creates both ok", []porcupine.Operation{op(0, "create", "a", 0, 1, "ok"), op(1, "create", "a", 2, 3, "ok")}, false},
		{"create then drop then describe", []porcupine.Operation{op(0, "create", "a", 0, 1, "ok"), op(1, "drop", "a", 2, 3, "ok"), op(0, "describe", "a", 4, 5, "missing")}, true},
		{"describe sees a dropped table", []porcupine.Operation{op(0, "create", "a", 0, 1, "ok"), op(1, "drop", "a", 2, 3, "ok"), op(0, "describe", "a", 4, 5, "ok")}, false},
		{"unknown create seen later", []porcupine.Operation{op(0, "create", "a", 0, never, "unknown"), op(1, "describe", "a", 2, 3, "ok")}, true},
		{"a retried create reports exists", []porcupine.Operation{op(0, "create", "a", 0, 1, "exists"), op(1, "describe", "a", 2, 3, "ok")}, true},
		// What the nemesis found before request ids: one create (seen at
		// once) that took effect again after a drop.
		{"one create, two effects", []porcupine.Operation{op(0, "create", "a", 0, 10, "ok"), op(1, "describe", "a", 1, 2, "ok"),
			op(1, "drop", "a", 3, 4, "ok"), op(1, "drop", "a", 5, 6, "ok")}, false},
		{"publish then status", []porcupine.Operation{opN(0, "publish", 1, 0, 1, "ok", 0), opN(0, "status", 0, 2, 3, "ok", 1)}, true},
		{"status before the publish", []porcupine.Operation{opN(0, "status", 0, 0, 1, "ok", 1), opN(0, "publish", 1, 2, 3, "ok", 0)}, false},
		{"serving goes back", []porcupine.Operation{opN(0, "publish", 1, 0, 1, "ok", 0), opN(0, "publish", 2, 2, 3, "ok", 0), opN(1, "status", 0, 4, 5, "ok", 1)}, false},
		{"an unknown publish that never took", []porcupine.Operation{opN(0, "publish", 1, 0, never, "unknown", 0), opN(0, "publish", 2, 2, 3, "ok", 0),
			opN(1, "status", 0, 4, 5, "ok", 2)}, true},
		{"deploys numbered", []porcupine.Operation{opN(0, "deploy", 1, 0, 1, "ok", 1), opN(0, "deploy", 2, 2, 3, "ok", 2), list(4, 5, [2]uint64{1, 1}, [2]uint64{2, 2})}, true},
		{"a deploy numbered twice", []porcupine.Operation{opN(0, "deploy", 1, 0, 1, "ok", 1), opN(0, "deploy", 2, 2, 3, "ok", 3)}, false},
		{"a list misses the last deploy", []porcupine.Operation{opN(0, "deploy", 1, 0, 1, "ok", 1), opN(0, "deploy", 2, 2, 3, "ok", 2), list(4, 5, [2]uint64{1, 1})}, false},
		{"a list swaps modules", []porcupine.Operation{opN(0, "deploy", 1, 0, 1, "ok", 1), opN(0, "deploy", 2, 2, 3, "ok", 2), list(4, 5, [2]uint64{1, 2}, [2]uint64{2, 1})}, false},
		{"an unknown deploy listed", []porcupine.Operation{opN(0, "deploy", 1, 0, never, "unknown", 0), opN(0, "deploy", 2, 2, 3, "ok", 2), list(4, 5, [2]uint64{1, 1}, [2]uint64{2, 2})}, true},
	}
	for _, c := range cases {
		if got := porcupine.CheckOperations(catalogModel, c.h); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

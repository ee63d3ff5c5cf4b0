package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/replication/stream"
	"github.com/tabuladb/tabula/replication/stream/streampb"
)

// TestStreamProcesses runs `tabula master` and 5 `tabula server` processes
// (every server is an extent node), appends to a stream from 6 writers,
// kill -9s the server holding the open extent's primary, and checks that
// appends continue after the seal and that every acknowledged append reads
// back identically from every replica of its extent; then a bit flipped in
// an extent file is found by the scrubber and repaired from a good replica.
func TestStreamProcesses(t *testing.T) {
	dir := t.TempDir()
	masterAddr := freeAddr(t)
	master := start(t, "master", append([]string{"master", "--listen", masterAddr, "--data", filepath.Join(dir, "master")}, fastTiming...)...)
	master.waitOutput("master serving", 15*time.Second)
	const n = 5
	servers := make([]*proc, n)
	dataDir := func(i int) string { return filepath.Join(dir, fmt.Sprintf("server-%d", i)) }
	for i := range n {
		servers[i] = start(t, fmt.Sprintf("server-%d", i), "server", "--master", masterAddr, "--data", dataDir(i),
			"--fault-domain", fmt.Sprintf("fd-%d", i), "--scrub-interval", "200ms")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := client.New(ctx, client.Options{Credential: testCred, Masters: []string{masterAddr}, RetryTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Server i's extent node id is its server id, recorded at registration.
	nodeOf := map[string]int{}
	waitFor(t, 20*time.Second, "5 extent nodes", func() (bool, error) {
		nodes, err := c.Streams().Nodes(ctx)
		if err != nil {
			return false, err
		}
		alive := 0
		for _, nd := range nodes {
			if nd.Alive {
				alive++
			}
			if i := strings.TrimPrefix(nd.FaultDomain, "fd-"); i != nd.FaultDomain {
				var k int
				fmt.Sscan(i, &k)
				nodeOf[nd.ID] = k
			}
		}
		return alive == n, nil
	})
	if out := mustCLI(t, masterAddr, "stream", "create", "log"); !strings.Contains(out, "created") {
		t.Fatalf("stream create: %s", out)
	}

	sc := stream.NewClient(c.Streams(), stream.ClientOptions{Conns: c.StreamConns()})
	defer sc.Close()
	type acked struct {
		data []byte
		loc  stream.Location
	}
	var (
		mu    sync.Mutex
		acks  []acked
		wg    sync.WaitGroup
		stop  = make(chan struct{})
		worst time.Duration
	)
	for w := range 6 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				data := []byte(fmt.Sprintf("writer-%d-record-%06d-%s", w, i, strings.Repeat("x", 200)))
				t0 := time.Now()
				actx, acancel := context.WithTimeout(ctx, 10*time.Second)
				res, err := sc.Append(actx, "log", data)
				acancel()
				d := time.Since(t0)
				if err != nil {
					t.Logf("append failed (not acknowledged): %v", err)
					continue
				}
				mu.Lock()
				acks = append(acks, acked{data, res.Location})
				worst = max(worst, d)
				mu.Unlock()
			}
		})
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(acks)
	}
	waitFor(t, 30*time.Second, "acknowledged appends", func() (bool, error) { return count() > 300, nil })
	info, err := c.Streams().Stream(ctx, "log")
	if err != nil {
		t.Fatal(err)
	}
	last := info.Last()
	victim := nodeOf[last.Replicas[0].Node]
	t.Logf("killing server-%d (node %s), primary of open extent %d", victim, last.Replicas[0].Node, last.ID)
	before := count()
	servers[victim].kill()
	killedAt := time.Now()
	waitFor(t, 30*time.Second, "appends to continue after the kill", func() (bool, error) { return count() > before+300, nil })
	close(stop)
	wg.Wait()
	t.Logf("300 more appends acknowledged %v after the kill; worst acknowledged append latency %v", time.Since(killedAt).Round(time.Millisecond), worst)

	info, err = c.Streams().Stream(ctx, "log")
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Extents) < 2 || !info.Extents[0].Sealed {
		t.Fatalf("after the kill the stream has %d extents, first sealed=%v; want a sealed one and a new one", len(info.Extents), info.Extents[0].Sealed)
	}
	// Every acknowledged append, from every live replica of its extent.
	conns := map[string]streampb.ExtentNodeClient{}
	nodeClient := func(addr string) streampb.ExtentNodeClient {
		if nc, ok := conns[addr]; ok {
			return nc
		}
		cc, err := grpc.NewClient(addr, append(testCred.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		conns[addr] = streampb.NewExtentNodeClient(cc)
		return conns[addr]
	}
	placement := map[uint64]stream.ExtentPlacement{}
	for _, e := range info.Extents {
		placement[e.ID] = e
	}
	victimNode := last.Replicas[0].Node
	readAll := func(a acked) {
		t.Helper()
		p := placement[a.loc.Extent]
		checked := 0
		for i := 0; i < len(p.Replicas); i++ {
			r := p.Replicas[i]
			if r.Node == victimNode || !r.OK {
				continue // dead, or a copy still being built (re-replication)
			}
			resp, err := nodeClient(r.Addr).Read(ctx, &streampb.ReadRequest{Extent: a.loc.Extent, Offset: a.loc.Offset, Length: a.loc.Length})
			if err != nil {
				// The placement may have moved on since it was read (the
				// victim declared dead, its copy replaced): read it again
				// and check every good replica it names.
				fresh, ferr := c.Streams().Extent(ctx, a.loc.Extent)
				if ferr != nil || slices.Equal(fresh.Replicas, p.Replicas) {
					t.Fatalf("read extent %d at %d from %s: %v", a.loc.Extent, a.loc.Offset, r.Node, err)
				}
				t.Logf("read extent %d from %s: %v; its placement changed, reading again", a.loc.Extent, r.Node, err)
				p, placement[a.loc.Extent] = fresh, fresh
				i, checked = -1, 0
				continue
			}
			var got [][]byte
			if err := stream.DecodeBlocks(resp.GetData(), a.loc.Extent, a.loc.Offset, func(_ int64, _ uint64, _ bool, payload []byte) error {
				got = append(got, bytes.Clone(payload))
				return nil
			}); err != nil {
				t.Fatalf("decode extent %d at %d from %s: %v", a.loc.Extent, a.loc.Offset, r.Node, err)
			}
			if len(got) == 0 || !bytes.Equal(got[0], a.data) {
				t.Fatalf("extent %d at %d on %s holds %q, acknowledged %q", a.loc.Extent, a.loc.Offset, r.Node, got, a.data)
			}
			checked++
		}
		if checked < 2 {
			t.Fatalf("extent %d: only %d live replicas to read", a.loc.Extent, checked)
		}
	}
	for _, a := range acks {
		readAll(a)
	}
	t.Logf("%d acknowledged appends read back identically from every live replica of %d extents", len(acks), len(info.Extents))

	// The sealed extent that lost a replica is re-replicated to another
	// node (in an unused fault domain) once the victim is declared dead.
	waitFor(t, 30*time.Second, "re-replication of the sealed extent", func() (bool, error) {
		p, err := c.Streams().Extent(ctx, info.Extents[0].ID)
		if err != nil {
			return false, err
		}
		ok := 0
		for _, r := range p.Replicas {
			if r.Node != victimNode && r.OK {
				ok++
			}
		}
		if ok == 3 {
			placement[p.ID] = p
		}
		return ok == 3, nil
	})
	for _, a := range acks {
		if a.loc.Extent == info.Extents[0].ID {
			readAll(a)
		}
	}
	t.Logf("extent %d re-replicated: 3 good replicas without the killed node", info.Extents[0].ID)

	// The CLI shows the stream and its first extent.
	if out := mustCLI(t, masterAddr, "stream", "stat", "log"); !strings.Contains(out, "sealed") {
		t.Fatalf("stream stat:\n%s", out)
	}
	first := placement[info.Extents[0].ID]
	if out := mustCLI(t, masterAddr, "extent", "stat", fmt.Sprint(first.ID)); !strings.Contains(out, "sealed") {
		t.Fatalf("extent stat:\n%s", out)
	}

	// A bit flipped in a sealed replica's file on a live server: the
	// scrubber finds it and the manager rebuilds it from a good replica.
	var target stream.ReplicaAddr
	for _, r := range first.Replicas {
		if r.Node != victimNode {
			target = r
			break
		}
	}
	path := filepath.Join(dataDir(nodeOf[target.Node]), "extents", fmt.Sprintf("%016x.ext", first.ID))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("extent file of %s: %v", target.Node, err)
	}
	pos := len(b) / 2
	b[pos] ^= 0x04
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the scrubber to find the flip and the replica to be repaired", func() (bool, error) {
		got, err := os.ReadFile(path)
		if err != nil {
			return false, nil // being replaced
		}
		return len(got) > pos && got[pos] == b[pos]^0x04, nil
	})
	for _, a := range acks {
		if a.loc.Extent == first.ID {
			readAll(a)
		}
	}
	if !slices.ContainsFunc(strings.Split(master.output(), "\n"), func(l string) bool { return strings.Contains(l, "stream tasks done") }) {
		t.Log("note: the master did not log a task run (repair may have come from the inventory sync)")
	}
}

// TestStreamCodingProcesses runs 10 `tabula server` processes, appends to a
// stream whose policy is LRC(12,2,2), seals its extent, waits for the master
// to have it coded into 16 fragments (and the 3 replicas deleted), then
// kill -9s fragment holders until 3 fragments are gone: every acknowledged
// byte still reads back, by reconstruction.
func TestStreamCodingProcesses(t *testing.T) {
	dir := t.TempDir()
	masterAddr := freeAddr(t)
	master := start(t, "master", append([]string{"master", "--listen", masterAddr, "--data", filepath.Join(dir, "master")}, fastTiming...)...)
	master.waitOutput("master serving", 15*time.Second)
	const n = 10
	servers := make([]*proc, n)
	for i := range n {
		servers[i] = start(t, fmt.Sprintf("server-%d", i), "server", "--master", masterAddr,
			"--data", filepath.Join(dir, fmt.Sprintf("server-%d", i)), "--fault-domain", fmt.Sprintf("fd-%d", i))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := client.New(ctx, client.Options{Credential: testCred, Masters: []string{masterAddr}, RetryTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	nodeOf := map[string]int{}
	waitFor(t, 30*time.Second, "10 extent nodes", func() (bool, error) {
		nodes, err := c.Streams().Nodes(ctx)
		if err != nil {
			return false, err
		}
		alive := 0
		for _, nd := range nodes {
			if nd.Alive {
				alive++
			}
			var k int
			if _, err := fmt.Sscanf(nd.FaultDomain, "fd-%d", &k); err == nil {
				nodeOf[nd.ID] = k
			}
		}
		return alive == n, nil
	})
	mustCLI(t, masterAddr, "stream", "create", "coded", "--code", stream.CodeLRC12)
	sc := stream.NewClient(c.Streams(), stream.ClientOptions{Conns: c.StreamConns()})
	defer sc.Close()
	type acked struct {
		data []byte
		loc  stream.Location
	}
	var acks []acked
	for i := range 300 {
		data := []byte(fmt.Sprintf("record-%04d-%s", i, strings.Repeat(string(rune('a'+i%26)), 1000)))
		res, err := sc.Append(ctx, "coded", data)
		if err != nil {
			t.Fatal(err)
		}
		acks = append(acks, acked{data, res.Location})
	}
	info, err := c.Streams().Stream(ctx, "coded")
	if err != nil {
		t.Fatal(err)
	}
	ext := info.Last().ID
	if _, err := c.Streams().SealAndAllocate(ctx, "coded", info.Epoch, ext); err != nil {
		t.Fatalf("seal: %v", err)
	}
	var p stream.ExtentPlacement
	waitFor(t, 60*time.Second, "the sealed extent to be coded and its replicas deleted", func() (bool, error) {
		var err error
		p, err = c.Streams().Extent(ctx, ext)
		return err == nil && p.Coding != nil && p.Coding.Coded && len(p.Replicas) == 0, err
	})
	out := mustCLI(t, masterAddr, "extent", "stat", fmt.Sprint(ext))
	if !strings.Contains(out, "16 fragments in 10 fault domains") {
		t.Fatalf("extent stat of a coded extent:\n%s", out)
	}
	// Kill holders until exactly 3 fragments are gone: a node with 2 and
	// one with 1 (16 fragments on 10 nodes).
	held := map[string][]int{}
	for _, f := range p.Coding.Fragments {
		held[f.Node] = append(held[f.Node], f.Index)
	}
	var two, one string
	for node, idx := range held {
		switch {
		case len(idx) == 2 && two == "":
			two = node
		case len(idx) == 1 && one == "":
			one = node
		}
	}
	if two == "" || one == "" {
		t.Fatalf("fragment spread %v: want nodes holding 2 and 1", held)
	}
	servers[nodeOf[two]].kill()
	servers[nodeOf[one]].kill()
	t.Logf("killed %s (fragments %v) and %s (fragment %v)", two, held[two], one, held[one])
	for _, a := range acks {
		if a.loc.Extent != ext {
			continue
		}
		blocks, err := sc.Read(ctx, a.loc)
		if err != nil {
			t.Fatalf("read extent %d at %d with 3 fragments gone: %v", ext, a.loc.Offset, err)
		}
		if len(blocks) != 1 || !bytes.Equal(blocks[0], a.data) {
			t.Fatalf("extent %d at %d reads %d blocks, not what was acknowledged", ext, a.loc.Offset, len(blocks))
		}
	}
	t.Logf("all %d records read back with 3 of 16 fragments gone (%d reconstruction reads)", len(acks), sc.Reconstructions())
}

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/tabuladb/tabula/replication/stream"
)

func init() {
	register(suite{
		name:  "stream",
		about: "stream layer (replication/stream): replicated append (3 nodes, fsync, loopback) vs 1 node; coded-extent reads, direct vs reconstruction",
		run:   runStream,
	})
}

// streamCluster is extent nodes on loopback gRPC with real disks, a
// manager (LocalLog + Driver) and a client.
type streamCluster struct {
	nodes  []*streamNode
	driver *stream.Driver
	client *stream.Client
}

type streamNode struct {
	id   string
	node *stream.Node
	srv  *grpc.Server
	done chan struct{}
}

func startStreamCluster(dir string, n, replicas int, copts stream.ClientOptions) (*streamCluster, error) {
	log := stream.NewLocalLog(stream.NewManager(stream.ManagerOptions{Replicas: replicas}))
	c := &streamCluster{driver: stream.NewDriver(log, stream.DriverOptions{})}
	for i := range n {
		id := fmt.Sprintf("en-%d", i)
		node, err := stream.OpenNode(stream.NodeOptions{Dir: filepath.Join(dir, id)})
		if err != nil {
			return nil, errors.Join(err, c.close())
		}
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, errors.Join(err, node.Close(), c.close())
		}
		sn := &streamNode{id: id, node: node, srv: grpc.NewServer(stream.ServerOptions()...), done: make(chan struct{})}
		node.Register(sn.srv)
		go func() {
			defer close(sn.done)
			_ = sn.srv.Serve(lis)
		}()
		c.nodes = append(c.nodes, sn)
		if _, err := c.driver.Apply(context.Background(), stream.Command{Op: stream.OpAddNode, Node: id, Addr: lis.Addr().String(), FaultDomain: "fd-" + id}); err != nil {
			return nil, errors.Join(err, c.close())
		}
	}
	c.client = stream.NewClient(c.driver, copts)
	return c, nil
}

// stop kills node id's server (connections drop) and closes the node.
func (c *streamCluster) stop(id string) error {
	for _, n := range c.nodes {
		if n.id == id && n.srv != nil {
			n.srv.Stop()
			<-n.done
			n.srv = nil
			return n.node.Close()
		}
	}
	return nil
}

func (c *streamCluster) close() error {
	var err error
	if c.client != nil {
		err = c.client.Close()
	}
	for _, n := range c.nodes {
		err = errors.Join(err, c.stop(n.id))
	}
	return errors.Join(err, c.driver.Close())
}

// appendStats is one timed append run.
type appendStats struct {
	ops      int
	bytes    int64
	elapsed  time.Duration
	lat      []time.Duration
	p50, p99 float64 // ms
}

// runAppends has writers goroutines append size-byte entries to a new
// stream through one client (which batches them) until dur has passed.
func runAppends(c *streamCluster, name string, size, writers int, dur time.Duration, seed uint64) (appendStats, error) {
	ctx := context.Background()
	if _, err := c.driver.Apply(ctx, stream.Command{Op: stream.OpCreateStream, Stream: name}); err != nil {
		return appendStats{}, err
	}
	payload := make([]byte, size)
	rng := rand.New(rand.NewPCG(seed, 0))
	for i := range payload {
		payload[i] = byte(rng.Uint32())
	}
	// One untimed append opens the writer and its first extent.
	if _, err := c.client.Append(ctx, name, payload); err != nil {
		return appendStats{}, err
	}
	var (
		mu   sync.Mutex
		st   appendStats
		errs []error
		wg   sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(dur)
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lat []time.Duration
			for time.Now().Before(deadline) {
				t0 := time.Now()
				if _, err := c.client.Append(ctx, name, payload); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				lat = append(lat, time.Since(t0))
			}
			mu.Lock()
			st.lat = append(st.lat, lat...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	st.elapsed = time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return st, err
	}
	st.ops = len(st.lat)
	st.bytes = int64(st.ops) * int64(size)
	st.p50 = percentile(st.lat, 0.50) / 1e6
	st.p99 = percentile(st.lat, 0.99) / 1e6
	return st, nil
}

func runStream(out io.Writer, args []string) error {
	fs := flag.NewFlagSet("stream", flag.ContinueOnError)
	dirFlag := fs.String("dir", "", "directory for the nodes' stores (default: a new temp dir, removed after)")
	dur := fs.Duration("duration", 1500*time.Millisecond, "length of each timed append run")
	rounds := fs.Int("rounds", 2, "rounds per workload, contender order reversed every other round")
	writers := fs.Int("writers", 8, "concurrent writers of the N-writer runs")
	reads := fs.Int("reads", 400, "reads per coded-read measurement")
	seed := fs.Uint64("seed", rand.Uint64(), "random seed")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dir := *dirFlag
	if dir == "" {
		d, err := os.MkdirTemp("", "tabula-bench-stream-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	fmt.Fprintf(out, "# stream: replicated = 3 extent nodes (each fsyncs), local = 1 node; loopback gRPC, real disk under %s, one client per cluster; GOMAXPROCS %d, %v per run, %d rounds, seed %d (rerun with -seed %d)\n",
		dir, runtime.GOMAXPROCS(0), *dur, *rounds, *seed, *seed)
	rep, err := startStreamCluster(filepath.Join(dir, "replicated"), 3, 3, stream.ClientOptions{})
	if err != nil {
		return err
	}
	defer rep.close()
	loc, err := startStreamCluster(filepath.Join(dir, "local"), 1, 1, stream.ClientOptions{})
	if err != nil {
		return err
	}
	defer loc.close()

	type workload struct {
		name          string
		size, writers int
	}
	wls := []workload{
		{"append4k_1w", 4 << 10, 1},
		{fmt.Sprintf("append4k_%dw", *writers), 4 << 10, *writers},
		{"append1m_1w", 1 << 20, 1},
		{fmt.Sprintf("append1m_%dw", *writers), 1 << 20, *writers},
	}
	run := 0
	for _, wl := range wls {
		var rs, ls []appendStats
		for r := range *rounds {
			order := []string{"replicated", "local"}
			if r%2 == 1 {
				order = []string{"local", "replicated"}
			}
			for _, who := range order {
				c := rep
				if who == "local" {
					c = loc
				}
				run++
				st, err := runAppends(c, fmt.Sprintf("%s-%d", wl.name, run), wl.size, wl.writers, *dur, *seed+uint64(run))
				if err != nil {
					return fmt.Errorf("%s %s: %w", who, wl.name, err)
				}
				if who == "local" {
					ls = append(ls, st)
				} else {
					rs = append(rs, st)
				}
			}
		}
		summary := func(who string, sts []appendStats) (opsPerS, mbPerS, p50, p99 float64) {
			var ops, p50s, p99s, mbs []float64
			for _, st := range sts {
				ops = append(ops, float64(st.ops)/st.elapsed.Seconds())
				mbs = append(mbs, float64(st.bytes)/st.elapsed.Seconds()/1e6)
				p50s = append(p50s, st.p50)
				p99s = append(p99s, st.p99)
			}
			opsPerS, mbPerS, p50, p99 = medianF(ops), medianF(mbs), medianF(p50s), medianF(p99s)
			fmt.Fprintf(out, "raw %s %s median %.0f appends/s %.1f MB/s p50 %.3f ms p99 %.3f ms\n", who, wl.name, opsPerS, mbPerS, p50, p99)
			return
		}
		rOps, rMB, rP50, rP99 := summary("replicated", rs)
		lOps, _, lP50, lP99 := summary("local", ls)
		fmt.Fprintf(out, "figure stream-replicated-%s-throughput %.0f appends/s\n", wl.name, rOps)
		fmt.Fprintf(out, "figure stream-replicated-%s-throughput %.1f MB/s\n", wl.name, rMB)
		fmt.Fprintf(out, "figure stream-replicated-%s-p50 %.3f ms\n", wl.name, rP50)
		fmt.Fprintf(out, "figure stream-replicated-%s-p99 %.3f ms\n", wl.name, rP99)
		fmt.Fprintf(out, "ratio replicated/local %s_throughput(appends/s) %.2f\n", wl.name, rOps/lOps)
		fmt.Fprintf(out, "ratio replicated/local %s_p50(local-time÷replicated-time) %.2f\n", wl.name, lP50/rP50)
		fmt.Fprintf(out, "ratio replicated/local %s_p99(local-time÷replicated-time) %.2f\n", wl.name, lP99/rP99)
	}
	return codedReads(out, filepath.Join(dir, "coded"), *reads, *seed)
}

// codedReads writes 4 KiB entries to a coded stream on 8 nodes, codes the
// sealed extent, and times reads of single entries: from a replicated
// extent, from the coded extent directly (one fragment), and with the
// fragment's node stopped (a reconstruction read: the fragment's local
// group, 6 fragments, fetched and decoded).
func codedReads(out io.Writer, dir string, reads int, seed uint64) error {
	ctx := context.Background()
	c, err := startStreamCluster(dir, 8, 3, stream.ClientOptions{})
	if err != nil {
		return err
	}
	defer c.close()
	for _, s := range []struct{ name, code string }{{"plain", ""}, {"coded", stream.CodeLRC12}} {
		if _, err := c.driver.Apply(ctx, stream.Command{Op: stream.OpCreateStream, Stream: s.name, Code: s.code}); err != nil {
			return err
		}
	}
	rng := rand.New(rand.NewPCG(seed, 7))
	payload := make([]byte, 4<<10)
	for i := range payload {
		payload[i] = byte(rng.Uint32())
	}
	const entries = 2048 // 8 MiB: 12 data fragments of ~700 KiB
	locs := map[string][]stream.Location{}
	for _, name := range []string{"plain", "coded"} {
		for range entries {
			res, err := c.client.Append(ctx, name, payload)
			if err != nil {
				return err
			}
			locs[name] = append(locs[name], res.Location)
		}
		if _, err := c.driver.Seal(ctx, locs[name][0].Extent); err != nil {
			return err
		}
	}
	t0 := time.Now()
	for range 2 { // code, then delete the replicas
		if _, err := c.driver.RunTasks(ctx); err != nil {
			return err
		}
	}
	codeTime := time.Since(t0)
	p, err := c.driver.Extent(ctx, locs["coded"][0].Extent)
	if err != nil {
		return err
	}
	if p.Coding == nil || !p.Coding.Coded {
		return errors.New("coded extent not coded after RunTasks")
	}
	fmt.Fprintf(out, "# coded read: %d x 4 KiB entries per stream, 8 nodes in 8 fault domains (%s), fragment size %d bytes, %d reads each\n",
		entries, p.Coding.Spread(), p.Coding.FragmentSize, reads)
	fmt.Fprintf(out, "figure stream-code-extent-8mib %.1f ms\n", float64(codeTime)/1e6)
	// Entries held by data fragment 0.
	var inFrag0 []stream.Location
	for _, l := range locs["coded"] {
		if l.Offset+l.Length <= p.Coding.Boundaries[1] {
			inFrag0 = append(inFrag0, l)
		}
	}
	time1 := func(name string, ls []stream.Location) ([]time.Duration, error) {
		var lat []time.Duration
		for range reads {
			l := ls[rng.IntN(len(ls))]
			t0 := time.Now()
			b, err := c.client.Read(ctx, l)
			if err != nil {
				return nil, fmt.Errorf("%s read: %w", name, err)
			}
			lat = append(lat, time.Since(t0))
			if len(b) != 1 || len(b[0]) != len(payload) {
				return nil, fmt.Errorf("%s read returned %d blocks", name, len(b))
			}
		}
		return lat, nil
	}
	plain, err := time1("replicated", locs["plain"])
	if err != nil {
		return err
	}
	direct, err := time1("coded", inFrag0)
	if err != nil {
		return err
	}
	before := c.client.Reconstructions()
	if err := c.stop(p.Coding.Fragments[0].Node); err != nil {
		return err
	}
	recon, err := time1("reconstruction", inFrag0)
	if err != nil {
		return err
	}
	if n := c.client.Reconstructions() - before; n != int64(reads) {
		return fmt.Errorf("%d of %d reads were reconstructions", n, reads)
	}
	pr := func(name string, lat []time.Duration) (float64, float64) {
		p50, p99 := percentile(lat, 0.5)/1e6, percentile(lat, 0.99)/1e6
		fmt.Fprintf(out, "figure stream-read4k-%s-p50 %.3f ms\n", name, p50)
		fmt.Fprintf(out, "figure stream-read4k-%s-p99 %.3f ms\n", name, p99)
		return p50, p99
	}
	pp50, _ := pr("replicated", plain)
	dp50, _ := pr("coded-direct", direct)
	rp50, _ := pr("coded-reconstruction", recon)
	fmt.Fprintf(out, "ratio coded/replicated read4k_p50(replicated-time÷coded-time) %.2f\n", pp50/dp50)
	fmt.Fprintf(out, "ratio reconstruction/direct read4k_p50(direct-time÷reconstruction-time) %.2f\n", dp50/rp50)
	return nil
}

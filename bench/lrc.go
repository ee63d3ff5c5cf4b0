package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"time"

	"github.com/klauspost/reedsolomon"

	"github.com/tabuladb/tabula/replication/lrc"
)

func init() {
	register(suite{
		name:  "lrc",
		about: "LRC(12,2,2) codec (replication/lrc) vs RS(12,4) from klauspost/reedsolomon: encode, one-fragment repair",
		run:   runLRC,
	})
}

// lrcContender is one side of a workload: op runs it once.
type lrcContender struct {
	name string
	op   func(i int) error
}

// timeOps runs op iters times and returns the time per op.
func timeOps(c lrcContender, iters int) (time.Duration, error) {
	t0 := time.Now()
	for i := range iters {
		if err := c.op(i); err != nil {
			return 0, fmt.Errorf("%s: %w", c.name, err)
		}
	}
	return time.Since(t0) / time.Duration(iters), nil
}

// abab times a then b (b then a in odd rounds) for rounds rounds and
// returns each one's per-op times.
func abab(a, b lrcContender, rounds, iters int) (ta, tb []float64, err error) {
	for r := range rounds {
		order := []lrcContender{a, b}
		if r%2 == 1 {
			order = []lrcContender{b, a}
		}
		for _, c := range order {
			c.op(0) // warm: plan and inversion caches, page faults
			d, err := timeOps(c, iters)
			if err != nil {
				return nil, nil, err
			}
			if c.name == a.name {
				ta = append(ta, float64(d))
			} else {
				tb = append(tb, float64(d))
			}
		}
	}
	return ta, tb, nil
}

func runLRC(out io.Writer, args []string) error {
	fs := flag.NewFlagSet("lrc", flag.ContinueOnError)
	var (
		shardSize   = fs.Int("shard", 1<<20, "bytes per fragment")
		rounds      = fs.Int("rounds", 7, "rounds; LRC and RS alternate within each (ABAB)")
		encIters    = fs.Int("encode-iters", 20, "encodes per contender per round")
		repairIters = fs.Int("repair-iters", 60, "repairs per contender per round")
		seedArg     = fs.Uint64("seed", 0, "seed (0: random)")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	seed := *seedArg
	if seed == 0 {
		seed = rand.Uint64()
	}
	const k, m = 12, 4
	size := *shardSize
	fmt.Fprintf(out, "# lrc: LRC(12,2,2) (replication/lrc) vs RS(12,4) (klauspost/reedsolomon v1.14.2, default Vandermonde matrix, default options for both), %d-byte fragments, GOMAXPROCS %d, %d rounds, seed %d (rerun with -seed %d)\n",
		size, runtime.GOMAXPROCS(0), *rounds, seed, seed)
	rng := rand.New(rand.NewPCG(seed, 2))

	code, err := lrc.New(lrc.Options{})
	if err != nil {
		return err
	}
	rs, err := reedsolomon.New(k, m)
	if err != nil {
		return err
	}
	// Both stripes hold the same 12 data fragments.
	data := make([][]byte, k)
	for i := range data {
		data[i] = make([]byte, size)
		for j := range data[i] {
			data[i][j] = byte(rng.Uint32())
		}
	}
	newStripe := func() [][]byte {
		s := make([][]byte, k+m)
		for i := range s {
			s[i] = make([]byte, size)
			if i < k {
				copy(s[i], data[i])
			}
		}
		return s
	}
	ls, rss := newStripe(), newStripe()

	// Encode: data bytes per second.
	encL := lrcContender{"lrc", func(int) error { return code.Encode(ls) }}
	encR := lrcContender{"rs", func(int) error { return rs.Encode(rss) }}
	tl, tr, err := abab(encL, encR, *rounds, *encIters)
	if err != nil {
		return err
	}
	gbps := func(ns float64) float64 { return float64(k*size) / ns } // bytes/ns = GB/s
	lg, rg := gbps(median(tl)), gbps(median(tr))
	fmt.Fprintf(out, "raw lrc encode-GB/s median %.2f GB/s\n", lg)
	fmt.Fprintf(out, "raw rs encode-GB/s median %.2f GB/s\n", rg)
	fmt.Fprintf(out, "ratio lrc/rs encode-GB/s %.2f\n", lg/rg)
	if ok, err := code.Verify(ls); !ok || err != nil {
		return fmt.Errorf("lrc stripe does not verify: %v", err)
	}

	// Repair of one lost data fragment, rotating over the 12. Each side
	// holds only what it would fetch: LRC the RepairPlan (its local group),
	// RS the first 12 surviving fragments (what its Reconstruct reads).
	// Both rebuild just the lost fragment into a reused buffer.
	lrcRead := make([][]int, k)
	var lrcFrags int
	for d := range k {
		if lrcRead[d], err = code.RepairPlan([]int{d}, nil); err != nil {
			return err
		}
		lrcFrags = max(lrcFrags, len(lrcRead[d]))
	}
	rsRead := func(d int) []int {
		var r []int
		for i := 0; len(r) < k; i++ {
			if i != d {
				r = append(r, i)
			}
		}
		return r
	}
	lrcHave := make([][][]byte, k)
	rsHave := make([][][]byte, k)
	lrcReq := make([][]bool, k)
	rsReq := make([][]bool, k)
	for d := range k {
		lrcHave[d] = make([][]byte, k+m)
		for _, i := range lrcRead[d] {
			lrcHave[d][i] = ls[i]
		}
		lrcHave[d][d] = make([]byte, 0, size)
		lrcReq[d] = make([]bool, k+m)
		lrcReq[d][d] = true
		rsHave[d] = make([][]byte, k+m)
		for _, i := range rsRead(d) {
			rsHave[d][i] = rss[i]
		}
		rsHave[d][d] = make([]byte, 0, size)
		rsReq[d] = make([]bool, k)
		rsReq[d][d] = true
	}
	repL := lrcContender{"lrc", func(i int) error {
		d := i % k
		lrcHave[d][d] = lrcHave[d][d][:0]
		return code.ReconstructSome(lrcHave[d], lrcReq[d])
	}}
	repR := lrcContender{"rs", func(i int) error {
		d := i % k
		rsHave[d][d] = rsHave[d][d][:0]
		return rs.ReconstructSome(rsHave[d], rsReq[d])
	}}
	tl, tr, err = abab(repL, repR, *rounds, *repairIters)
	if err != nil {
		return err
	}
	for d := range k {
		if !bytes.Equal(lrcHave[d][d], data[d]) || !bytes.Equal(rsHave[d][d], data[d]) {
			return fmt.Errorf("repair of fragment %d rebuilt wrong bytes", d)
		}
	}
	fmt.Fprintf(out, "raw lrc repair-one-data-fragment median %.3f ms\n", median(tl)/1e6)
	fmt.Fprintf(out, "raw rs repair-one-data-fragment median %.3f ms\n", median(tr)/1e6)
	fmt.Fprintf(out, "ratio lrc/rs repair-one-data-fragment-speedup(rs-time÷lrc-time) %.2f\n", median(tr)/median(tl))
	fmt.Fprintf(out, "figure lrc-repair-fragments-read %d fragments\n", lrcFrags)
	fmt.Fprintf(out, "figure rs-repair-fragments-read %d fragments\n", k)
	fmt.Fprintf(out, "figure lrc-repair-bytes-read %d bytes\n", lrcFrags*size)
	fmt.Fprintf(out, "figure rs-repair-bytes-read %d bytes\n", k*size)
	fmt.Fprintf(out, "ratio lrc/rs repair-fragments-read(rs÷lrc) %.2f\n", float64(k)/float64(lrcFrags))

	// Loss tolerance, by the paper's check (the decoder agrees on every
	// pattern: replication/lrc TestMaximallyRecoverable).
	n := code.TotalShards()
	for losses := 3; losses <= 4; losses++ {
		dec, total := 0, 0
		forEachCombination(n, losses, func(lost []int) {
			total++
			if code.Decodable(lost) {
				dec++
			}
		})
		fmt.Fprintf(out, "figure lrc-%d-loss-decodable %.2f %% (%d/%d)\n", losses, 100*float64(dec)/float64(total), dec, total)
	}
	fmt.Fprintf(out, "figure lrc-storage-overhead %.3f x (rs(12,4) %.3f x)\n", float64(n)/float64(k), float64(k+m)/float64(k))
	return nil
}

// forEachCombination calls f with every m-subset of {0..n-1}.
func forEachCombination(n, m int, f func([]int)) {
	s := make([]int, m)
	var rec func(start, depth int)
	rec = func(start, depth int) {
		if depth == m {
			f(s)
			return
		}
		for i := start; i <= n-(m-depth); i++ {
			s[depth] = i
			rec(i+1, depth+1)
		}
	}
	rec(0, 0)
}

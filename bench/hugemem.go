package main

import (
	"bufio"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// hugeCopy returns a copy of b in anonymous memory advised MADV_HUGEPAGE
// (never freed: the benchmark process ends soon after).
func hugeCopy(b []byte) []byte {
	m, err := syscall.Mmap(-1, 0, len(b), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return b
	}
	_ = syscall.Madvise(m, syscall.MADV_HUGEPAGE)
	copy(m, b)
	return m
}

// hugeMappedPct is the share of this process's mappings of path that the
// kernel maps with huge pages (FilePmdMapped ÷ Rss in /proc/self/smaps);
// -1 if it cannot tell.
func hugeMappedPct(path string) float64 {
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return -1
	}
	defer f.Close()
	var rss, pmd float64
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) == 0 {
			continue
		}
		if !strings.HasSuffix(fs[0], ":") { // a mapping's header line
			in = fs[len(fs)-1] == path
			continue
		}
		if !in || len(fs) < 2 {
			continue
		}
		v, _ := strconv.ParseFloat(fs[1], 64)
		switch fs[0] {
		case "Rss:":
			rss += v
		case "FilePmdMapped:":
			pmd += v
		}
	}
	if rss == 0 {
		return -1
	}
	return 100 * pmd / rss
}

// memLatency measures one dependent random 8-byte read in n bytes of
// huge-page memory: the median over 3 runs of 1M reads.
func memLatency(n int) float64 {
	m, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return -1
	}
	defer syscall.Munmap(m)
	_ = syscall.Madvise(m, syscall.MADV_HUGEPAGE)
	for i := 0; i < n; i += 4096 {
		m[i] = 1
	}
	rng := rand.New(rand.NewPCG(5, 6))
	idx := make([]uint32, 1<<20)
	for i := range idx {
		idx[i] = uint32(rng.IntN(n / 64))
	}
	var rs []float64
	for range 3 {
		acc := 0
		t := time.Now()
		for _, i := range idx {
			acc += int(m[(int(i)*64+acc&1)%n]) // each address depends on the last read
		}
		rs = append(rs, float64(time.Since(t).Nanoseconds())/float64(len(idx)))
		sinkInt += acc
	}
	return medianF(rs)
}

var sinkInt int

package lrc

import (
	"math/rand/v2"
	"testing"
)

// Side-by-side numbers against RS(12,4) are in bench/ (go run . lrc).

func BenchmarkEncode(b *testing.B) {
	c := mustNew(b, Options{})
	s := stripe(b, c, rand.New(rand.NewPCG(1, 1)), 1<<20)
	b.SetBytes(12 << 20)
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Encode(s); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRepairLocal rebuilds one data fragment from its local group.
func BenchmarkRepairLocal(b *testing.B) {
	c := mustNew(b, Options{})
	orig := stripe(b, c, rand.New(rand.NewPCG(1, 1)), 1<<20)
	read, err := c.RepairPlan([]int{3}, nil)
	if err != nil {
		b.Fatal(err)
	}
	s := make([][]byte, c.n)
	for _, i := range read {
		s[i] = orig[i]
	}
	buf := make([]byte, 0, 1<<20)
	req := boolsOf(c.n, 3)
	b.SetBytes(1 << 20)
	b.ReportAllocs()
	for b.Loop() {
		s[3] = buf
		if err := c.ReconstructSome(s, req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkBuildPlan is the cost of a plan-cache miss: elimination plus
// the reedsolomon encoder for the decode matrix.
func BenchmarkBuildPlan(b *testing.B) {
	c := mustNew(b, Options{})
	for _, tc := range []struct {
		name string
		lost []int
	}{{"local", []int{3}}, {"2+2", []int{0, 1, 6, 7}}} {
		var m bitset
		for _, i := range tc.lost {
			m.set(i)
		}
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.buildPlan(m, m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

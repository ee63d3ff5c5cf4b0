package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tabuladb/tabula/beambuild"
	"github.com/tabuladb/tabula/engines/bulk"
)

// runCompare builds --records generated records with the native builder
// and with the pipeline on the direct runner, checks the files are the
// same and prints each one's records/s.
func runCompare(ctx context.Context) error {
	np := *partitions
	if np == 0 {
		np = 8
	}
	dir, err := os.MkdirTemp("", "tabula-beam-compare-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	in := filepath.Join(dir, "input.tsv")
	if err := writeRecords(in, *records, *valueBytes); err != nil {
		return err
	}
	o, err := options()
	if err != nil {
		return err
	}
	o.Build.Partitions = np
	o.Runner = "direct"
	o.Build.MemoryBudget = *memory // the native builder's only
	nativeDir, beamDir := filepath.Join(dir, "native"), filepath.Join(dir, "beam")

	// Alternate the builders, each round into fresh directories, and keep
	// each one's best time (the machine may be shared).
	var native, beamTook time.Duration
	for r := range max(1, *rounds) {
		for _, d := range []string{nativeDir, beamDir} {
			if err := os.RemoveAll(d); err != nil {
				return err
			}
		}
		start := time.Now()
		if _, err := bulk.BuildTable(ctx, []string{in}, nativeDir, o.Build); err != nil {
			return fmt.Errorf("native build: %w", err)
		}
		nt := time.Since(start)
		start = time.Now()
		if err := beambuild.Build(ctx, []string{in}, beamDir, o); err != nil {
			return fmt.Errorf("beam build: %w", err)
		}
		bt := time.Since(start)
		fmt.Printf("round %d: native %v, beam %v\n", r+1, nt.Round(time.Millisecond), bt.Round(time.Millisecond))
		if r == 0 || nt < native {
			native = nt
		}
		if r == 0 || bt < beamTook {
			beamTook = bt
		}
	}
	for i := range np {
		name := bulk.PartitionFileName(i, np)
		a, err := os.ReadFile(filepath.Join(nativeDir, name))
		if err != nil {
			return err
		}
		b, err := os.ReadFile(filepath.Join(beamDir, name))
		if err != nil {
			return err
		}
		if !bytes.Equal(a, b) {
			return fmt.Errorf("%s differs: native %d bytes, beam %d bytes", name, len(a), len(b))
		}
	}
	n := float64(*records)
	fmt.Printf("%d records (%d-byte values), %d partitions: files identical\n", *records, *valueBytes, np)
	fmt.Printf("native builder (best):      %8v  %12.0f records/s\n", native.Round(time.Millisecond), n/native.Seconds())
	fmt.Printf("beam, direct runner (best): %8v  %12.0f records/s  (%.2f× native; target ≥ 0.3)\n",
		beamTook.Round(time.Millisecond), n/beamTook.Seconds(), native.Seconds()/beamTook.Seconds())
	return nil
}

// writeRecords writes n TSV records of distinct keys and valueBytes-byte
// values to path.
func writeRecords(path string, n, valueBytes int) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	pad := strings.Repeat("v", max(0, valueBytes-12))
	for i := range n {
		fmt.Fprintf(w, "key%012d\t%012d%s\n", i, i, pad)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	// Synced, so that its write-back does not slow the first build.
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

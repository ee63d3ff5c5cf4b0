package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/engines/bulk"
)

// errBulkServing is what the bulk commands that need servers say until bulk
// tables are served (issue 4: publish, status, rollback).
var errBulkServing = errors.New("not implemented yet: bulk tables cannot be published or served in this build (tabula bulk build works offline)")

func bulkCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bulk",
		Short: "Build bulk-table versions (publish, status and rollback are not implemented yet)",
	}
	cmd.AddCommand(bulkBuildCmd(g))
	for _, c := range []struct{ use, short string }{
		{"publish", "Publish a built version to the servers (not implemented yet)"},
		{"status TABLE", "Show a bulk table's versions and load progress (not implemented yet)"},
		{"rollback TABLE", "Switch a bulk table back to a retained version (not implemented yet)"},
	} {
		cmd.AddCommand(&cobra.Command{
			Use: c.use, Short: c.short,
			RunE: func(*cobra.Command, []string) error { return errBulkServing },
		})
	}
	return cmd
}

func bulkBuildCmd(g *globals) *cobra.Command {
	var (
		table      string
		inputs     []string
		format     string
		out        string
		opts       bulk.BuildOptions
		lastWins   bool
		noProgress bool
	)
	cmd := &cobra.Command{
		Use:   "build --out DIR --input FILE... (--table T | --partitions N)",
		Short: "Build a bulk table version: one immutable file per partition (MPH index, fingerprints, records)",
		Long: `Build reads records (tsv: key<TAB>value per line; csv: key,value; jsonl:
{"key":...,"value":...}; --base64 when keys and values are base64), routes
each to its partition by xxhash64(key) and writes one file per partition into
--out. The output is deterministic. With --table the partition count is the
table's (asked of the master); offline, give --partitions. With --delta-of N
the input holds changed records and deletions (tsv: a key alone on its line;
jsonl: {"key":...,"delete":true}).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" || len(inputs) == 0 {
				return errors.New("--out and at least one --input are required")
			}
			f, err := bulk.ParseFormat(format)
			if err != nil {
				return err
			}
			opts.Format = f
			opts.Partition.LastWins = lastWins
			if table != "" {
				if opts.Partitions != 0 {
					return errors.New("give --table or --partitions, not both")
				}
				ctx, cancel := g.withTimeout(cmd.Context())
				defer cancel()
				c, err := g.client(ctx)
				if err != nil {
					return err
				}
				defer c.Close()
				d, err := c.DescribeTable(ctx, table)
				if err != nil {
					return fmt.Errorf("table %s: %w", table, err)
				}
				t := d.GetMap().GetTable()
				if t.GetKind() != api.TableKind_TABLE_KIND_BULK {
					return fmt.Errorf("table %s is a %s table; bulk build needs a bulk table", table, t.GetKind())
				}
				opts.Partitions = len(d.GetMap().GetPartitions())
			}
			if opts.Partitions <= 0 || opts.Partitions > api.MaxPartitions {
				return fmt.Errorf("--partitions %d: want 1..%d (or --table)", opts.Partitions, api.MaxPartitions)
			}
			errOut := cmd.ErrOrStderr()
			var bar *progressbar.ProgressBar
			start := time.Now()
			if !noProgress {
				opts.Progress = func(p bulk.Progress) {
					if bar == nil {
						bar = progressbar.NewOptions64(-1, progressbar.OptionSetWriter(errOut),
							progressbar.OptionSetWidth(20), progressbar.OptionThrottle(200*time.Millisecond),
							progressbar.OptionClearOnFinish())
					}
					rate := float64(p.Records) / max(time.Since(start).Seconds(), 1e-3)
					switch p.Phase {
					case "build":
						bar.Describe(fmt.Sprintf("build: %d/%d partitions, %d records", p.PartitionsDone, p.Partitions, p.Records))
					default:
						bar.Describe(fmt.Sprintf("read: %d records, %.1f MB, %.0f records/s", p.Records, float64(p.Bytes)/1e6, rate))
					}
					_ = bar.Set64(p.Records)
				}
			}
			infos, err := bulk.BuildTable(cmd.Context(), inputs, out, opts)
			if bar != nil {
				_ = bar.Finish()
			}
			if err != nil {
				return err
			}
			var records, bytes, index int64
			for _, in := range infos {
				records += int64(in.Records)
				bytes += in.FileBytes
				index += in.IndexBytes
			}
			w := cmd.OutOrStdout()
			took := time.Since(start)
			fmt.Fprintf(w, "built %d partitions in %s: %d records, %.1f MB of files, %.2f bytes of memory per record, %v (%.0f records/s)\n",
				len(infos), out, records, float64(bytes)/1e6, float64(index)/float64(max(records, 1)), took.Round(time.Millisecond), float64(records)/took.Seconds())
			for _, in := range infos {
				fmt.Fprintf(w, "  %s  %d records  %d bytes  crc32c %08x\n", in.Path, in.Records, in.FileBytes, in.CRC)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&table, "table", "", "bulk table whose partition count to build for (asks the master)")
	fl.IntVar(&opts.Partitions, "partitions", 0, "partition count (offline builds)")
	fl.StringSliceVar(&inputs, "input", nil, "input file(s), repeatable or comma-separated")
	fl.StringVar(&format, "format", "tsv", "input format: tsv, csv or jsonl")
	fl.BoolVar(&opts.Base64, "base64", false, "keys and values in the input are base64")
	fl.StringVar(&out, "out", "", "output directory")
	fl.Uint64Var(&opts.Version, "version", 0, "version number written into the files")
	fl.Uint64Var(&opts.DeltaOf, "delta-of", 0, "build a delta over this version (changed and deleted keys)")
	fl.BoolVar(&lastWins, "last-wins", false, "accept duplicate keys: the last in input order wins")
	fl.Int64Var(&opts.MemoryBudget, "memory", 0, "memory budget in bytes for input held while building (default 1 GiB; beyond it, input spills to disk)")
	fl.BoolVar(&noProgress, "no-progress", false, "do not show the progress bar")
	return cmd
}

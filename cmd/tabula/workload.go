package main

import (
	"fmt"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/tabuladb/tabula/internal/workload"
)

func workloadCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "workload", Short: "Drive a load against a table and measure it"}
	cmd.AddCommand(workloadKVCmd(g))
	return cmd
}

func workloadKVCmd(g *globals) *cobra.Command {
	var (
		table string
		opts  workload.Options
	)
	cmd := &cobra.Command{
		Use:   "kv",
		Short: "Random Gets and Puts over a key range; prints ops/s and p50/p99/p99.9 latency",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if table == "" {
				return fmt.Errorf("--table is required")
			}
			opts.NoReads = opts.ReadPercent == 0
			if err := opts.Validate(); err != nil {
				return err
			}
			ctx := cmd.Context()
			c, err := g.client(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			t := c.Table(table)
			if _, err := t.Map(ctx); err != nil {
				return fmt.Errorf("table %s: %w", table, err)
			}
			errOut := cmd.ErrOrStderr()
			fmt.Fprintf(errOut, "workload kv: table %s, %d workers, %d%% reads, %d-byte values, %d keys, %v\n",
				table, opts.Concurrency, opts.ReadPercent, opts.ValueSize, opts.Keys, opts.Duration)
			var bar *progressbar.ProgressBar
			progress := func(p workload.Progress) {
				if bar == nil {
					max := int64(p.Of)
					if p.Phase == "run" {
						max = int64(p.Total / time.Second)
					}
					bar = progressbar.NewOptions64(max, progressbar.OptionSetWriter(errOut),
						progressbar.OptionSetWidth(20), progressbar.OptionSetPredictTime(false),
						progressbar.OptionThrottle(200*time.Millisecond), progressbar.OptionClearOnFinish())
				}
				if p.Phase == "preload" {
					bar.Describe(fmt.Sprintf("preload %d/%d keys, %.0f keys/s", p.Done, p.Of, p.Rate))
					_ = bar.Set64(int64(p.Done))
					return
				}
				_ = bar.Set64(int64(p.Elapsed / time.Second))
				bar.Describe(fmt.Sprintf("run %v/%v  %d ops  %.0f ops/s  %d errors", p.Elapsed.Round(time.Second), p.Total, p.Done, p.Rate, p.Errors))
			}
			phase := ""
			res, err := workload.Run(ctx, t, opts, func(p workload.Progress) {
				if p.Phase != phase && bar != nil {
					_ = bar.Finish()
					bar = nil
				}
				phase = p.Phase
				progress(p)
			})
			if bar != nil {
				_ = bar.Finish()
			}
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "ops/s    %.0f\n", res.OpsPerSec)
			fmt.Fprintf(out, "ops      %d in %v (reads %d, writes %d, misses %d, errors %d)\n", res.Ops, res.Elapsed.Round(time.Millisecond), res.Reads, res.Writes, res.Misses, res.Errors)
			fmt.Fprintf(out, "latency  p50 %v  p99 %v  p99.9 %v  max %v\n", res.P50, res.P99, res.P999, res.Max)
			if res.FirstError != nil {
				fmt.Fprintf(out, "first error: %s\n", describeErr(res.FirstError))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&table, "table", "", "table to load (required; create it first)")
	f.DurationVar(&opts.Duration, "duration", 10*time.Second, "length of the measured phase")
	f.IntVar(&opts.Concurrency, "concurrency", 16, "concurrent workers")
	f.IntVar(&opts.ReadPercent, "read-percent", 90, "share of Gets, 0..100")
	f.IntVar(&opts.ValueSize, "value-size", 100, "bytes per written value")
	f.IntVar(&opts.Keys, "keys", 100000, "distinct keys")
	f.BoolVar(&opts.SkipPreload, "no-preload", false, "do not write every key once before measuring")
	f.Uint64Var(&opts.Seed, "seed", 1, "random seed")
	return cmd
}

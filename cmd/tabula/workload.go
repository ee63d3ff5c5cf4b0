package main

import (
	"fmt"
	"io"
	"os"
	"time"

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
		Long: `Random Gets and Puts over a key range, after writing every key once (unless
--no-preload). A live line shows the calls that succeeded, their rate and the failed
calls with their most common error: rewritten in place on a terminal, one line a
second otherwise. The summary gives ops/s and latency of the calls that succeeded (a
Get of an absent key succeeds, as a miss); failed calls are counted apart, by error,
with their own latency. It exits 1 if any call failed.`,
		Args: cobra.NoArgs,
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
			live := &liveLine{w: errOut, tty: writerIsTerminal(errOut)}
			phase := ""
			res, err := workload.Run(ctx, t, opts, func(p workload.Progress) {
				if p.Phase != phase {
					live.clear()
					phase = p.Phase
				}
				live.show(progressText(p))
			})
			live.clear()
			if err != nil {
				return err
			}
			printResult(cmd.OutOrStdout(), res)
			if res.Errors > 0 {
				return fmt.Errorf("workload kv: %d of %d calls failed (most: %s)", res.Errors, res.Errors+res.Ops, res.ErrorKinds[0].Kind)
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

// progressText is the live line of a progress report.
func progressText(p workload.Progress) string {
	if p.Phase == "preload" {
		return fmt.Sprintf("preload %d/%d keys  %.0f keys/s", p.Done, p.Of, p.Rate)
	}
	line := fmt.Sprintf("run %v/%v  %d ok  %.0f ok/s  %d errors", p.Elapsed.Round(time.Second), p.Total, p.Done, p.Rate, p.Errors)
	if p.Errors > 0 && p.TopError != "" {
		line += fmt.Sprintf(" (most: %s, %d)", p.TopError, p.TopErrorCount)
	}
	return line
}

// printResult prints the measured phase's summary: the successful calls,
// then the failed ones apart.
func printResult(out io.Writer, res workload.Result) {
	fmt.Fprintf(out, "ops/s    %.0f  (calls that succeeded)\n", res.OpsPerSec)
	fmt.Fprintf(out, "ops      %d in %v (reads %d, writes %d, misses %d)\n", res.Ops, res.Elapsed.Round(time.Millisecond), res.Reads, res.Writes, res.Misses)
	if res.Ops > 0 {
		fmt.Fprintf(out, "latency  p50 %v  p99 %v  p99.9 %v  max %v\n", res.P50, res.P99, res.P999, res.Max)
	}
	if res.Errors == 0 {
		fmt.Fprintln(out, "errors   0")
		return
	}
	fmt.Fprintf(out, "errors   %d failed calls, not in the figures above (latency p50 %v, max %v)\n", res.Errors, res.ErrorP50, res.ErrorMax)
	for _, k := range res.ErrorKinds {
		fmt.Fprintf(out, "  %8d  %s\n", k.Count, describeErr(k.Example))
	}
}

// liveLine shows a progress line: on a terminal one line rewritten in
// place; on anything else (a pipe, a file) one plain line per report, so
// a log holds no carriage-return frames.
type liveLine struct {
	w     io.Writer
	tty   bool
	shown bool
}

func (l *liveLine) show(s string) {
	if !l.tty {
		fmt.Fprintln(l.w, s)
		return
	}
	fmt.Fprintf(l.w, "\r%s\x1b[K", s)
	l.shown = true
}

// clear erases a line shown in place.
func (l *liveLine) clear() {
	if l.shown {
		fmt.Fprint(l.w, "\r\x1b[K")
		l.shown = false
	}
}

// writerIsTerminal is isTerminal for a writer that may not be a file.
func writerIsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && isTerminal(f)
}

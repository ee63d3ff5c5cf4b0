package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/engines/bulk"
	_ "github.com/tabuladb/tabula/engines/bulk/parquetinput" // --format parquet
)

func bulkCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bulk",
		Short: "Build, publish and roll back bulk-table versions",
	}
	cmd.AddCommand(bulkBuildCmd(g), bulkPublishCmd(g), bulkStatusCmd(g), bulkRollbackCmd(g), bulkRolloutCmd(g))
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
		runner     string
		beamArgs   []string
	)
	cmd := &cobra.Command{
		Use:   "build --out DIR --input FILE... (--table T | --partitions N)",
		Short: "Build a bulk table version: one immutable file per partition (MPH index, fingerprints, records)",
		Long: `Build reads records (tsv: key<TAB>value per line; csv: key,value; jsonl:
{"key":...,"value":...}; parquet: one record per row, from the columns "key"
and "value"; --base64 when keys and values are base64), routes each to its
partition by xxhash64(key) and writes one file per partition into --out. The
output is deterministic. --key-column and --value-column name the key and the
value (jsonl: fields; parquet: top-level columns of BYTE_ARRAY/STRING,
FIXED_LEN_BYTE_ARRAY or INT32/INT64, integers as decimal text). With --table
the partition count is the table's (asked of the master); offline, give
--partitions. With --delta-of N the input holds changed records and deletions
(tsv: a key alone on its line; jsonl: {"key":...,"delete":true}; parquet: a
null value). A malformed record names its file and line (parquet: row), and
nothing is built.`,
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
					return fmt.Errorf("table %s is a %s table; bulk build needs a bulk table", table, api.KindName(t.GetKind()))
				}
				opts.Partitions = len(d.GetMap().GetPartitions())
				if opts.Version == 0 {
					// The next version: one above every version retained.
					// (A version published and since retired is refused at
					// publish; build again with --version.)
					var last uint64
					for _, v := range d.GetMap().GetBulk().GetVersions() {
						last = max(last, v.GetVersion())
					}
					opts.Version = last + 1
				}
			}
			if opts.Version == 0 {
				opts.Version = 1
			}
			if opts.Partitions <= 0 || opts.Partitions > api.MaxPartitions {
				return fmt.Errorf("--partitions %d: want 1..%d (or --table)", opts.Partitions, api.MaxPartitions)
			}
			if runner != "" {
				return beamBuild(cmd, runner, beamArgs, inputs, out, format, lastWins, opts)
			}
			if len(beamArgs) > 0 {
				return errors.New("--beam-arg applies to a build on Beam: give --runner too")
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
			fmt.Fprintf(w, "built version %d: %d partitions in %s: %d records, %.1f MB of files, %.2f bytes of memory per record, %v (%.0f records/s)\n",
				opts.Version, len(infos), out, records, float64(bytes)/1e6, float64(index)/float64(max(records, 1)), took.Round(time.Millisecond), float64(records)/took.Seconds())
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
	fl.StringVar(&format, "format", "tsv", "input format: tsv, csv, jsonl or parquet")
	fl.StringVar(&opts.KeyColumn, "key-column", "", `jsonl field or parquet column of the key (default "key")`)
	fl.StringVar(&opts.ValueColumn, "value-column", "", `jsonl field or parquet column of the value (default "value")`)
	fl.BoolVar(&opts.Base64, "base64", false, "keys and values in the input are base64 (parquet: its BYTE_ARRAY columns)")
	fl.StringVar(&out, "out", "", "output directory")
	fl.Uint64Var(&opts.Version, "version", 0, "version number written into the files (default: with --table the next one, else 1)")
	fl.Uint64Var(&opts.DeltaOf, "delta-of", 0, "build a delta over this version (changed and deleted keys)")
	fl.BoolVar(&lastWins, "last-wins", false, "accept duplicate keys: the last in input order wins")
	fl.Int64Var(&opts.MemoryBudget, "memory", 0, "memory budget in bytes for input held while building (default 1 GiB; beyond it, input spills to disk)")
	fl.BoolVar(&noProgress, "no-progress", false, "do not show the progress bar")
	fl.StringVar(&runner, "runner", "", "build on an Apache Beam pipeline (tabula-beam) with this runner: local (in-process) or a portable runner such as universal, flink, spark, dataflow (default: the native builder)")
	fl.StringArrayVar(&beamArgs, "beam-arg", nil, "a flag passed to tabula-beam and Beam as is, e.g. --beam-arg=--endpoint=localhost:8099 (repeatable)")
	return cmd
}

// beamBuild runs the build on tabula-beam (module beambuild): the same
// files, byte for byte, built by an Apache Beam pipeline. It is a binary of
// its own so that Beam's dependencies stay out of this one; it is looked
// for beside this executable, then on $PATH.
func beamBuild(cmd *cobra.Command, runner string, beamArgs, inputs []string, out, format string, lastWins bool, opts bulk.BuildOptions) error {
	if opts.KeyColumn != "" || opts.ValueColumn != "" || opts.MemoryBudget != 0 {
		return errors.New("--key-column, --value-column and --memory apply to the native builder, not to --runner")
	}
	bin, err := findBeamBinary()
	if err != nil {
		return err
	}
	if runner == "local" {
		runner = "direct"
	}
	args := []string{"--out", out, "--partitions", fmt.Sprint(opts.Partitions), "--version", fmt.Sprint(opts.Version),
		"--format", format, "--runner", runner, "--input", strings.Join(inputs, ",")}
	if opts.DeltaOf != 0 {
		args = append(args, "--delta-of", fmt.Sprint(opts.DeltaOf))
	}
	if opts.Base64 {
		args = append(args, "--base64")
	}
	if lastWins {
		args = append(args, "--last-wins")
	}
	if opts.Workers > 0 {
		args = append(args, "--workers", fmt.Sprint(opts.Workers))
	}
	args = append(args, beamArgs...)
	c := exec.CommandContext(cmd.Context(), bin, args...)
	c.Stdout, c.Stderr = cmd.OutOrStdout(), cmd.ErrOrStderr()
	if err := c.Run(); err != nil {
		return fmt.Errorf("bulk build on Beam (%s %s): %w", bin, strings.Join(args, " "), err)
	}
	return nil
}

// findBeamBinary finds tabula-beam beside this executable or on $PATH.
func findBeamBinary() (string, error) {
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), "tabula-beam")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if p, err := exec.LookPath("tabula-beam"); err == nil {
		return p, nil
	}
	return "", errors.New("bulk build --runner needs tabula-beam, beside tabula or on $PATH: install it with (cd beambuild && go install ./cmd/tabula-beam)")
}

func bulkPublishCmd(g *globals) *cobra.Command {
	var (
		table, dir string
		noProgress bool
		parallel   int
		direct     bool
	)
	cmd := &cobra.Command{
		Use:   "publish --table T --dir DIR",
		Short: "Publish a built version: store each partition file in a stream, then roll it out row by row over the serving copies",
		Long: `Publish registers the version the files in DIR carry (written by tabula bulk
build) with the master, writes each partition's file into a stream of the
stream layer (replicated on 3 servers, checksummed, sealed; an interrupted
publish continues with the files not stored yet when run again), and waits
while the version rolls out: one row of copies at a time (one copy of every
partition) fetches, verifies and loads its file, switches its reads to it,
and the oldest row is unloaded, until every copy serves the new version.
Reads go on from the previous version meanwhile. Interrupting the command
does not stop the rollout (tabula bulk rollout pause|abort does). A
partition that later moves to another server (its server died or drained)
is reloaded there from its stream.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if table == "" || dir == "" {
				return errors.New("--table and --dir are required")
			}
			ctx := cmd.Context()
			c, err := g.client(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			t := c.Table(table)
			m, err := t.Map(ctx)
			if err != nil {
				return err
			}
			if k := m.GetTable().GetKind(); k != api.TableKind_TABLE_KIND_BULK {
				return fmt.Errorf("table %s is a %s table; publish needs a bulk table", table, api.KindName(k))
			}
			errOut := cmd.ErrOrStderr()
			fmt.Fprintf(errOut, "checking %d partition files in %s\n", len(m.GetPartitions()), dir)
			dv, err := bulk.DescribeDir(ctx, dir, len(m.GetPartitions()))
			if err != nil {
				return err
			}
			p := client.BulkPublish{Version: dv.Version, Base: dv.Base}
			var total uint64
			for _, f := range dv.Files {
				p.Files = append(p.Files, client.BulkFile{Path: f.Path, Size: uint64(f.FileBytes), CRC32C: f.CRC, Records: f.Records})
				total += uint64(f.FileBytes)
			}
			var bar *progressbar.ProgressBar
			if !noProgress {
				bar = progressbar.NewOptions64(int64(total), progressbar.OptionSetWriter(errOut), progressbar.OptionSetWidth(20),
					progressbar.OptionShowBytes(true), progressbar.OptionThrottle(200*time.Millisecond), progressbar.OptionClearOnFinish())
			}
			start := time.Now()
			err = t.PublishBulk(ctx, p, client.PublishOptions{Parallel: parallel, DirectUpload: direct, Progress: func(pp client.PublishProgress) {
				if bar != nil {
					desc := fmt.Sprintf("%d/%d stored, %d/%d loaded", pp.Stored, pp.Partitions, pp.Loaded, pp.Partitions)
					if pp.Rows > 0 {
						desc += fmt.Sprintf(", %d/%d rows serve it", pp.RowsDone, pp.Rows)
					}
					bar.Describe(desc)
					_ = bar.Set64(int64(pp.StoredBytes))
				}
			}})
			if bar != nil {
				_ = bar.Finish()
			}
			if err != nil {
				return err
			}
			kind := "full"
			if dv.Base != 0 {
				kind = fmt.Sprintf("delta over %d", dv.Base)
			}
			info, err := t.BulkStatus(ctx)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			took := time.Since(start).Round(time.Millisecond)
			if cur := info.GetCurrent(); cur != dv.Version {
				fmt.Fprintf(w, "version %d (%s) is loaded on all %d partitions; table %s serves version %d (tabula bulk rollback %s --version %d switches to it)\n",
					dv.Version, kind, len(dv.Files), table, cur, table, dv.Version)
				return nil
			}
			fmt.Fprintf(w, "table %s serves version %d (%s): %d partitions, %.1f MB, in %v\n",
				table, dv.Version, kind, len(dv.Files), float64(total)/1e6, took)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&table, "table", "", "bulk table to publish to")
	fl.StringVar(&dir, "dir", "", "directory of partition files (tabula bulk build --out)")
	fl.IntVar(&parallel, "parallel", 4, "partitions written at once")
	fl.BoolVar(&direct, "direct-upload", false, "also send each file straight to its server (it then need not fetch it from the stream)")
	fl.BoolVar(&noProgress, "no-progress", false, "do not show the progress bar")
	return cmd
}

func bulkStatusCmd(g *globals) *cobra.Command {
	var detail bool
	cmd := &cobra.Command{
		Use:   "status TABLE",
		Short: "Show a bulk table's versions and load progress",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			c, err := g.client(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			t := c.Table(args[0])
			info, err := t.BulkStatus(ctx)
			if err != nil {
				return err
			}
			m, err := t.Map(ctx)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "table %s: serving version %d\n", args[0], info.GetCurrent())
			if ro := info.GetRollout(); ro != nil {
				printRollout(out, m, ro)
			}
			w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "VERSION\tBASE\tSTATE\tLOADED\tRECORDS\tBYTES\tPUBLISHED\tSERVING SINCE")
			for _, v := range info.GetVersions() {
				since := "-"
				if ms := v.GetServingSinceUnixMs(); ms > 0 && v.GetState() == api.BulkVersionState_BULK_VERSION_STATE_SERVING {
					since = time.UnixMilli(ms).UTC().Format(time.RFC3339)
				}
				base := "-"
				if v.GetBaseVersion() != 0 {
					base = fmt.Sprint(v.GetBaseVersion())
				}
				loaded := fmt.Sprintf("%d/%d", v.GetLoadedPartitions(), len(m.GetPartitions()))
				if v.GetState() == api.BulkVersionState_BULK_VERSION_STATE_READY && v.GetLoadedPartitions() == 0 && v.GetStreams() {
					loaded = "streams" // retained in its streams only: a rollback rolls it out again
				}
				fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", v.GetVersion(), base,
					strings.ToLower(strings.TrimPrefix(v.GetState().String(), "BULK_VERSION_STATE_")),
					loaded, v.GetRecords(), v.GetBytes(),
					time.UnixMilli(v.GetCreatedUnixMs()).UTC().Format(time.RFC3339), since)
			}
			if err := w.Flush(); err != nil {
				return err
			}
			if !detail {
				return nil
			}
			for _, v := range info.GetVersions() {
				fmt.Fprintf(out, "\nversion %d:\n", v.GetVersion())
				w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				if e := v.GetError(); e != "" {
					fmt.Fprintf(out, "refused: %s\n", e)
				}
				fmt.Fprintln(w, "PARTITION\tSERVERS\tLOADED\tRECORDS\tBYTES\tCRC32C\tSTREAM")
				for i, f := range v.GetFiles() {
					// Every serving copy, not the last one seen.
					var servers []string
					if i < len(m.GetPartitions()) {
						for _, r := range m.GetPartitions()[i].GetReplicas() {
							servers = append(servers, r.GetServerId())
						}
					}
					srv := strings.Join(servers, ",")
					if srv == "" {
						srv = "(unplaced)"
					}
					st := f.GetStream()
					switch {
					case !v.GetStreams():
						st = "(server only)"
					case st == "":
						st = "(storing)"
					}
					fmt.Fprintf(w, "%d\t%s\t%v\t%d\t%d\t%08x\t%s\n", i, srv, i < len(v.GetLoaded()) && v.GetLoaded()[i], f.GetRecords(), f.GetSize(), f.GetCrc32C(), st)
				}
				if err := w.Flush(); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&detail, "partitions", false, "also show each partition's file and load state")
	return cmd
}

func bulkRollbackCmd(g *globals) *cobra.Command {
	var version uint64
	cmd := &cobra.Command{
		Use:   "rollback TABLE --version M",
		Short: "Serve a retained version again (rolled out row by row from its streams)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if version == 0 {
				return errors.New("--version is required (tabula bulk status lists the retained versions)")
			}
			// The rollback rolls the version out again, row by row: it
			// takes as long as a publish's rollout, so it waits as publish
			// does unless --timeout is given.
			ctx, cancel := context.WithCancel(cmd.Context())
			if cmd.Flags().Changed("timeout") {
				ctx, cancel = g.withTimeout(cmd.Context())
			}
			defer cancel()
			c, err := g.client(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			errOut := cmd.ErrOrStderr()
			last := ""
			err = c.Table(args[0]).BulkRollback(ctx, version, func(ro *api.BulkRollout) {
				if s := rolloutLine(ro); s != last {
					fmt.Fprintln(errOut, s)
					last = s
				}
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "table %s serves version %d\n", args[0], version)
			return nil
		},
	}
	cmd.Flags().Uint64Var(&version, "version", 0, "retained version to serve")
	return cmd
}

func bulkRolloutCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "rollout pause|resume|abort TABLE",
		Short: "Pause, resume or abort a bulk table's row-by-row rollout",
		Long: `A new version (a publish, or a rollback) rolls out one row of copies at a
time: each partition gets a copy that loads it (an extra copy on a server
with room, else beside the old version), the row switches once every
partition of it serves the version, and the oldest row is unloaded.

  pause    no further row switches (the row loading goes on loading)
  resume   go on
  abort    roll the switched rows back to the version the rollout replaces,
           and drop the new version

tabula bulk status TABLE shows each row's progress.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			action, table := args[0], args[1]
			switch action {
			case "pause", "resume", "abort":
			default:
				return fmt.Errorf("unknown rollout action %q: want pause, resume or abort", action)
			}
			ctx, cancel := g.withTimeout(cmd.Context())
			defer cancel()
			c, err := g.client(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			ro, err := c.Table(table).BulkRollout(ctx, action)
			if err != nil {
				return err
			}
			if ro == nil {
				fmt.Fprintf(cmd.OutOrStdout(), "table %s: rollout %s; none is under way now\n", table, action)
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "table %s: rollout %s: %s\n", table, action, rolloutLine(ro))
			return nil
		},
	}
}

// rolloutLine says where a rollout is, in one line.
func rolloutLine(ro *api.BulkRollout) string {
	what := fmt.Sprintf("version %d replacing %d", ro.GetVersion(), ro.GetFrom())
	if ro.GetAborting() {
		what = fmt.Sprintf("abort: back to version %d from %d", ro.GetVersion(), ro.GetFrom())
	}
	state := fmt.Sprintf("row %d loading (%d/%d partitions loaded)", ro.GetRowsDone()+1, ro.GetRowLoaded(), ro.GetPartitions())
	switch {
	case ro.GetPaused():
		state = "paused; " + state
	case ro.GetWaiting() != "":
		state = "waiting: " + ro.GetWaiting()
	}
	return fmt.Sprintf("%s: %d/%d rows switched; %s", what, ro.GetRowsDone(), ro.GetRows(), state)
}

// printRollout prints a rollout and each row's progress: rows before the
// one loading serve the new version, the ones after it the old.
func printRollout(out io.Writer, m *api.PartitionMap, ro *api.BulkRollout) {
	fmt.Fprintf(out, "rollout: %s\n", rolloutLine(ro))
	if ms := ro.GetStartedUnixMs(); ms > 0 {
		fmt.Fprintf(out, "  started %s, this row %s ago\n", time.UnixMilli(ms).UTC().Format(time.RFC3339),
			time.Since(time.UnixMilli(ro.GetRowStartedUnixMs())).Round(time.Second))
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "  ROW\tSTATE")
	for r := 0; r < int(ro.GetRows()); r++ {
		var state string
		switch {
		case r < int(ro.GetRowsDone()):
			state = fmt.Sprintf("serves version %d", ro.GetVersion())
		case r == int(ro.GetRowsDone()):
			state = fmt.Sprintf("loading version %d: %d/%d partitions loaded", ro.GetVersion(), ro.GetRowLoaded(), ro.GetPartitions())
			if ro.GetPaused() {
				state += " (paused)"
			}
		default:
			state = fmt.Sprintf("serves version %d", ro.GetFrom())
		}
		fmt.Fprintf(w, "  %d\t%s\n", r+1, state)
	}
	_ = w.Flush()
	// Each partition's copies, and what each serves.
	w = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "  PARTITION\tCOPIES (server: serves, holds)")
	for _, p := range m.GetPartitions() {
		var cs []string
		for _, r := range p.GetReplicas() {
			cs = append(cs, fmt.Sprintf("%s: %d %v", r.GetServerId(), r.GetBulkServes(), r.GetBulkHolds()))
		}
		fmt.Fprintf(w, "  %d\t%s\n", p.GetIndex(), strings.Join(cs, "; "))
	}
	_ = w.Flush()
}

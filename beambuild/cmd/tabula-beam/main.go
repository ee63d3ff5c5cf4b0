// Command tabula-beam builds the partition files of a bulk table version on
// an Apache Beam pipeline (package beambuild): the files `tabula bulk build`
// writes, byte for byte, which `tabula bulk publish --dir` publishes.
//
//	tabula-beam --out DIR --partitions N [--version V] [--delta-of B] [--format tsv|csv|jsonl]
//	            [--base64] [--last-wins] [--workers W] [--runner R --endpoint HOST:PORT ...] INPUT...
//	tabula-beam compare --records N [--partitions N] [--value-bytes B] [--rounds R] [--memory BYTES]
//
// The flags are Go flags shared with Beam's standard ones (--runner,
// --endpoint, --environment_type, --job_name...). compare generates N
// records, builds them with the native builder and with the pipeline on the
// direct runner, checks the files are identical and prints records/s of each.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/apache/beam/sdks/v2/go/pkg/beam"
	"github.com/apache/beam/sdks/v2/go/pkg/beam/log"
	"github.com/apache/beam/sdks/v2/go/pkg/beam/runners"

	// Beam's file systems and runners, as beamx registers them.
	_ "github.com/apache/beam/sdks/v2/go/pkg/beam/core/runtime/exec/optimized"
	_ "github.com/apache/beam/sdks/v2/go/pkg/beam/io/filesystem/gcs"
	_ "github.com/apache/beam/sdks/v2/go/pkg/beam/io/filesystem/local"
	_ "github.com/apache/beam/sdks/v2/go/pkg/beam/runners/dataflow"
	_ "github.com/apache/beam/sdks/v2/go/pkg/beam/runners/direct"
	_ "github.com/apache/beam/sdks/v2/go/pkg/beam/runners/flink"
	_ "github.com/apache/beam/sdks/v2/go/pkg/beam/runners/prism"
	_ "github.com/apache/beam/sdks/v2/go/pkg/beam/runners/spark"
	_ "github.com/apache/beam/sdks/v2/go/pkg/beam/runners/universal"

	"github.com/tabuladb/tabula/beambuild"
	"github.com/tabuladb/tabula/engines/bulk"
)

type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }
func (l *stringList) Set(s string) error {
	*l = append(*l, strings.Split(s, ",")...)
	return nil
}

var (
	out        = flag.String("out", "", "output directory (local, or a path of a file system Beam supports, e.g. gs://)")
	partitions = flag.Int("partitions", 0, "partition count (required, as the table's)")
	version    = flag.Uint64("version", 1, "version number written into the files")
	deltaOf    = flag.Uint64("delta-of", 0, "build a delta over this version (changed and deleted keys)")
	format     = flag.String("format", "tsv", "input format: tsv, csv or jsonl")
	base64     = flag.Bool("base64", false, "keys and values in the input are base64")
	lastWins   = flag.Bool("last-wins", false, "accept duplicate keys: the last in input order wins")
	workers    = flag.Int("workers", 0, "partitions built at once per bundle (default GOMAXPROCS)")
	verbose    = flag.Bool("verbose", false, "show Beam's informational logs")
	records    = flag.Int("records", 1_000_000, "compare: records to generate")
	valueBytes = flag.Int("value-bytes", 64, "compare: bytes per value")
	memory     = flag.Int64("memory", 0, "compare: the native builder's memory budget in bytes (default 1 GiB; beyond it, it spills to disk)")
	rounds     = flag.Int("rounds", 2, "compare: rounds of both builds (the best time of each counts)")
	inputs     stringList
)

func init() {
	flag.Var(&inputs, "input", "input file(s), repeatable or comma-separated (or give them as arguments)")
}

// quietLogger passes Beam's warnings and errors to stderr, and its
// informational logs with --verbose.
type quietLogger struct{}

func (quietLogger) Log(_ context.Context, sev log.Severity, _ int, msg string) {
	if sev >= log.SevWarn || *verbose {
		fmt.Fprintln(os.Stderr, "beam:", strings.TrimSpace(msg))
	}
}

func main() {
	compare := len(os.Args) > 1 && os.Args[1] == "compare"
	if compare {
		os.Args = append(os.Args[:1], os.Args[2:]...)
	}
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: tabula-beam --out DIR --partitions N [flags] INPUT...\n       tabula-beam compare --records N [--partitions N]\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	beam.Init() // a worker of a portable runner does not return
	log.SetLogger(quietLogger{})
	if !*verbose {
		// Prism and parts of the SDK log through slog.
		slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var err error
	if compare {
		err = runCompare(ctx)
	} else {
		err = runBuild(ctx)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "tabula-beam:", err)
		os.Exit(1)
	}
}

func options() (beambuild.Options, error) {
	f, err := bulk.ParseFormat(*format)
	if err != nil {
		return beambuild.Options{}, err
	}
	if f != bulk.FormatTSV && f != bulk.FormatCSV && f != bulk.FormatJSONL {
		return beambuild.Options{}, fmt.Errorf("--format %s: the Beam build reads tsv, csv and jsonl (build %s inputs with tabula bulk build)", f, f)
	}
	o := beambuild.Options{Runner: *runners.Runner}
	o.Build.Partitions = *partitions
	o.Build.Format = f
	o.Build.Base64 = *base64
	o.Build.Version = *version
	o.Build.DeltaOf = *deltaOf
	o.Build.Workers = *workers
	o.Build.Partition.LastWins = *lastWins
	return o, nil
}

func runBuild(ctx context.Context) error {
	ins := append(inputs, flag.Args()...)
	if *out == "" || len(ins) == 0 {
		return errors.New("--out and at least one input are required")
	}
	if *partitions <= 0 {
		return fmt.Errorf("--partitions %d: want 1 or more (the table's partition count)", *partitions)
	}
	o, err := options()
	if err != nil {
		return err
	}
	start := time.Now()
	if err := beambuild.Build(ctx, ins, *out, o); err != nil {
		return err
	}
	took := time.Since(start)
	runner := o.Runner
	if beambuild.IsDirect(runner) {
		runner = "direct"
	}
	dv, err := bulk.DescribeDir(ctx, *out, *partitions)
	if err != nil {
		// A remote directory: the runner said it succeeded.
		fmt.Printf("built version %d: %d partitions in %s on the %s runner in %v\n", *version, *partitions, *out, runner, took.Round(time.Millisecond))
		return nil
	}
	var recs, bytes uint64
	for _, f := range dv.Files {
		recs += f.Records
		bytes += uint64(f.FileBytes)
	}
	fmt.Printf("built version %d: %d partitions in %s on the %s runner: %d records, %.1f MB of files, %v (%.0f records/s)\n",
		dv.Version, len(dv.Files), *out, runner, recs, float64(bytes)/1e6, took.Round(time.Millisecond), float64(recs)/took.Seconds())
	for _, f := range dv.Files {
		fmt.Printf("  %s  %d records  %d bytes  crc32c %08x\n", f.Path, f.Records, f.FileBytes, f.CRC)
	}
	return nil
}

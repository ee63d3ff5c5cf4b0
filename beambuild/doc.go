// Package beambuild builds the partition files of a bulk table version on
// Apache Beam (the Go SDK): the same files, byte for byte, that
// bulk.BuildTable makes from the same inputs and options, so that
// `tabula bulk publish` takes its output directory as it takes the native
// builder's.
//
// It lives in a module of its own (github.com/tabuladb/tabula/beambuild) so
// that Beam's dependency tree never enters the server's go.mod; the binary is
// cmd/tabula-beam.
//
// # Pipeline
//
//	inputs (index) ──read──▶ KV<partition, chunk> ─┐
//	partitions 0..n-1 (empty seeds) ───────────────┴─flatten─▶ GBK ──build──▶ result ──▶ GBK(all) ──finish
//
// read parses one input file with bulk.InputReader (the native parser and
// checks, positions included), routes each record with bulk.PartitionOf and
// appends it to its partition's chunk; a chunk (about ChunkBytes of encoded
// records, see chunk.go) is one element, so the runner moves few large
// elements rather than one per record. The seeds make every partition
// appear after the group-by-key, including one that no record routes to (the
// native builder writes an empty file for it). build decodes a partition's
// chunks, puts the records in the native builder's order (input index, then
// line: duplicates are resolved by it), and writes the partition file with
// bulk.BuildPartitionAt, up to Workers partitions at once within a bundle.
// It does not fail on a build error but reports it, so that finish can join
// the errors of all partitions with bulk.JoinPartitionErrors, as
// bulk.BuildTable does (its duplicate listing spans partitions).
//
// # Errors
//
// A bad input line fails read with the native *bulk.MalformedError; finish
// fails with the native error of the build (duplicates without LastWins,
// bulk.ErrEmptyInput). When the steps run in this process (the direct
// runner; prism with its loopback worker) Build returns that error itself;
// otherwise the runner's error text contains it. When the
// pipeline fails, Build removes the partition files of the table from the
// output directory, so that no directory that looks complete is left.
//
// # Runners
//
// The default runner is Beam's direct runner: in-process, one bundle, every
// element in memory (the whole input is held until the group-by-key hands
// it to the builds). Any other runner name is passed to beam.Run, with
// Beam's standard flags (--endpoint, --environment_type, --job_name...): the
// inputs and the output directory must then be paths every worker can read
// and write (a shared mount, or a file system Beam supports such as gs://;
// files are built in a local temporary directory and copied there).
package beambuild

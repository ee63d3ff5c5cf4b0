// Package parquetinput reads Parquet files as input of bulk builds
// (bulk.FormatParquet): importing it registers its reader with
// bulk.RegisterFormat, so that bulk.BuildTable and bulk.OpenInput read
// Parquet. It is a package of its own so that only the programs that read
// Parquet (cmd/tabula) link the Parquet library
// (github.com/parquet-go/parquet-go; RATIONALE.md says why that one), not
// every importer of engines/bulk.
//
// A file gives one record per row: the key and the value are read from two
// top-level columns (bulk.InputOptions.KeyColumn and ValueColumn, "key"
// and "value" by default), page by page, a few hundred values at a time;
// other columns are not read. Column types, nulls (a null value deletes
// the key in a delta build) and base64 are as bulk.Format describes.
// Errors are *bulk.MalformedError naming the file and the row (the first
// row is 1, counted across row groups), or the file alone when it is not
// Parquet or lacks a column (the message lists the columns it has). A
// panic of the Parquet library on a damaged file is recovered into such an
// error.
//
//	import _ "github.com/tabuladb/tabula/engines/bulk/parquetinput"
//
//	infos, err := bulk.BuildTable(ctx, []string{"model.parquet"}, "v1", bulk.BuildOptions{
//		Format: bulk.FormatParquet, KeyColumn: "user_id", ValueColumn: "embedding",
//	})
//
// A Reader is not safe for concurrent use; Open and NewReader are.
package parquetinput

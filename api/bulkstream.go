package api

import "fmt"

// BulkStreamPrefix starts the name of every bulk file's stream.
const BulkStreamPrefix = "bulk/"

// BulkStreamName is the stream partition index's file of version of the
// table with id tableID is written into: "bulk/<table id>/<version>/<index>".
// The table id, never reused, keeps a dropped table's name from meeting a
// new table's. The master names the streams of a publish with it, and a
// table server storing an uploaded file checks the name against it.
func BulkStreamName(tableID, version uint64, index int) string {
	return fmt.Sprintf("%s%d/%d/%d", BulkStreamPrefix, tableID, version, index)
}

// Package engines defines the storage-engine seam of a table server: the
// Engine interface every engine implements, capability interfaces where kinds
// differ (Writer for tables that take writes, BatchGetter for engines with a
// faster multi-key read), and a registry that opens an engine by table kind.
//
// Engines register themselves from init; a binary links the ones it serves
// with a blank import:
//
//	import _ "github.com/tabuladb/tabula/engines/point"
//
//	e, err := engines.Open(engines.KindPoint, engines.Options{})
//	w := e.(engines.Writer)
//	err = w.Apply([]engines.Mutation{{Key: k, Value: v}})
//	v, _, err := e.Get(k)
//
// Every engine passes the conformance suite in engines/enginetest.
//
// The registry and every Engine are safe for concurrent use.
package engines

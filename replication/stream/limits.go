package stream

import (
	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/replication/stream/streampb"
)

// MessageLimits are the request size limits of the ExtentNode service, for
// the api.SizeGuard of a server that hosts an extent node. Every one is
// cluster-internal (api.MessageLimit.Internal): replication is never
// refused for client load.
func MessageLimits() api.MessageLimits {
	l := api.MessageLimits{}
	// An append, and what a primary forwards to its secondaries, carry up
	// to MaxAppendBytes of block payload with their headers.
	l.Add(&streampb.AppendRequest{}, MaxMessageBytes, true)
	l.Add(&streampb.ReplicateRequest{}, MaxMessageBytes, true)
	l.Add(&streampb.ReplicateBatchRequest{}, MaxMessageBytes, true)
	// A fragment travels in messages of fragmentMsg bytes.
	l.Add(&streampb.PutFragmentChunk{}, fragmentMsg+api.SmallRequestBytes, true)
	l.Add(&streampb.CreateRequest{}, api.SmallRequestBytes, true)
	l.Add(&streampb.ReadRequest{}, api.SmallRequestBytes, true)
	l.Add(&streampb.CommitLengthRequest{}, api.SmallRequestBytes, true)
	l.Add(&streampb.SealRequest{}, api.SmallRequestBytes, true)
	l.Add(&streampb.FetchRequest{}, api.SmallRequestBytes, true)
	l.Add(&streampb.CopyRequest{}, api.SmallRequestBytes, true)
	l.Add(&streampb.DeleteRequest{}, api.SmallRequestBytes, true)
	l.Add(&streampb.StatRequest{}, api.SmallRequestBytes, true)
	l.Add(&streampb.CodeRequest{}, api.SmallRequestBytes, true)
	l.Add(&streampb.ReadFragmentRequest{}, api.SmallRequestBytes, true)
	l.Add(&streampb.RebuildFragmentRequest{}, api.SmallRequestBytes, true)
	l.Add(&streampb.DeleteFragmentRequest{}, api.SmallRequestBytes, true)
	return l
}

package stream_test

import (
	"context"
	"testing"

	"github.com/tabuladb/tabula/replication/stream"
	"github.com/tabuladb/tabula/replication/stream/streamtest"
)

// TestNodeStats appends to a 3-replica stream and checks the nodes'
// counters: the primary's appends and bytes, the secondaries' replicated
// writes, the journal's commits, and the manager's counts.
func TestNodeStats(t *testing.T) {
	c := streamtest.Start(t, 3, streamtest.Options{})
	defer c.Close()
	ctx := context.Background()
	if _, err := c.Driver.Apply(ctx, stream.Command{Op: stream.OpCreateStream, Stream: "s", Ack: stream.AckAll, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	cl := stream.NewClient(c.Driver, stream.ClientOptions{})
	defer cl.Close()
	const n, size = 5, 100
	for range n {
		if _, err := cl.Append(ctx, "s", make([]byte, size)); err != nil {
			t.Fatal(err)
		}
	}
	var total stream.NodeStats
	for _, nd := range c.Nodes {
		st := nd.Node().Stats()
		total.Appends += st.Appends
		total.AppendBytes += st.AppendBytes
		total.Replicated += st.Replicated
		total.ReplicatedBytes += st.ReplicatedBytes
		total.JournalCommits += st.JournalCommits
		total.JournalRecords += st.JournalRecords
		total.Extents += st.Extents
		if st.JournalCommits > 0 && st.JournalBytes == 0 {
			t.Errorf("node %s: %d journal commits of 0 bytes", nd.ID, st.JournalCommits)
		}
	}
	// The client may batch appends, so there are 1 to n of them, carrying
	// every byte once; each reached both secondaries.
	if total.Appends < 1 || total.Appends > n || total.AppendBytes != n*size {
		t.Errorf("appends %d carrying %d bytes, want 1..%d carrying %d", total.Appends, total.AppendBytes, n, n*size)
	}
	if total.Replicated < 2*total.Appends || total.ReplicatedBytes < 2*n*size {
		t.Errorf("replicated %d writes, %d bytes; want >= %d, >= %d", total.Replicated, total.ReplicatedBytes, 2*total.Appends, 2*n*size)
	}
	if total.JournalCommits < 1 || total.JournalRecords < total.JournalCommits {
		t.Errorf("journal: %d commits of %d records", total.JournalCommits, total.JournalRecords)
	}
	if total.Extents != 3 {
		t.Errorf("extent replicas = %d, want 3", total.Extents)
	}
	c.Manager(func(m *stream.Manager) {
		if s, e := m.Counts(); s != 1 || e != 1 {
			t.Errorf("manager counts = %d streams, %d extents; want 1, 1", s, e)
		}
	})
}

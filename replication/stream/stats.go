package stream

import "sync/atomic"

// NodeStats are an extent node's counters since it opened, and its
// replicas now: what metrics read (tableserver/metrics.go).
type NodeStats struct {
	// Extents is the number of extent replicas the node holds, and
	// UsedBytes their durable length together.
	Extents   int
	UsedBytes int64
	// Appends counts the Append calls this node answered as primary with
	// success, and AppendBytes their payload (block) bytes.
	Appends     uint64
	AppendBytes uint64
	// Replicated counts the writes this node took as a secondary
	// (Replicate, and each item of ReplicateBatch, with data), and
	// ReplicatedBytes their bytes.
	Replicated      uint64
	ReplicatedBytes uint64
	// JournalCommits counts the journal's batches: each one write and one
	// fsync, for every record queued by every extent meanwhile (group
	// commit), so JournalRecords / JournalCommits is the records an fsync
	// carried. JournalBytes is what the batches wrote. All zero without a
	// journal.
	JournalCommits uint64
	JournalRecords uint64
	JournalBytes   uint64
	// SecondaryDrops counts the secondaries this node, as primary, dropped
	// from an extent's ack set (a Replicate failed or timed out, or a
	// queue passed MaxReplicaLag); SecondaryRejoins those it brought back,
	// and RejoinBytes what it sent them to catch up.
	SecondaryDrops   uint64
	SecondaryRejoins uint64
	RejoinBytes      uint64
	// LateTimeouts counts replicate timeouts that fired late (this node
	// was stopped or starved), after which the secondary got another
	// timeout's wait instead of being dropped for this node's silence.
	LateTimeouts uint64
}

// Stats returns the node's counters. It takes the store's lock briefly
// and reads each replica's length; nothing on the write path waits for
// it. Safe for concurrent use.
func (n *Node) Stats() NodeStats {
	st := NodeStats{
		Extents:          len(n.store.List()),
		UsedBytes:        n.store.UsedBytes(),
		Appends:          n.stats.appends.Load(),
		AppendBytes:      n.stats.appendBytes.Load(),
		Replicated:       n.stats.replicates.Load(),
		ReplicatedBytes:  n.stats.replicatedBytes.Load(),
		SecondaryDrops:   n.stats.drops.Load(),
		SecondaryRejoins: n.stats.rejoins.Load(),
		RejoinBytes:      n.stats.rejoinBytes.Load(),
		LateTimeouts:     n.stats.lateTimeouts.Load(),
	}
	if j := n.store.jr; j != nil {
		st.JournalCommits = j.stats.commits.Load()
		st.JournalRecords = j.stats.records.Load()
		st.JournalBytes = j.stats.bytes.Load()
	}
	return st
}

// nodeCounters are a Node's counters, atomics the RPC paths add to.
type nodeCounters struct {
	appends, appendBytes, replicates, replicatedBytes atomic.Uint64
	drops, rejoins, rejoinBytes, lateTimeouts         atomic.Uint64
}

func (c *nodeCounters) appended(bytes int64) {
	c.appends.Add(1)
	c.appendBytes.Add(uint64(bytes))
}

func (c *nodeCounters) replicated(bytes int) {
	c.replicates.Add(1)
	c.replicatedBytes.Add(uint64(bytes))
}

// journalCounters are a journal's counters, added to by the leader of each
// batch after its fsync.
type journalCounters struct {
	commits, records, bytes atomic.Uint64
}

func (c *journalCounters) committed(records, bytes int) {
	c.commits.Add(1)
	c.records.Add(uint64(records))
	c.bytes.Add(uint64(bytes))
}

// Counts is how many streams and extents the manager holds, without
// listing them (for metrics).
func (m *Manager) Counts() (streams, extents int) { return m.streams.Len(), m.extents.Len() }

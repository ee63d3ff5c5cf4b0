package stream

import "time"

// CommitKeepalive is the longest a primary leaves a secondary in its ack
// set without telling it the commit point, also when nothing is written:
// a secondary that heard nothing for longer is behind by at least that.
const CommitKeepalive = 250 * time.Millisecond

// SecondaryState is a primary's view of one secondary of an extent it
// appends to: what a partition reports per replica (in the ack set,
// dropped, catching up) and what counts it as in step.
type SecondaryState struct {
	Node string // the secondary's node id
	// InAckSet: its acknowledgements count toward the ack policy. A
	// secondary leaves the set when a Replicate fails or times out, or
	// its queue passes NodeOptions.MaxReplicaLag.
	InAckSet bool
	// Rejoining: out of the ack set, answering again, and being sent
	// what it missed from the primary's own replica; it rejoins once it
	// holds it all. A secondary out of the set that does not answer is
	// not rejoining.
	Rejoining bool
	// Acked is the length it reported durable; Behind is the primary's
	// written length minus Acked, in bytes.
	Acked, Behind int64
	// Since is when it last left or rejoined the ack set (zero: it never
	// left).
	Since time.Time
	// Reason is why it left the ack set, while it is out.
	Reason string
}

// Secondaries returns the primary's view of each secondary of extent id,
// and false when this node is not appending to it as primary (no append
// since it opened, or another node is primary). Safe for concurrent use.
func (n *Node) Secondaries(id uint64) ([]SecondaryState, bool) {
	n.mu.Lock()
	a := n.appenders[id]
	n.mu.Unlock()
	if a == nil {
		return nil, false
	}
	length := a.ext.Length()
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]SecondaryState, 0, len(a.secs))
	for _, s := range a.secs {
		st := SecondaryState{Node: s.ref.Node, InAckSet: s.failed == nil, Acked: s.acked, Behind: max(0, length-s.acked), Since: s.since}
		if s.failed != nil {
			st.Reason = s.failed.Error()
			st.Rejoining = s.answering
		}
		out = append(out, st)
	}
	return out, true
}

// CommitHeard is what a secondary replica last heard of its extent's
// commit point: the commit length its primary told it (not capped at
// the replica's durable length, unlike CommittedLength) and when, by
// this process's clock (zero: never told since the replica opened). A
// replica that applied through told is in step as of at. While the
// extent is open and the secondary in the ack set, its primary tells it
// at least every CommitKeepalive, writes or not; a secondary that has
// not heard for longer is cut off or dropped. Safe for concurrent use.
func (e *Extent) CommitHeard() (told int64, at time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.committed, e.heardAt
}

package raftnode

import (
	"context"

	"go.etcd.io/raft/v3/raftpb"
)

// Transport carries raft messages between members. A Node calls Attach
// when it starts (and Attach(nil) when it closes), Send from its
// goroutine after the messages' log writes are durable, and SetPeer and
// RemovePeer as membership changes. Implementations are safe for
// concurrent use; Send must not block (queue, or drop: raft retries).
type Transport interface {
	// Attach routes incoming messages and delivery reports to h (nil: drop
	// them).
	Attach(h Handler)
	// Send delivers msgs to their To members, best effort. A MsgSnap must
	// end with a Handler.ReportSnapshot on the sending side.
	Send(msgs []raftpb.Message)
	// SetPeer adds or updates the address of member id.
	SetPeer(id uint64, addr string)
	// RemovePeer forgets member id.
	RemovePeer(id uint64)
}

// Handler receives what a Transport delivers. Node implements it; its
// methods are safe for concurrent use.
type Handler interface {
	// Step hands an incoming message to the member; it blocks until the
	// member took it, ctx ends or the member stopped.
	Step(ctx context.Context, m raftpb.Message) error
	// ReportUnreachable says a message to id could not be sent.
	ReportUnreachable(id uint64)
	// ReportSnapshot says whether a snapshot sent to id arrived.
	ReportSnapshot(id uint64, failed bool)
}

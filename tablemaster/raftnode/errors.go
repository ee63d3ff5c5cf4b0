package raftnode

import (
	"errors"
	"fmt"
)

// Sentinel errors of the package; compare with errors.Is.
var (
	// ErrCorrupt marks damaged durable state: a bad file header, a bad
	// record followed by intact ones, a log that names a missing snapshot.
	// A torn final record (a crash in the middle of an append) is not
	// corruption: it is dropped on open.
	ErrCorrupt = errors.New("raftnode: corrupt storage")
	// ErrUnsupportedVersion is a file written by a format this build does
	// not read.
	ErrUnsupportedVersion = errors.New("raftnode: unsupported format version")
	// ErrStopped is returned by calls on a Node that was closed or that
	// stopped on a storage error (the error wraps the cause).
	ErrStopped = errors.New("raftnode: node stopped")
	// ErrProposalDropped means the proposal was certainly not committed:
	// raft refused it (a leadership transfer in progress, a conf change
	// already pending) or another entry was committed at its index. It is
	// safe to retry.
	ErrProposalDropped = errors.New("raftnode: proposal dropped")
	// ErrOutcomeUnknown means a proposal may or may not have been
	// committed: a snapshot from the leader replaced the log before this
	// node saw the entry applied.
	ErrOutcomeUnknown = errors.New("raftnode: proposal outcome unknown")
	// ErrNotCaughtUp refuses to promote a learner whose log lags the
	// leader's by more than Options.PromoteMaxLag entries.
	ErrNotCaughtUp = errors.New("raftnode: learner not caught up")
	// ErrUnknownMember names a member id the configuration lacks, or that
	// has the wrong role for the request.
	ErrUnknownMember = errors.New("raftnode: unknown member")
	// ErrConfChangeInProgress refuses a membership change while another one
	// proposed by this node has not been applied.
	ErrConfChangeInProgress = errors.New("raftnode: membership change in progress")
)

// NotLeaderError is returned by calls only the leader answers, on a member
// that is not the leader. LeaderID is 0 (and LeaderAddr empty) when no
// leader is known; callers retry there, or later.
type NotLeaderError struct {
	LeaderID   uint64
	LeaderAddr string
}

func (e *NotLeaderError) Error() string {
	if e.LeaderID == 0 {
		return "raftnode: not the leader; no leader known"
	}
	return fmt.Sprintf("raftnode: not the leader; leader is %d at %s", e.LeaderID, e.LeaderAddr)
}

package raftnode

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
)

// StateMachine is the replicated state a Node drives. Its methods are
// called only from the node's goroutine, one at a time, so they need no
// locking against each other; they must not block for long or call back
// into the Node's blocking methods. The state machine is not durable on
// its own: on start the Node restores it from the latest snapshot and
// re-applies the log after it.
type StateMachine interface {
	// Apply applies the committed entry at index. It must be deterministic:
	// every member applies the same data in the same order and must reach
	// the same state. The result goes back to the proposer's Propose.
	Apply(index uint64, data []byte) (result any)
	// Snapshot encodes the state as of the last applied entry.
	Snapshot() ([]byte, error)
	// Restore replaces the state with one Snapshot returned.
	Restore(data []byte) error
}

// Entry data is | proposer id (8) | proposal tag (8) | payload |: the tag
// lets the proposer recognise its own entry when it is applied, whatever
// index it landed at. An empty entry is raft's (a new leader's no-op).
const entryHeaderLen = 16

// done completes a proposal or read on the node's goroutine.
type done func(index uint64, result any, err error)

type proposal struct {
	tag  uint64
	conf bool
	done done
}

type read struct {
	tag   uint64
	index uint64 // 0 until the read state arrives
	done  done
}

// coreConfig is what a core needs besides its storage and state machine.
type coreConfig struct {
	id            uint64
	electionTick  int
	heartbeatTick int
	snapshotEvery uint64
	keepEntries   uint64
	promoteMaxLag uint64
	incarnation   uint32 // makes proposal tags unique across restarts
	logger        *slog.Logger
	// Hooks, called on the core's goroutine.
	send           func([]raftpb.Message)
	setPeer        func(id uint64, addr string)
	removePeer     func(id uint64)
	takeSnapshot   func(raftpb.Snapshot) // write the file, then call snapshotWritten
	onLeaderChange func(LeaderChange)
}

// core is a member's deterministic heart: raft's RawNode, the storage and
// the state machine, stepped by one goroutine. It does disk I/O (the log,
// synchronously, as raft's Ready contract says) but starts no goroutine,
// reads no clock and sends through hooks, so a simulation drives many
// cores from one goroutine. Not safe for concurrent use.
type core struct {
	cfg     coreConfig
	rn      *raft.RawNode
	storage *Storage
	sm      StateMachine

	members        map[uint64]string // addresses of voters and learners
	membersChanged bool              // since the last published Status
	confState      raftpb.ConfState
	applied        uint64
	snapIndex      uint64 // index of the latest snapshot, durable or being written
	snapBusy       bool

	lead    uint64
	term    uint64
	leading bool
	removed bool

	nextTag   uint32
	unindexed map[uint64]*proposal // proposed since the last Ready, by tag
	byIndex   map[uint64]*proposal // appended to the log, by index
	confBusy  bool                 // a conf change of ours is pending
	// afterPublish are the answers to conf changes, given once the
	// member's Status shows the change (Node.run calls them after
	// publishing it): a caller of RemoveMember reads the new members.
	afterPublish []func()
	reads        map[uint64]*read // by tag, awaiting their read state
	readyReads   []*read          // with an index, awaiting apply
	readTicks    int
	err          error // a storage failure; the core is dead
}

// newCore loads the state machine from storage and makes the RawNode. With
// peers and an empty storage, it bootstraps a new group of those members.
func newCore(cfg coreConfig, st *Storage, sm StateMachine, peers map[uint64]string) (*core, error) {
	c := &core{
		cfg: cfg, storage: st, sm: sm,
		members:   map[uint64]string{},
		unindexed: map[uint64]*proposal{},
		byIndex:   map[uint64]*proposal{},
		reads:     map[uint64]*read{},
	}
	snap, err := st.Snapshot()
	if err != nil {
		return nil, err
	}
	if !raft.IsEmptySnap(snap) {
		if err := c.restore(snap); err != nil {
			return nil, err
		}
	}
	rc := &raft.Config{
		ID:                        cfg.id,
		ElectionTick:              cfg.electionTick,
		HeartbeatTick:             cfg.heartbeatTick,
		Storage:                   st,
		Applied:                   c.applied,
		MaxSizePerMsg:             1 << 20,
		MaxInflightMsgs:           256,
		MaxUncommittedEntriesSize: 64 << 20,
		CheckQuorum:               true,
		PreVote:                   true,
		ReadOnlyOption:            raft.ReadOnlySafe,
		DisableProposalForwarding: true,
		StepDownOnRemoval:         true,
		Logger:                    raftLogger{cfg.logger},
	}
	c.rn, err = raft.NewRawNode(rc)
	if err != nil {
		return nil, fmt.Errorf("raftnode: %w", err)
	}
	last, _ := st.LastIndex()
	if last == 0 && len(peers) > 0 {
		ids := make([]uint64, 0, len(peers))
		for id := range peers {
			ids = append(ids, id)
		}
		sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
		rp := make([]raft.Peer, len(ids))
		for i, id := range ids {
			rp[i] = raft.Peer{ID: id, Context: []byte(peers[id])}
		}
		if err := c.rn.Bootstrap(rp); err != nil {
			return nil, fmt.Errorf("raftnode: bootstrap: %w", err)
		}
	}
	hs, _, _ := st.InitialState()
	c.term = hs.Term
	return c, nil
}

// restore replaces the state machine and membership with snap's.
func (c *core) restore(snap raftpb.Snapshot) error {
	members, data, err := decodeSnapshotData(snap.Data)
	if err != nil {
		return err
	}
	if err := c.sm.Restore(data); err != nil {
		return fmt.Errorf("raftnode: restore state machine at %d: %w", snap.Metadata.Index, err)
	}
	for _, id := range sortedKeys(c.members) {
		if _, ok := members[id]; !ok && id != c.cfg.id {
			c.cfg.removePeer(id)
		}
	}
	c.members = members
	for _, id := range sortedKeys(members) {
		if id != c.cfg.id {
			c.cfg.setPeer(id, members[id])
		}
	}
	c.confState = snap.Metadata.ConfState
	c.membersChanged = true
	c.applied = snap.Metadata.Index
	c.snapIndex = max(c.snapIndex, snap.Metadata.Index)
	for _, i := range sortedKeys(c.byIndex) {
		if p := c.byIndex[i]; i <= c.applied {
			delete(c.byIndex, i)
			p.finish(i, nil, fmt.Errorf("%w: a snapshot from the leader replaced entry %d", ErrOutcomeUnknown, i))
		}
	}
	return nil
}

func (p *proposal) finish(index uint64, result any, err error) {
	if p.done != nil {
		p.done(index, result, err)
	}
}

func (c *core) newTag() uint64 {
	c.nextTag++
	return uint64(c.cfg.incarnation)<<32 | uint64(c.nextTag)
}

// notLeader is the error for calls only the leader answers.
func (c *core) notLeader() error {
	return &NotLeaderError{LeaderID: c.lead, LeaderAddr: c.members[c.lead]}
}

func (c *core) tick() {
	c.rn.Tick()
	c.readTicks++
	if c.readTicks >= c.cfg.electionTick {
		c.readTicks = 0
		c.retryReads()
	}
}

func (c *core) step(m raftpb.Message) {
	if err := c.rn.Step(m); err != nil && !errors.Is(err, raft.ErrStepPeerNotFound) && !errors.Is(err, raft.ErrStepLocalMsg) {
		c.cfg.logger.Debug("raftnode: step", "type", m.Type, "from", m.From, "err", err)
	}
}

// propose appends data to the log if this member leads; done gets the
// state machine's result once the entry is applied here.
func (c *core) propose(data []byte, d done) {
	if c.err != nil {
		d(0, nil, c.err)
		return
	}
	if !c.leading {
		d(0, nil, c.notLeader())
		return
	}
	p := &proposal{tag: c.newTag(), done: d}
	buf := make([]byte, entryHeaderLen+len(data))
	binary.BigEndian.PutUint64(buf, c.cfg.id)
	binary.BigEndian.PutUint64(buf[8:], p.tag)
	copy(buf[entryHeaderLen:], data)
	if err := c.rn.Propose(buf); err != nil {
		d(0, nil, fmt.Errorf("%w: %v", ErrProposalDropped, err))
		return
	}
	c.unindexed[p.tag] = p
}

// proposeConfChange proposes cc (its ID is set here); done gets nil once it
// is applied here.
func (c *core) proposeConfChange(cc raftpb.ConfChange, d done) {
	switch {
	case c.err != nil:
		d(0, nil, c.err)
		return
	case !c.leading:
		d(0, nil, c.notLeader())
		return
	case c.confBusy:
		d(0, nil, ErrConfChangeInProgress)
		return
	}
	p := &proposal{tag: c.newTag(), conf: true}
	p.done = func(index uint64, result any, err error) {
		c.confBusy = false
		c.afterPublish = append(c.afterPublish, func() { d(index, result, err) })
	}
	cc.ID = p.tag
	if err := c.rn.ProposeConfChange(cc); err != nil {
		d(0, nil, fmt.Errorf("%w: %v", ErrProposalDropped, err))
		return
	}
	c.confBusy = true
	c.unindexed[p.tag] = p
}

// readIndex asks raft for a read index; done is called once this member
// applied up to it, so a read of local state then is linearizable.
func (c *core) readIndex(d done) {
	if c.err != nil {
		d(0, nil, c.err)
		return
	}
	r := &read{tag: c.newTag(), done: d}
	c.reads[r.tag] = r
	c.requestRead(r)
}

func (c *core) requestRead(r *read) {
	var ctx [8]byte
	binary.BigEndian.PutUint64(ctx[:], r.tag)
	c.rn.ReadIndex(ctx[:])
}

// retryReads asks again for read indexes that never came: the request or
// its answer was lost, or went to a leader that is gone.
func (c *core) retryReads() {
	if c.lead == 0 {
		return
	}
	for _, tag := range sortedKeys(c.reads) {
		c.requestRead(c.reads[tag])
	}
}

// learnerCaughtUp checks that id is a learner that replicates our log
// (it is past probing and snapshots) and lags it by at most promoteMaxLag
// entries. Only the leader tracks followers.
func (c *core) learnerCaughtUp(id uint64) error {
	if !c.leading {
		return c.notLeader()
	}
	isLearner := false
	for _, l := range c.confState.Learners {
		isLearner = isLearner || l == id
	}
	if !isLearner {
		return fmt.Errorf("%w: %d is not a learner", ErrUnknownMember, id)
	}
	st := c.rn.Status()
	pr, ok := st.Progress[id]
	last, _ := c.storage.LastIndex()
	if !ok || pr.State != tracker.StateReplicate || pr.Match+c.cfg.promoteMaxLag < last {
		var match uint64
		if ok {
			match = pr.Match
		}
		return fmt.Errorf("%w: learner %d has %d of %d entries (at most %d behind allowed)", ErrNotCaughtUp, id, match, last, c.cfg.promoteMaxLag)
	}
	return nil
}

// handleReady does what raft asked, in the order its Ready contract says:
// persist the snapshot, entries and HardState (fsynced), then send, then
// apply. A storage error kills the core: the log's state is unknown.
func (c *core) handleReady() error {
	if c.err != nil {
		return c.err
	}
	if err := c.handleReadyErr(); err != nil {
		c.fail(err)
		return err
	}
	return nil
}

func (c *core) fail(err error) {
	c.err = fmt.Errorf("%w: %w", ErrStopped, err)
	for _, tag := range sortedKeys(c.unindexed) {
		c.unindexed[tag].finish(0, nil, c.err)
	}
	for _, i := range sortedKeys(c.byIndex) {
		c.byIndex[i].finish(0, nil, c.err)
	}
	for _, tag := range sortedKeys(c.reads) {
		c.reads[tag].done(0, nil, c.err)
	}
	for _, r := range c.readyReads {
		r.done(0, nil, c.err)
	}
	c.unindexed, c.byIndex, c.reads, c.readyReads = map[uint64]*proposal{}, map[uint64]*proposal{}, map[uint64]*read{}, nil
}

func (c *core) handleReadyErr() error {
	for c.rn.HasReady() {
		rd := c.rn.Ready()
		if !raft.IsEmptySnap(rd.Snapshot) {
			if err := c.storage.SaveSnapshot(rd.Snapshot, rd.HardState); err != nil {
				return err
			}
			if err := c.restore(rd.Snapshot); err != nil {
				return err
			}
		}
		if err := c.storage.Save(rd.HardState, rd.Entries, rd.MustSync); err != nil {
			return err
		}
		c.indexProposals(rd.Entries)
		c.cfg.send(rd.Messages)
		if err := c.apply(rd.CommittedEntries); err != nil {
			return err
		}
		for _, rs := range rd.ReadStates {
			if len(rs.RequestCtx) != 8 {
				continue
			}
			if r, ok := c.reads[binary.BigEndian.Uint64(rs.RequestCtx)]; ok {
				delete(c.reads, r.tag)
				r.index = rs.Index
				c.readyReads = append(c.readyReads, r)
			}
		}
		c.finishReads()
		c.rn.Advance(rd)
		c.noteLeader(rd.HardState)
	}
	c.maybeSnapshot()
	return nil
}

// indexProposals records where our proposals landed. Raft appends an
// accepted proposal to the very next Ready, so one not there was dropped
// (raft turns a conf change it ignores into an empty entry).
func (c *core) indexProposals(ents []raftpb.Entry) {
	for i := range ents {
		tag, ok := c.entryTag(&ents[i])
		if !ok {
			continue
		}
		if p, ok := c.unindexed[tag]; ok {
			delete(c.unindexed, tag)
			c.byIndex[ents[i].Index] = p
		}
	}
	for _, tag := range sortedKeys(c.unindexed) {
		p := c.unindexed[tag]
		delete(c.unindexed, tag)
		p.finish(0, nil, fmt.Errorf("%w: raft did not append it", ErrProposalDropped))
	}
}

// entryTag returns the tag of e if this member proposed it.
func (c *core) entryTag(e *raftpb.Entry) (uint64, bool) {
	switch e.Type {
	case raftpb.EntryNormal:
		if len(e.Data) < entryHeaderLen || binary.BigEndian.Uint64(e.Data) != c.cfg.id {
			return 0, false
		}
		return binary.BigEndian.Uint64(e.Data[8:]), true
	case raftpb.EntryConfChange:
		var cc raftpb.ConfChange
		if cc.Unmarshal(e.Data) != nil || cc.ID == 0 {
			return 0, false
		}
		return cc.ID, true
	}
	return 0, false
}

func (c *core) apply(ents []raftpb.Entry) error {
	for i := range ents {
		e := &ents[i]
		if e.Index <= c.applied {
			continue
		}
		var result any
		switch e.Type {
		case raftpb.EntryNormal:
			if len(e.Data) >= entryHeaderLen {
				result = c.sm.Apply(e.Index, e.Data[entryHeaderLen:])
			} else if len(e.Data) > 0 {
				return fmt.Errorf("%w: entry %d has %d bytes, shorter than its header", ErrCorrupt, e.Index, len(e.Data))
			}
		case raftpb.EntryConfChange:
			var cc raftpb.ConfChange
			if err := cc.Unmarshal(e.Data); err != nil {
				return fmt.Errorf("%w: conf change at %d: %v", ErrCorrupt, e.Index, err)
			}
			c.applyConfChange(cc)
		case raftpb.EntryConfChangeV2:
			var cc raftpb.ConfChangeV2
			if err := cc.Unmarshal(e.Data); err != nil {
				return fmt.Errorf("%w: conf change at %d: %v", ErrCorrupt, e.Index, err)
			}
			c.confState = *c.rn.ApplyConfChange(cc)
		}
		c.applied = e.Index
		if p, ok := c.byIndex[e.Index]; ok {
			delete(c.byIndex, e.Index)
			if tag, ours := c.entryTag(e); ours && tag == p.tag {
				p.finish(e.Index, result, nil)
			} else {
				p.finish(e.Index, nil, fmt.Errorf("%w: another entry was committed at index %d", ErrProposalDropped, e.Index))
			}
		}
	}
	return nil
}

func (c *core) applyConfChange(cc raftpb.ConfChange) {
	c.confState = *c.rn.ApplyConfChange(cc)
	c.membersChanged = true
	switch cc.Type {
	case raftpb.ConfChangeAddNode, raftpb.ConfChangeAddLearnerNode:
		if len(cc.Context) > 0 {
			c.members[cc.NodeID] = string(cc.Context)
		}
		if cc.NodeID != c.cfg.id {
			c.cfg.setPeer(cc.NodeID, c.members[cc.NodeID])
		}
	case raftpb.ConfChangeRemoveNode:
		delete(c.members, cc.NodeID)
		if cc.NodeID == c.cfg.id {
			c.removed = true
		} else {
			c.cfg.removePeer(cc.NodeID)
		}
	}
}

func (c *core) finishReads() {
	keep := c.readyReads[:0]
	for _, r := range c.readyReads {
		if r.index <= c.applied {
			r.done(r.index, nil, nil)
		} else {
			keep = append(keep, r)
		}
	}
	c.readyReads = keep
}

// noteLeader tells the hook when the leader, our role or the term changed.
func (c *core) noteLeader(hs raftpb.HardState) {
	st := c.rn.BasicStatus()
	leading := st.RaftState == raft.StateLeader
	if st.Lead == c.lead && leading == c.leading && st.Term == c.term {
		return
	}
	leaderChanged := st.Lead != c.lead
	c.lead, c.leading, c.term = st.Lead, leading, st.Term
	if leaderChanged {
		c.retryReads()
	}
	if c.cfg.onLeaderChange != nil {
		c.cfg.onLeaderChange(LeaderChange{Term: st.Term, Leader: st.Lead, LeaderAddr: c.members[st.Lead], IsLeader: leading})
	}
}

// maybeSnapshot takes a snapshot once snapshotEvery entries were applied
// since the last one, and hands it to the takeSnapshot hook to be written
// off this goroutine; snapshotWritten then compacts the log.
func (c *core) maybeSnapshot() {
	if c.snapBusy || c.cfg.snapshotEvery == 0 || c.applied < c.snapIndex+c.cfg.snapshotEvery {
		return
	}
	data, err := c.sm.Snapshot()
	if err != nil {
		c.cfg.logger.Error("raftnode: state machine snapshot failed; retrying later", "index", c.applied, "err", err)
		return
	}
	term, err := c.storage.Term(c.applied)
	if err != nil {
		c.cfg.logger.Error("raftnode: term of the applied index", "index", c.applied, "err", err)
		return
	}
	snap := raftpb.Snapshot{
		Data:     encodeSnapshotData(c.members, data),
		Metadata: raftpb.SnapshotMetadata{Index: c.applied, Term: term, ConfState: c.confState},
	}
	c.snapBusy = true
	c.cfg.takeSnapshot(snap)
}

// snapshotWritten finishes a snapshot whose file is durable (err nil) or
// failed to be written.
func (c *core) snapshotWritten(snap raftpb.Snapshot, err error) error {
	c.snapBusy = false
	if c.err != nil {
		return c.err
	}
	if err != nil {
		c.cfg.logger.Error("raftnode: write snapshot failed; retrying later", "index", snap.Metadata.Index, "err", err)
		return nil
	}
	if err := c.storage.Compact(snap, c.cfg.keepEntries); err != nil {
		c.fail(err)
		return c.err
	}
	c.snapIndex = max(c.snapIndex, snap.Metadata.Index)
	return nil
}

// sortedKeys returns m's keys in order: the core visits maps in a fixed
// order so that a simulation replays exactly from its seed.
func sortedKeys[V any](m map[uint64]V) []uint64 {
	keys := make([]uint64, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// answerPublished gives the answers held for after the Status publish.
func (c *core) answerPublished() {
	for _, f := range c.afterPublish {
		f()
	}
	c.afterPublish = c.afterPublish[:0]
}

package raftnode

import (
	"log/slog"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Exports for the lease simulation (leasesim_test.go), which is in package
// raftnode_test because it imports tablemaster and tableserver, and
// tablemaster imports this package.

const RaceEnabled = raceEnabled

var WithSeededCryptoRand = withSeededCryptoRand

// SimCore is a member's deterministic core for a simulation driven from
// one goroutine: its snapshots are written synchronously by Ready.
type SimCore struct {
	c     *core
	snaps []raftpb.Snapshot
}

// SimCoreConfig configures NewSimCore.
type SimCoreConfig struct {
	ID                         uint64
	ElectionTicks              int
	SnapshotEvery, KeepEntries uint64
	Incarnation                uint32
	Transport                  Transport
	OnLeaderChange             func(LeaderChange)
}

func NewSimCore(cfg SimCoreConfig, st *Storage, sm StateMachine, peers map[uint64]string) (*SimCore, error) {
	s := &SimCore{}
	c, err := newCore(coreConfig{
		id: cfg.ID, electionTick: cfg.ElectionTicks, heartbeatTick: 1,
		snapshotEvery: cfg.SnapshotEvery, keepEntries: cfg.KeepEntries, promoteMaxLag: 5,
		incarnation: cfg.Incarnation, logger: slog.New(slog.DiscardHandler),
		send: cfg.Transport.Send, setPeer: cfg.Transport.SetPeer, removePeer: cfg.Transport.RemovePeer,
		takeSnapshot:   func(snap raftpb.Snapshot) { s.snaps = append(s.snaps, snap) },
		onLeaderChange: cfg.OnLeaderChange,
	}, st, sm, peers)
	if err != nil {
		return nil, err
	}
	s.c = c
	return s, nil
}

func (s *SimCore) Tick()                 { s.c.tick() }
func (s *SimCore) Step(m raftpb.Message) { s.c.step(m) }

// Ready handles everything raft has ready, then writes the snapshots taken.
func (s *SimCore) Ready() error {
	defer s.c.answerPublished() // no Status here: conf changes are answered at once
	if err := s.c.handleReady(); err != nil {
		return err
	}
	for len(s.snaps) > 0 {
		snap := s.snaps[0]
		s.snaps = s.snaps[1:]
		if err := s.c.snapshotWritten(snap, s.c.storage.WriteSnapshotFile(snap)); err != nil {
			return err
		}
		if err := s.c.handleReady(); err != nil {
			return err
		}
	}
	return nil
}

func (s *SimCore) Propose(data []byte, d func(index uint64, result any, err error)) {
	s.c.propose(data, d)
}
func (s *SimCore) ReadIndex(d func(index uint64, result any, err error)) { s.c.readIndex(d) }
func (s *SimCore) Leading() bool                                         { return s.c.leading }
func (s *SimCore) Term() uint64                                          { return s.c.term }
func (s *SimCore) Lead() uint64                                          { return s.c.lead }
func (s *SimCore) Applied() uint64                                       { return s.c.applied }
func (s *SimCore) Voters() []uint64                                      { return s.c.confState.Voters }
func (s *SimCore) TransferLeader(to uint64)                              { s.c.rn.TransferLeader(to) }
func (s *SimCore) ReportUnreachable(id uint64)                           { s.c.rn.ReportUnreachable(id) }
func (s *SimCore) ReportSnapshot(id uint64, failed bool) {
	st := raft.SnapshotFinish
	if failed {
		st = raft.SnapshotFailure
	}
	s.c.rn.ReportSnapshot(id, st)
}
func (s *SimCore) Close() error { return s.c.storage.Close() }

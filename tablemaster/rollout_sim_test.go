package tablemaster

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tabuladb/tabula/replication/stream"
)

var rolloutScenarios = flag.Int("rollout-scenarios", 2000, "seeded rollout scenarios TestRolloutSimulation runs")

// TestRolloutSimulation drives bulk rollouts through random interleavings
// of publishes (full and delta), stores, load reports from the copies
// holding a version, pauses, resumes, aborts, servers dying and coming
// back, and time passing, checking after every command that:
//
//   - a copy serves only a retained version it reported loaded (with its
//     delta bases), and holds only retained versions;
//   - until a server dies, every version a copy serves has a copy
//     serving it in every partition (a batch that picks a version finds
//     it everywhere; after a death, the SDK picks another version);
//   - no partition has more than one copy beyond its factor that is not
//     leaving (the spare room is one row);
//   - the current version is retained and stored.
//
// Then every server comes back and every copy loads what it holds: the
// rollout must finish, every copy serving the newest version with the
// table's copies. Every failure prints its seed.
func TestRolloutSimulation(t *testing.T) {
	n := *rolloutScenarios
	if testing.Short() {
		n = min(n, 200)
	}
	for seed := range uint64(n) {
		if err := rolloutScenario(seed); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
}

// rolloutTrace, when set, is told every command of a scenario and the
// copies after it (debugging a seed).
var rolloutTrace func(string)

func rolloutScenario(seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	s := NewState()
	servers := 4 + rng.IntN(3)
	apply := func(c Command) (Result, error) {
		res, err := s.Apply(c)
		if rolloutTrace != nil && c.Op() != OpStream {
			rolloutTrace(fmt.Sprintf("%s %+v t=%d -> changed=%v err=%v", c.Op(), c.Payload, c.UnixMs, res.Changed, err))
			if t := s.Tables["default/b"]; t != nil && t.Bulk != nil {
				for i, p := range t.Partitions {
					var cs []string
					for _, r := range p.Replicas {
						cs = append(cs, fmt.Sprintf("%s:s%d/n%d/d%d/l%v", r.ServerID, r.BulkServes, r.BulkNext, r.BulkDrop, r.BulkLeaving))
					}
					rolloutTrace(fmt.Sprintf("   p%d %v", i, cs))
				}
				if ro := t.Bulk.Rollout; ro != nil {
					rolloutTrace(fmt.Sprintf("   rollout %+v", *ro))
				}
			}
		}
		return res, err
	}
	if _, err := apply(Command{Payload: CreateTenant{Tenant: "default"}}); err != nil {
		return err
	}
	ids := make([]string, servers)
	for i := range ids {
		ids[i] = fmt.Sprintf("s%d", i+1)
		reg := RegisterServer{ServerID: ids[i], Addr: fmt.Sprintf("h%d:1", i+1), FaultDomain: fmt.Sprintf("fd-%d", i+1)}
		if rng.IntN(3) == 0 {
			reg.BulkCapacity = uint64(200 + rng.IntN(600))
		}
		if _, err := apply(Command{Payload: reg}); err != nil {
			return err
		}
	}
	parts := 1 + rng.IntN(4)
	if _, err := apply(Command{Payload: CreateTable{Tenant: "default", Table: "b", Kind: bulkKind, Options: &TableOptions{Partitions: uint32(parts), Replication: 3}}}); err != nil {
		return err
	}
	tb := func() *Table { return s.Tables["default/b"] }
	now := int64(1000)
	var next uint64 = 1
	down := map[string]bool{}
	allAliveSince := true // no server died yet: its copies' loss would break the row symmetry
	filesOf := func(v uint64) []BulkFile {
		fs := make([]BulkFile, parts)
		for i := range fs {
			fs[i] = BulkFile{Size: uint64(50 + rng.IntN(100)), CRC: uint32(v*100) + uint32(i), Records: 1}
		}
		return fs
	}
	store := func(v uint64) error {
		t := tb()
		k := t.Bulk.version(v)
		if k < 0 || !t.Bulk.Versions[k].Streams {
			return nil
		}
		for i := range parts {
			if t.Bulk.Versions[k].Files[i].Stream != "" {
				continue
			}
			name := BulkStreamName(t.ID, v, i)
			if _, _, err := s.StreamManager().Stream(name); err != nil {
				// As a publisher leaves it: one sealed extent.
				if _, err := apply(Command{Payload: StreamCommand{StreamCmd: &stream.Command{Op: stream.OpCreateStream, Stream: name}}}); err != nil {
					return fmt.Errorf("create stream %s: %w", name, err)
				}
				res, err := apply(Command{Payload: StreamCommand{StreamCmd: &stream.Command{Op: stream.OpAllocate, Stream: name}}})
				if err != nil {
					// Too few live nodes now: the publisher retries later.
					_, _ = apply(Command{Payload: StreamCommand{StreamCmd: &stream.Command{Op: stream.OpDeleteStream, Stream: name}}})
					return nil
				}
				if _, err := apply(Command{Payload: StreamCommand{StreamCmd: &stream.Command{Op: stream.OpSeal, Extent: res.Stream.Extent, Length: 1000}}}); err != nil {
					return fmt.Errorf("seal stream %s: %w", name, err)
				}
			}
			if _, err := apply(Command{UnixMs: now, Payload: BulkStored{Tenant: "default", Table: "b", Version: v, PartitionID: uint64(i), Stream: name}}); err != nil {
				return fmt.Errorf("store %d/%d: %w", v, i, err)
			}
		}
		return nil
	}
	// report has one random live copy report one version it holds.
	report := func(all bool) error {
		t := tb()
		type rep struct {
			i      int
			server string
			v      uint64
		}
		var reps []rep
		for i := range t.Partitions {
			for k := range t.Partitions[i].Replicas {
				r := &t.Partitions[i].Replicas[k]
				if down[r.ServerID] {
					continue
				}
				for _, v := range t.copyHolds(i, r) {
					if !t.Bulk.Versions[t.Bulk.version(v)].loadedBy(i, r.ServerID) {
						reps = append(reps, rep{i, r.ServerID, v})
					}
				}
			}
		}
		if len(reps) == 0 {
			return nil
		}
		if !all {
			reps = []rep{reps[rng.IntN(len(reps))]}
		}
		for _, x := range reps {
			t := tb()
			k := t.Bulk.version(x.v)
			if k < 0 {
				continue
			}
			f := t.Bulk.Versions[k].Files[x.i]
			f.Stream = ""
			if _, err := apply(Command{UnixMs: now, Payload: BulkLoaded{Tenant: "default", Table: "b", Version: x.v, PartitionID: t.Partitions[x.i].ID, ServerID: x.server, File: &f}}); err != nil {
				return fmt.Errorf("load report %+v: %w", x, err)
			}
		}
		return nil
	}
	steps := 40 + rng.IntN(80)
	for step := range steps {
		switch op := rng.IntN(20); {
		case op < 3:
			t := tb()
			base := uint64(0)
			if t.Bulk.Current != 0 && rng.IntN(3) == 0 {
				base = t.Bulk.Current
			}
			if _, err := apply(publish(next, base, filesOf(next))); err == nil {
				next++
			}
		case op < 5:
			t := tb()
			for _, v := range t.Bulk.Versions {
				if v.State == BulkLoading {
					if err := store(v.Version); err != nil {
						return err
					}
				}
			}
		case op < 12:
			if err := report(false); err != nil {
				return err
			}
		case op < 14:
			now += int64(rng.IntN(2 * bulkDrainMs))
			if _, err := apply(Command{UnixMs: now, Payload: BulkAdvance{Tenant: "default", Table: "b"}}); err != nil {
				return err
			}
		case op == 14:
			action := []string{RolloutPause, RolloutResume, RolloutAbort}[rng.IntN(3)]
			_, _ = apply(Command{UnixMs: now, Payload: BulkRolloutAction{Tenant: "default", Table: "b", Action: action}})
		case op == 15:
			t := tb()
			if t.Bulk.Rows && len(t.Bulk.Versions) > 1 && rng.IntN(2) == 0 {
				v := t.Bulk.Versions[rng.IntN(len(t.Bulk.Versions))].Version
				_, _ = apply(Command{UnixMs: now, Payload: BulkRollback{Tenant: "default", Table: "b", Version: v}})
			}
		case op < 18:
			// A server dies (at most two down: placement keeps going).
			id := ids[rng.IntN(len(ids))]
			if !down[id] && len(down) < 2 {
				down[id] = true
				allAliveSince = false
				if _, err := apply(Command{UnixMs: now, Payload: ServerDown{ServerID: id}}); err != nil {
					return fmt.Errorf("down %s: %w", id, err)
				}
			}
		default:
			for id := range down {
				delete(down, id)
				k := slices.Index(ids, id)
				if _, err := apply(register(id, fmt.Sprintf("h%d:1", k+1), fmt.Sprintf("fd-%d", k+1))); err != nil {
					return fmt.Errorf("back %s: %w", id, err)
				}
				break
			}
		}
		if err := rolloutInvariants(tb(), allAliveSince && len(down) == 0); err != nil {
			return fmt.Errorf("step %d: %w", step, err)
		}
	}
	// Every server back without a capacity limit (a rollout short of
	// room waits for the operator, rightly), resume, store, load, time:
	// the rollout ends.
	for k, id := range ids {
		if _, err := apply(register(id, fmt.Sprintf("h%d:1", k+1), fmt.Sprintf("fd-%d", k+1))); err != nil {
			return err
		}
	}
	down = map[string]bool{}
	if tb().Bulk.Rollout != nil && tb().Bulk.Rollout.Paused {
		if _, err := apply(Command{UnixMs: now, Payload: BulkRolloutAction{Tenant: "default", Table: "b", Action: RolloutResume}}); err != nil {
			return err
		}
	}
	for round := 0; ; round++ {
		if round > 50 {
			return fmt.Errorf("the rollout did not finish: %+v; copies %+v", tb().Bulk.Rollout, tb().Partitions)
		}
		for _, v := range tb().Bulk.Versions {
			if err := store(v.Version); err != nil {
				return err
			}
		}
		if err := report(true); err != nil {
			return err
		}
		now += 2 * bulkDrainMs
		if _, err := apply(Command{UnixMs: now, Payload: BulkAdvance{Tenant: "default", Table: "b"}}); err != nil {
			return err
		}
		// The master's placement loop fills partitions short of copies.
		if _, err := apply(Command{UnixMs: now, Payload: PlaceShort{}}); err != nil {
			return err
		}
		if err := rolloutInvariants(tb(), false); err != nil {
			return fmt.Errorf("finishing: %w", err)
		}
		t := tb()
		if t.Bulk.Rollout == nil && !t.bulkCopiesLoading() && !t.bulkDropsPending() && !s.placeable() {
			break
		}
	}
	t := tb()
	if t.Bulk.Current == 0 {
		return nil // nothing ever published through
	}
	for i, p := range t.Partitions {
		if len(p.Replicas) != 3 {
			return fmt.Errorf("partition %d ends with %d copies: %+v", i, len(p.Replicas), p.Replicas)
		}
		for _, r := range p.Replicas {
			if t.Bulk.Rows && r.BulkServes != t.Bulk.Current {
				return fmt.Errorf("partition %d: a copy serves %d, the table %d: %+v", i, r.BulkServes, t.Bulk.Current, p.Replicas)
			}
		}
	}
	return nil
}

// rolloutInvariants checks the invariants TestRolloutSimulation states.
func rolloutInvariants(t *Table, consistent bool) error {
	b := t.Bulk
	if b.Current != 0 {
		k := b.version(b.Current)
		if k < 0 {
			return fmt.Errorf("current version %d is not retained", b.Current)
		}
		if !b.Versions[k].bulkStored() {
			return fmt.Errorf("current version %d is not stored", b.Current)
		}
	}
	if !b.Rows {
		return nil
	}
	served := map[uint64]int{} // version -> partitions with a copy serving it
	for i := range t.Partitions {
		p := &t.Partitions[i]
		extra := 0
		here := map[uint64]bool{}
		for k := range p.Replicas {
			r := &p.Replicas[k]
			if !r.BulkLeaving {
				extra++
			}
			for _, v := range t.copyHolds(i, r) {
				if b.version(v) < 0 {
					return fmt.Errorf("partition %d: copy %s holds version %d, not retained", i, r.ServerID, v)
				}
			}
			if r.BulkServes == 0 {
				continue
			}
			if b.version(r.BulkServes) < 0 {
				return fmt.Errorf("partition %d: copy %s serves version %d, not retained", i, r.ServerID, r.BulkServes)
			}
			if !t.copyLoaded(i, r.ServerID, r.BulkServes) {
				return fmt.Errorf("partition %d: copy %s serves version %d it has not loaded", i, r.ServerID, r.BulkServes)
			}
			here[r.BulkServes] = true
		}
		if extra > int(t.Options.Replication)+1 {
			return fmt.Errorf("partition %d has %d copies not leaving, factor %d: %+v", i, extra, t.Options.Replication, p.Replicas)
		}
		for v := range here {
			served[v]++
		}
	}
	if consistent {
		for v, n := range served {
			if n != len(t.Partitions) {
				return fmt.Errorf("version %d is served in %d of %d partitions", v, n, len(t.Partitions))
			}
		}
	}
	return nil
}

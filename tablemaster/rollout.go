package tablemaster

import (
	"fmt"
	"slices"

	"github.com/tabuladb/tabula/api"
)

// Row-by-row rollout of bulk versions. A bulk table whose
// versions go through streams keeps one version per serving copy
// (BulkState.Rows): each copy serves one version (Replica.BulkServes) and
// loads at most one more (Replica.BulkNext); retained versions that no copy
// serves live in their streams only. A new version (a publish, or a
// rollback to a retained one) rolls out one row at a time, where a row is
// one copy of every partition:
//
//  1. each partition gets a copy that loads the version: an extra copy on
//     a server with room for the file (memory headroom, Server.BulkCapacity),
//     or, where no server has room, the copy being replaced loads it beside
//     the version it serves;
//  2. once every partition's row copy has it loaded (and every file is
//     stored), one command switches the row: those copies serve the new
//     version, and each partition that got an extra copy drops one copy of
//     an older version (the oldest row), so the spare capacity a rollout
//     needs is one row;
//  3. repeat until every copy serves the version; then it is the table's
//     current version and retention drops the versions beyond it.
//
// Reads keep full capacity throughout: the row loading serves its old
// version until it switches. A request reads one version (the client sends
// it to copies serving it), and every partition has a copy of each version
// being served, because a row switches on every partition at once.
//
// The rollout lives in the replicated state, so a new master leader goes on
// where the old one stopped. Pause stops switching rows, resume goes on,
// abort rolls the switched rows back and drops the version. The first
// version of a table loads on every copy at once (there is nothing to keep
// serving) and switches when all have it. Versions without streams (a cluster with fewer than three fault
// domains) switch all copies at once, as before rollouts (bulkMaybeSwitch).
// A version loading that no copy serves yet is abandoned by a newer publish,
// as before; one that some copy serves must finish or be aborted first.

// BulkRollout is a rollout under way; see rollout.go.
type BulkRollout struct {
	Version uint64 `json:"version"`
	// From is the version it replaces (0: the table's first).
	From uint64 `json:"from,omitempty"`
	// Rows is the copies per partition when it started.
	Rows   int  `json:"rows"`
	Paused bool `json:"paused,omitempty"`
	// Aborting: an abort turned the rollout back to From; Abandon is the
	// version dropped when it finishes.
	Aborting bool   `json:"aborting,omitempty"`
	Abandon  uint64 `json:"abandon,omitempty"`
	// RowsDone counts row switches, for status.
	RowsDone         int   `json:"rows_done,omitempty"`
	StartedUnixMs    int64 `json:"started_unix_ms,omitempty"`
	RowStartedUnixMs int64 `json:"row_started_unix_ms,omitempty"`
	// Waiting says why the row cannot go on ("": loading, or switching).
	Waiting string `json:"waiting,omitempty"`
}

// OpBulkRollout pauses (Action "pause"), resumes ("resume") or aborts
// ("abort") bulk table Tenant/Table's rollout; OpBulkAdvance re-evaluates
// it (room freed on a server, a server back): the master's rollout loop
// proposes it, and it is a no-op when nothing can proceed.
const (
	OpBulkRollout Op = "bulk_rollout"
	OpBulkAdvance Op = "bulk_advance"
)

// Rollout actions (Command.Action).
const (
	RolloutPause  = "pause"
	RolloutResume = "resume"
	RolloutAbort  = "abort"
)

// bulkTarget is the version a new copy of t loads: the rollout's, else the
// current one.
func (t *Table) bulkTarget() uint64 {
	if r := t.Bulk.Rollout; r != nil {
		return r.Version
	}
	return t.Bulk.Current
}

// bulkDrainMs is how long a copy keeps the version it stopped serving at
// a row switch (and a copy of the replaced row stays), so reads routed by
// a map from before the switch finish rather than retry.
const bulkDrainMs = 1000

// copyNext is the version copy r of t loads to serve next (0: none). A
// copy placed since the last row switch (a replacement, or every copy of a
// new table) serves nothing yet and loads the table's target.
func (t *Table) copyNext(r *Replica) uint64 {
	if !t.Bulk.Rows || r.BulkLeaving {
		return 0
	}
	if r.BulkNext != 0 {
		return r.BulkNext
	}
	if r.BulkServes == 0 {
		return t.bulkTarget()
	}
	return 0
}

// copyServes is the version copy r of t serves reads of (0: none).
func (t *Table) copyServes(r *Replica) uint64 {
	if !t.Bulk.Rows {
		return t.Bulk.Current
	}
	return r.BulkServes
}

// chain is version v and the bases it overlays, newest first (nil for 0
// or a version no longer retained).
func (b *BulkState) chain(v uint64) []uint64 {
	var out []uint64
	for v != 0 && !slices.Contains(out, v) {
		k := b.version(v)
		if k < 0 {
			break
		}
		out = append(out, v)
		v = b.Versions[k].Base
	}
	return out
}

// copyHolds lists the versions copy r of partition i of t holds loaded or
// loads: what its server keeps. Before rows (and for versions without
// streams) every copy holds every retained version.
func (t *Table) copyHolds(i int, r *Replica) []uint64 {
	b := t.Bulk
	if !b.Rows {
		return t.BulkRetained()
	}
	out := b.chain(r.BulkServes)
	for _, v := range append(b.chain(t.copyNext(r)), b.chain(r.BulkDrop)...) {
		if !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	// A version being published whose file is not stored yet: the
	// partition's upload copy (its row copy, else its first) takes the
	// publisher's upload and stores it.
	for k := range b.Versions {
		v := &b.Versions[k]
		if v.State != BulkLoading || !v.Streams || i >= len(v.Files) || v.Files[i].Stream != "" || slices.Contains(out, v.Version) {
			continue
		}
		p := &t.Partitions[i]
		up := -1
		if v.Base != 0 {
			// A delta goes where its base is loaded.
			up = slices.IndexFunc(p.Replicas, func(c Replica) bool { return c.BulkServes == v.Base })
		}
		if up < 0 {
			up = slices.IndexFunc(p.Replicas, func(c Replica) bool { return t.copyNext(&c) == v.Version })
		}
		if up < 0 {
			up = 0
		}
		if p.Replicas[up].ServerID == r.ServerID {
			out = append(out, v.Version)
		}
	}
	slices.Sort(out)
	return out
}

// copyLoaded reports whether server has every version of v's chain loaded
// as partition i of t.
func (t *Table) copyLoaded(i int, server string, v uint64) bool {
	ch := t.Bulk.chain(v)
	if len(ch) == 0 {
		return false
	}
	for _, x := range ch {
		if !t.Bulk.Versions[t.Bulk.version(x)].loadedBy(i, server) {
			return false
		}
	}
	return true
}

// servedLoading returns a version still loading (rolling out, or being
// aborted) that some copy of t serves, or 0.
func (t *Table) servedLoading() uint64 {
	if !t.Bulk.Rows {
		return 0
	}
	for _, v := range t.Bulk.Versions {
		if v.State != BulkLoading {
			continue
		}
		for i := range t.Partitions {
			if slices.ContainsFunc(t.Partitions[i].Replicas, func(r Replica) bool { return r.BulkServes == v.Version }) {
				return v.Version
			}
		}
	}
	return 0
}

// rowsLoaded is bulkLoaded for a table with rows: every copy that holds bv
// has it loaded, and some copy holds it.
func (t *Table) rowsLoaded(bv *BulkVersion, i int) bool {
	p := &t.Partitions[i]
	held := false
	for k := range p.Replicas {
		r := &p.Replicas[k]
		if !slices.Contains(t.copyHolds(i, r), bv.Version) {
			continue
		}
		held = true
		if !bv.loadedBy(i, r.ServerID) {
			return false
		}
	}
	return held
}

// pruneLoaded drops, in rows mode, the load records of copies that no
// longer hold a version: they unload it, and one that holds it again later
// must load it again before it counts.
func (t *Table) pruneLoaded() {
	b := t.Bulk
	if !b.Rows {
		return
	}
	for k := range b.Versions {
		bv := &b.Versions[k]
		for i := range bv.LoadedBy {
			if i >= len(t.Partitions) || len(bv.LoadedBy[i]) == 0 {
				continue
			}
			p := &t.Partitions[i]
			keep := slices.DeleteFunc(slices.Clone(bv.LoadedBy[i]), func(server string) bool {
				c := slices.IndexFunc(p.Replicas, func(r Replica) bool { return r.ServerID == server })
				return c < 0 || !slices.Contains(t.copyHolds(i, &p.Replicas[c]), bv.Version)
			})
			if len(keep) != len(bv.LoadedBy[i]) {
				bv.LoadedBy[i] = keep
			}
		}
		if len(bv.LoadedOn) > 0 {
			bv.LoadedOn = nil // the form before copies; rows record LoadedBy
		}
	}
}

// startRollout begins rolling version v out on t (a publish through
// streams, or a rollback in rows mode). A table still holding every
// version on every copy turns to rows: each copy serves the current
// version where it has it loaded.
func (s *State) startRollout(t *Table, v uint64, unixMs int64) {
	b := t.Bulk
	if !b.Rows {
		b.Rows = true
		for i := range t.Partitions {
			p := &t.Partitions[i]
			for k := range p.Replicas {
				r := &p.Replicas[k]
				r.BulkServes, r.BulkNext = 0, 0
				if b.Current != 0 && t.copyLoaded(i, r.ServerID, b.Current) {
					r.BulkServes = b.Current
				}
			}
		}
	}
	b.Rollout = &BulkRollout{Version: v, From: b.Current, Rows: int(t.Options.Replication), StartedUnixMs: unixMs, RowStartedUnixMs: unixMs}
}

// leaveRows turns t back to every copy holding every retained version (a
// version published without streams: its files reach every copy by
// upload, and it switches all copies at once).
func (t *Table) leaveRows() {
	b := t.Bulk
	if !b.Rows {
		return
	}
	b.Rows, b.Rollout = false, nil
	for i := range t.Partitions {
		p := &t.Partitions[i]
		p.Replicas = slices.DeleteFunc(p.Replicas, func(r Replica) bool {
			return (r.BulkLeaving || r.BulkServes == 0 && len(p.Replicas) > int(t.Options.Replication)) && r.Role != api.ReplicaRole_REPLICA_ROLE_PRIMARY
		})
		for k := range p.Replicas {
			r := &p.Replicas[k]
			r.BulkServes, r.BulkNext, r.BulkDrop, r.BulkDropAtMs, r.BulkLeaving = 0, 0, 0, 0, false
		}
	}
}

// cancelRow undoes the row loading version v: extra copies that serve
// nothing leave (down to the table's copies), the others stop loading it.
func (s *State) cancelRow(t *Table, v uint64) {
	n := int(t.Options.Replication)
	for i := range t.Partitions {
		p := &t.Partitions[i]
		for k := len(p.Replicas) - 1; k >= 0; k-- {
			r := &p.Replicas[k]
			if t.copyNext(r) != v {
				continue
			}
			if r.BulkServes == 0 && len(p.Replicas) > n && r.Role != api.ReplicaRole_REPLICA_ROLE_PRIMARY {
				t.Bulk.forgetLoaded(i, r.ServerID)
				p.Replicas = slices.Delete(p.Replicas, k, k+1)
				continue
			}
			r.BulkNext = 0
		}
	}
}

// bulkAdvance moves t's copies and rollout on as far as they can go now;
// it reports whether it changed anything. A copy loading outside a row (a
// replacement) serves once loaded, on its own; a rollout's rows switch
// together (a table's first version: every copy at once, when all have
// it).
func (s *State) bulkAdvance(t *Table, unixMs int64) bool {
	b := t.Bulk
	if !b.Rows {
		return false
	}
	changed := false
	ro := b.Rollout
	for i := range t.Partitions {
		p := &t.Partitions[i]
		for k := len(p.Replicas) - 1; k >= 0; k-- {
			r := &p.Replicas[k]
			if r.BulkDropAtMs == 0 || unixMs < r.BulkDropAtMs {
				continue
			}
			changed = true
			if r.BulkLeaving {
				s.dropCopy(t, i, k)
				continue
			}
			r.BulkDrop, r.BulkDropAtMs = 0, 0
		}
		for k := range p.Replicas {
			r := &p.Replicas[k]
			next := t.copyNext(r)
			if next == 0 || ro != nil && next == ro.Version {
				continue // nothing to load, or it switches with its row
			}
			if t.copyLoaded(i, r.ServerID, next) {
				r.BulkServes, r.BulkNext = next, 0
				changed = true
			}
		}
	}
	if ro == nil {
		return changed
	}
	v := b.version(ro.Version)
	if v < 0 {
		// Gone meanwhile (dropped by retention is not possible while
		// rolling; defensive): nothing to roll out.
		b.Rollout = nil
		return true
	}
	setWaiting := func(why string) {
		if ro.Waiting != why {
			ro.Waiting = why
			changed = true
		}
	}
	for {
		if s.rolloutFinished(t) {
			s.finishRollout(t, unixMs)
			return true
		}
		if ro.Paused {
			return changed
		}
		if t.bulkLeaving() {
			// The replaced row drains first (bulkDrainMs): the spare
			// room a rollout takes stays one row.
			setWaiting("")
			return changed
		}
		bv := &b.Versions[b.version(ro.Version)]
		if bv.Error != "" {
			setWaiting("a server refused the version's file: " + bv.Error)
			return changed
		}
		if why := s.assignRow(t); why != "" {
			setWaiting(why)
			// Rows already assigned go on loading; the others wait.
			return true
		}
		if !bv.bulkStored() {
			setWaiting("the files are being stored in streams")
			return true
		}
		for i := range t.Partitions {
			p := &t.Partitions[i]
			for k := range p.Replicas {
				r := &p.Replicas[k]
				if t.copyNext(r) == ro.Version && !t.copyLoaded(i, r.ServerID, ro.Version) {
					setWaiting("")
					return true
				}
			}
		}
		s.switchRow(t, unixMs)
		changed = true
	}
}

// rolloutFinished reports whether every copy of t serves the rollout's
// version (and no partition is left without copies).
func (s *State) rolloutFinished(t *Table) bool {
	v := t.Bulk.Rollout.Version
	for i := range t.Partitions {
		p := &t.Partitions[i]
		if len(p.Replicas) == 0 {
			return false
		}
		for k := range p.Replicas {
			if r := &p.Replicas[k]; !r.BulkLeaving && (r.BulkServes != v || r.BulkNext != 0) {
				return false
			}
		}
	}
	return true
}

// finishRollout makes the rollout's version t's current one and applies
// retention.
func (s *State) finishRollout(t *Table, unixMs int64) {
	b := t.Bulk
	ro := b.Rollout
	b.Rollout = nil
	if ro.Abandon != 0 {
		if k := b.version(ro.Abandon); k >= 0 {
			s.dropBulkStreams(t, ro.Abandon)
			b.Versions = slices.Delete(b.Versions, k, k+1)
		}
	}
	if b.Current == ro.Version {
		// An abort back to the serving version: nothing switches.
		return
	}
	s.bulkSwitch(t, ro.Version, unixMs)
}

// assignRow gives every partition of t that still has a copy of an older
// version a copy loading the rollout's version, if it has none: an extra
// copy on a server with room for the file, else the old copy it replaces
// loads it beside the one it serves, if its server has room. It returns
// why some partition has none ("" when all do).
func (s *State) assignRow(t *Table) string {
	b := t.Bulk
	v := b.Rollout.Version
	var used map[string]uint64 // bytes held per server, computed once needed
	var cands []Candidate
	waiting := ""
	for i := range t.Partitions {
		p := &t.Partitions[i]
		done, loading := true, false
		for k := range p.Replicas {
			r := &p.Replicas[k]
			if r.BulkServes != v {
				done = false
			}
			if t.copyNext(r) == v {
				loading = true
			}
		}
		if done || loading || len(p.Replicas) == 0 {
			continue
		}
		if used == nil {
			used = s.bulkBytesHeld()
			cands = s.candidates()
		}
		need := t.chainBytes(i, v, nil)
		room := func(id string, need uint64) bool {
			srv := s.Servers[id]
			return srv != nil && (srv.BulkCapacity == 0 || used[id]+need <= srv.BulkCapacity)
		}
		victim := s.replacedCopy(p, v)
		// An extra copy: a server not hosting the partition, with room,
		// in a fault domain apart from the copies that stay.
		var stay []string
		for k, r := range p.Replicas {
			if k != victim && !r.BulkLeaving {
				stay = append(stay, r.ServerID)
			}
		}
		fit := slices.Clone(cands)
		for k := range fit {
			fit[k].Available = fit[k].Available && !hostsReplica(p, fit[k].ID) && room(fit[k].ID, need)
		}
		if picks := Place(fit, stay, 1); len(picks) == 1 {
			srv := s.Servers[picks[0]]
			p.Replicas = append(p.Replicas, Replica{ServerID: srv.ID, Addr: srv.Addr, Role: api.ReplicaRole_REPLICA_ROLE_SECONDARY,
				FaultDomain: srv.FaultDomain, BulkNext: v})
			used[srv.ID] += need
			for k := range cands {
				if cands[k].ID == srv.ID {
					cands[k].Replicas++
				}
			}
			continue
		}
		// Beside the old version, on the copy it replaces.
		if victim >= 0 {
			r := &p.Replicas[victim]
			srv := s.Servers[r.ServerID]
			extra := t.chainBytes(i, v, b.chain(r.BulkServes))
			if srv != nil && srv.Alive && !srv.Draining && room(r.ServerID, extra) {
				r.BulkNext = v
				used[r.ServerID] += extra
				continue
			}
		}
		if waiting == "" {
			waiting = fmt.Sprintf("partition %d: no live server has room for its %d bytes of version %d (a server's bulk capacity is its --bulk-capacity); add servers or capacity", i, need, v)
		}
	}
	return waiting
}

// chainBytes is the size of partition i's files of version v's chain,
// less the versions in have.
func (t *Table) chainBytes(i int, v uint64, have []uint64) uint64 {
	var n uint64
	for _, x := range t.Bulk.chain(v) {
		if slices.Contains(have, x) {
			continue
		}
		if f := t.Bulk.Versions[t.Bulk.version(x)].Files; i < len(f) {
			n += f[i].Size
		}
	}
	return n
}

// bulkBytesHeld sums, per server, the bulk file bytes its copies hold or
// load.
func (s *State) bulkBytesHeld() map[string]uint64 {
	out := map[string]uint64{}
	for _, t := range s.Tables {
		if t.Bulk == nil {
			continue
		}
		for i := range t.Partitions {
			for k := range t.Partitions[i].Replicas {
				r := &t.Partitions[i].Replicas[k]
				for _, v := range t.copyHolds(i, r) {
					if f := t.Bulk.Versions[t.Bulk.version(v)].Files; i < len(f) {
						out[r.ServerID] += f[i].Size
					}
				}
			}
		}
	}
	return out
}

// switchRow switches the row loading the rollout's version: its copies
// serve it, and each partition above its copies drops one of an older
// version (the row it replaces).
func (s *State) switchRow(t *Table, unixMs int64) {
	b := t.Bulk
	ro := b.Rollout
	n := int(t.Options.Replication)
	for i := range t.Partitions {
		p := &t.Partitions[i]
		for k := range p.Replicas {
			if r := &p.Replicas[k]; t.copyNext(r) == ro.Version {
				if old := r.BulkServes; old != 0 && old != ro.Version {
					r.BulkDrop, r.BulkDropAtMs = old, unixMs+bulkDrainMs
				}
				r.BulkServes, r.BulkNext = ro.Version, 0
			}
		}
		for staying(p) > n {
			victim := s.replacedCopy(p, ro.Version)
			if victim < 0 {
				break
			}
			// It stops serving now and goes once reads routed to it
			// by older maps are done.
			r := &p.Replicas[victim]
			if r.BulkServes != 0 {
				r.BulkDrop = r.BulkServes
			}
			r.BulkServes, r.BulkNext, r.BulkLeaving, r.BulkDropAtMs = 0, 0, true, unixMs+bulkDrainMs
		}
	}
	ro.RowsDone++
	ro.RowStartedUnixMs = unixMs
	ro.Waiting = ""
}

// replacedCopy is the copy of p a row rolling out version v replaces (-1:
// none): one of an older version and not leaving, on a dead or draining
// server first, a secondary before the primary, the last in order.
func (s *State) replacedCopy(p *Partition, v uint64) int {
	victim := -1
	for k := len(p.Replicas) - 1; k >= 0; k-- {
		r := &p.Replicas[k]
		if r.BulkServes == v || r.BulkLeaving {
			continue
		}
		srv := s.Servers[r.ServerID]
		gone := srv == nil || !srv.Alive || srv.Draining
		if victim < 0 || gone || p.Replicas[victim].Role == api.ReplicaRole_REPLICA_ROLE_PRIMARY && r.Role != api.ReplicaRole_REPLICA_ROLE_PRIMARY {
			victim = k
			if gone {
				break
			}
		}
	}
	return victim
}

// staying counts p's copies that are not leaving.
func staying(p *Partition) int {
	n := 0
	for k := range p.Replicas {
		if !p.Replicas[k].BulkLeaving {
			n++
		}
	}
	return n
}

// bulkLeaving reports whether a copy of t is leaving (bulkDrainMs).
func (t *Table) bulkLeaving() bool {
	for i := range t.Partitions {
		if slices.ContainsFunc(t.Partitions[i].Replicas, func(r Replica) bool { return r.BulkLeaving }) {
			return true
		}
	}
	return false
}

// bulkDropsPending reports whether a copy of t holds a version it stopped
// serving (or leaves) at a time still to come.
func (t *Table) bulkDropsPending() bool {
	for i := range t.Partitions {
		if slices.ContainsFunc(t.Partitions[i].Replicas, func(r Replica) bool { return r.BulkDropAtMs != 0 }) {
			return true
		}
	}
	return false
}

// dropCopy removes bulk copy k of partition i of t, handing the primary
// role (which bulk copies carry only for placement) to the first copy
// left, with an epoch bump.
func (s *State) dropCopy(t *Table, i, k int) {
	p := &t.Partitions[i]
	t.Bulk.forgetLoaded(i, p.Replicas[k].ServerID)
	wasPrimary := p.Replicas[k].Role == api.ReplicaRole_REPLICA_ROLE_PRIMARY
	if wasPrimary && s.primaries != nil {
		s.primaries[p.Replicas[k].ServerID]--
	}
	p.Replicas = slices.Delete(p.Replicas, k, k+1)
	if wasPrimary && len(p.Replicas) > 0 {
		// Prefer a copy serving the newest version.
		j := 0
		for c := range p.Replicas {
			if p.Replicas[c].BulkServes > p.Replicas[j].BulkServes {
				j = c
			}
		}
		p.Replicas[j].Role = api.ReplicaRole_REPLICA_ROLE_PRIMARY
		p.Replicas[0], p.Replicas[j] = p.Replicas[j], p.Replicas[0]
		if s.primaries != nil {
			s.primaries[p.Replicas[0].ServerID]++
		}
		p.Epoch++
	}
}

// RolloutProto is t's rollout as the wire message (nil if none).
func (t *Table) RolloutProto() *api.BulkRollout {
	ro := t.Bulk.Rollout
	if ro == nil {
		return nil
	}
	out := &api.BulkRollout{Version: ro.Version, From: ro.From, Rows: uint32(ro.Rows), Paused: ro.Paused, Aborting: ro.Aborting,
		StartedUnixMs: ro.StartedUnixMs, RowStartedUnixMs: ro.RowStartedUnixMs, Waiting: ro.Waiting, Partitions: uint32(len(t.Partitions))}
	done := -1
	for i := range t.Partitions {
		p := &t.Partitions[i]
		n, loading, loaded := 0, false, true
		for k := range p.Replicas {
			r := &p.Replicas[k]
			if r.BulkServes == ro.Version {
				n++
			}
			if t.copyNext(r) == ro.Version {
				loading = true
				loaded = loaded && t.copyLoaded(i, r.ServerID, ro.Version)
			}
		}
		if done < 0 || n < done {
			done = n
		}
		if loading && loaded {
			out.RowLoaded++
		}
	}
	out.RowsDone = uint32(max(done, 0))
	return out
}

// bulkCopiesLoading reports whether some copy of t loads a version to
// serve.
func (t *Table) bulkCopiesLoading() bool {
	for i := range t.Partitions {
		for k := range t.Partitions[i].Replicas {
			if t.copyNext(&t.Partitions[i].Replicas[k]) != 0 {
				return true
			}
		}
	}
	return false
}

package tablemaster

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tabuladb/tabula/api"
)

// Map watches. Every table server watches the whole cluster map, so one map
// change is sent to every server: the response of a version is built and
// marshalled once (mapVersion) and its bytes are sent as they are to every
// watcher (watchCodec). Marshalled per watcher, the 1.75 MB map of 200
// servers x 100 partitions cost 8.8 ms each, 1.8 s of CPU per version (see
// RATIONALE.md, "Map watches").

// encodedMsg is a message marshalled once, sent as is by watchCodec to
// every stream that sends it. Its bytes are never modified.
type encodedMsg struct{ b []byte }

func encode(m proto.Message) (*encodedMsg, error) {
	b, err := proto.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("tablemaster: encode watch response: %w", err)
	}
	return &encodedMsg{b: b}, nil
}

// watchCodec is gRPC's proto codec that sends an *encodedMsg's bytes
// unchanged. Master.Serve installs it (under api.SizeGuard's codec,
// admission.go): the map watch sends *encodedMsg.
type watchCodec struct{ proto encoding.CodecV2 }

func newWatchCodec() watchCodec { return watchCodec{proto: encoding.GetCodecV2("proto")} }

func (watchCodec) Name() string { return "proto" }

func (c watchCodec) Marshal(v any) (mem.BufferSlice, error) {
	if e, ok := v.(*encodedMsg); ok {
		// A SliceBuffer's Free does nothing: the shared bytes stay intact
		// for the other streams.
		return mem.BufferSlice{mem.SliceBuffer(e.b)}, nil
	}
	return c.proto.Marshal(v)
}

func (c watchCodec) Unmarshal(data mem.BufferSlice, v any) error { return c.proto.Unmarshal(data, v) }

// Deltas. A watcher that asks for them (WatchPartitionMapRequest.deltas)
// gets a full map first, then per version the maps of the tables added or
// replaced, the changed partitions of tables changed in place, and the
// tables dropped (see api.WatchPartitionMapResponse). A CreateTable is
// then ~200 bytes to each server instead of the whole map (at 1,000
// servers x 100 partitions, ~10 MB), and a server's death its ~100
// partitions instead of the ~100 whole tables they belong to. The master
// keeps the deltas
// of recent versions (memory only, chained through mapVersion.prev): a
// watcher one version behind gets the shared encoded delta of the current
// one, a watcher further behind one delta merged from the chain, and a
// watcher whose version is no longer in the chain (or a delta larger than
// half the map) a full map.

const (
	// maxDeltaHistory is how many versions of deltas the master keeps.
	maxDeltaHistory = 256
	// minDeltaLimit is the fewest partitions a delta may carry before a
	// full map is sent instead, and the history may hold (else half the
	// cluster's, and the cluster's): in a small cluster deltas are used
	// all the same, so tests of small clusters exercise them.
	minDeltaLimit = 1000
)

// deltaLimit is the most partitions a delta sent to a watcher may carry:
// beyond, a full map is not much larger and is shared by every watcher.
func (mv *mapVersion) deltaLimit() int { return max(mv.partitions/2, minDeltaLimit) }

// mapVersion is one published map version as watchers see it: the tables
// of the first State published at it (later States at the same version
// change only the stream manager, never a table), its delta from the
// version before, and the responses built on first need. Safe for
// concurrent use.
type mapVersion struct {
	version uint64
	// tables is State.Tables (never modified): only it, not the State,
	// so the history does not keep old stream managers alive.
	tables map[string]*Table
	// partitions is the number of partitions in the cluster at version.
	partitions int

	// The delta from the version published before (hasDelta false for
	// the first version this master published): the tables added or
	// replaced, as of this version, and those of the version before that
	// are gone (dropped, or replaced by a new table of the same name).
	// Both are sorted by key.
	hasDelta bool
	from     uint64
	changed  []tableChange
	removed  []*Table
	// changedParts is the number of partitions changed sends.
	changedParts int

	// prev is the version before, nil when it was trimmed from the
	// history (or this is the first).
	prev atomic.Pointer[mapVersion]

	mu    sync.Mutex // guards full and delta
	full  *encodedMsg
	delta *encodedMsg
}

// tableChange is a table added or changed in a delta: whole, or only the
// partitions at parts (in index order) when it changed in place.
type tableChange struct {
	t     *Table
	parts []int // nil: the whole table
}

func (c tableChange) size() int {
	if c.parts == nil {
		return len(c.t.Partitions)
	}
	return len(c.parts)
}

// changedPartitions returns the indexes of t's partitions that differ from
// o's, or nil when t is not o changed in place (another table, another
// number of partitions) or more than half of them changed: then the whole
// table is sent.
func changedPartitions(o, t *Table) []int {
	if o.ID != t.ID || len(o.Partitions) != len(t.Partitions) || !sameCopyView(o.Bulk, t.Bulk) {
		return nil
	}
	parts := []int{}
	for i := range t.Partitions {
		if !samePartition(&o.Partitions[i], &t.Partitions[i]) {
			parts = append(parts, i)
		}
	}
	if 2*len(parts) > len(t.Partitions) {
		return nil
	}
	return parts
}

// sameCopyView reports whether bulk states a and b give every copy the same
// versions to hold and serve (copyHolds, copyServes): what else changes
// (load records) leaves partitions as they were.
func sameCopyView(a, b *BulkState) bool {
	if a == nil || b == nil {
		return a == b
	}
	if a.Rows != b.Rows || a.Current != b.Current || len(a.Versions) != len(b.Versions) || (a.Rollout == nil) != (b.Rollout == nil) {
		return false
	}
	if a.Rollout != nil && a.Rollout.Version != b.Rollout.Version {
		return false
	}
	for i := range a.Versions {
		x, y := &a.Versions[i], &b.Versions[i]
		if x.Version != y.Version || x.Base != y.Base || x.State != y.State || x.Streams != y.Streams || len(x.Files) != len(y.Files) {
			return false
		}
		for k := range x.Files {
			if (x.Files[k].Stream == "") != (y.Files[k].Stream == "") {
				return false
			}
		}
	}
	return true
}

// samePartition reports whether a and b are equal (pointers compared by
// the values they point to).
func samePartition(a, b *Partition) bool {
	return a.ID == b.ID && a.Index == b.Index && a.Start == b.Start && a.End == b.End && a.Epoch == b.Epoch &&
		slices.Equal(a.Replicas, b.Replicas) &&
		(a.Log == b.Log || a.Log != nil && b.Log != nil && *a.Log == *b.Log) &&
		(a.DataLost == b.DataLost || a.DataLost != nil && b.DataLost != nil && *a.DataLost == *b.DataLost) &&
		(a.Handoff == nil) == (b.Handoff == nil) && (a.Handoff == nil || a.Handoff.From == b.Handoff.From) &&
		a.Split == b.Split && a.SplitFrom == b.SplitFrom &&
		a.Merge == b.Merge && a.MergeLeft == b.MergeLeft
}

// newMapVersion returns the map version of s, the first State published
// at s.Version, with its delta from prev (nil: none).
func newMapVersion(prev *mapVersion, s *State) *mapVersion {
	mv := &mapVersion{version: s.Version, tables: s.Tables, partitions: s.partitionCount()}
	if prev == nil {
		return mv
	}
	mv.hasDelta, mv.from = true, prev.version
	old := prev.tables
	// Copy on write keeps every table a command did not touch the same
	// pointer: comparing pointers finds the changed ones.
	for k, t := range s.Tables {
		o, ok := old[k]
		if ok && o == t {
			continue
		}
		c := tableChange{t: t}
		if ok {
			c.parts = changedPartitions(o, t)
		}
		mv.changed = append(mv.changed, c)
		mv.changedParts += c.size()
		if ok && o.ID != t.ID {
			mv.removed = append(mv.removed, o)
		}
	}
	for k, o := range old {
		if _, ok := s.Tables[k]; !ok {
			mv.removed = append(mv.removed, o)
		}
	}
	sortChanges(mv.changed)
	sortTables(mv.removed)
	mv.prev.Store(prev)
	mv.trimHistory()
	return mv
}

func sortTables(ts []*Table) {
	slices.SortFunc(ts, func(a, b *Table) int {
		return cmp.Or(cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.Name, b.Name), cmp.Compare(a.ID, b.ID))
	})
}

func sortChanges(cs []tableChange) {
	slices.SortFunc(cs, func(a, b tableChange) int {
		return cmp.Or(cmp.Compare(a.t.Tenant, b.t.Tenant), cmp.Compare(a.t.Name, b.t.Name))
	})
}

// trimHistory cuts the chain of deltas behind mv after maxDeltaHistory
// versions, or once they hold more partitions than the cluster (a watcher
// that far behind is sent a full map): the history's memory stays within
// about one map.
func (mv *mapVersion) trimHistory() {
	n, parts := 0, 0
	for x := mv; x != nil; x = x.prev.Load() {
		n++
		parts += x.changedParts
		if n >= maxDeltaHistory || parts > max(mv.partitions, minDeltaLimit) {
			x.prev.Store(nil)
			return
		}
	}
}

// superseded releases what only the current version needs: its full
// response (a watcher that needs a full map is sent the newest).
func (mv *mapVersion) superseded() {
	mv.mu.Lock()
	mv.full = nil
	mv.mu.Unlock()
}

// fullMsg returns the full response of every table at this version.
func (mv *mapVersion) fullMsg() (*encodedMsg, error) {
	mv.mu.Lock()
	defer mv.mu.Unlock()
	if mv.full != nil {
		return mv.full, nil
	}
	resp := &api.WatchPartitionMapResponse{Version: mv.version}
	ts := slices.Collect(maps.Values(mv.tables))
	sortTables(ts)
	for _, t := range ts {
		resp.Maps = append(resp.Maps, t.MapProto(mv.version))
	}
	e, err := encode(resp)
	if err != nil {
		return nil, err
	}
	mv.full = e
	return e, nil
}

// deltaMsg returns the whole-cluster delta of this version from the one
// before (hasDelta must be set).
func (mv *mapVersion) deltaMsg() (*encodedMsg, error) {
	mv.mu.Lock()
	defer mv.mu.Unlock()
	if mv.delta != nil {
		return mv.delta, nil
	}
	e, err := encode(deltaResponse(mv.from, mv.version, mv.changed, mv.removed))
	if err != nil {
		return nil, err
	}
	mv.delta = e
	return e, nil
}

// deltaResponse builds a delta response.
func deltaResponse(from, to uint64, changed []tableChange, removed []*Table) *api.WatchPartitionMapResponse {
	resp := &api.WatchPartitionMapResponse{Version: to, Delta: true, FromVersion: from}
	for _, c := range changed {
		if c.parts == nil {
			resp.Maps = append(resp.Maps, c.t.MapProto(to))
			continue
		}
		pm := &api.PartitionMap{Table: c.t.Proto(), Version: to, Partitions: make([]*api.Partition, len(c.parts)),
			Bulk: c.t.BulkInfoProto(false), Coprocessors: c.t.CoprocsProto()}
		for i, k := range c.parts {
			pm.Partitions[i] = c.t.partitionProto(k)
		}
		resp.Patches = append(resp.Patches, pm)
	}
	for _, t := range removed {
		resp.Removed = append(resp.Removed, &api.Table{Tenant: t.Tenant, Name: t.Name, Id: t.ID})
	}
	return resp
}

// deltaSince returns the tables changed and removed between version from
// and mv, of every table (key "") or only of table key, merged from the
// chain of deltas; ok is false when the chain does not reach back to from
// or the delta would be larger than half the cluster's partitions.
func (mv *mapVersion) deltaSince(from uint64, key string) (changed []tableChange, removed []*Table, ok bool) {
	var chain []*mapVersion
	parts := 0
	for x := mv; ; {
		if !x.hasDelta || x.version <= from {
			return nil, nil, false
		}
		chain = append(chain, x)
		parts += x.changedParts
		if key == "" && parts > mv.deltaLimit() {
			return nil, nil, false
		}
		if x.from == from {
			break
		}
		if x = x.prev.Load(); x == nil {
			return nil, nil, false
		}
	}
	if len(chain) == 1 && key == "" {
		return mv.changed, mv.removed, true
	}
	// Per table as of mv (a later version may have changed or dropped it
	// again): whole, or the union of the partitions changed in place.
	type merged struct {
		whole bool
		parts map[int]bool
	}
	byKey := map[string]*merged{}
	seen := map[*Table]bool{}
	for _, x := range chain {
		for _, c := range x.changed {
			k := tableKey(c.t.Tenant, c.t.Name)
			cur := mv.tables[k]
			if key != "" && k != key || cur == nil {
				continue
			}
			g := byKey[k]
			if g == nil {
				g = &merged{parts: map[int]bool{}}
				byKey[k] = g
			}
			if c.parts == nil || c.t.ID != cur.ID || len(c.t.Partitions) != len(cur.Partitions) {
				g.whole = true
				continue
			}
			for _, i := range c.parts {
				g.parts[i] = true
			}
		}
		for _, t := range x.removed {
			k := tableKey(t.Tenant, t.Name)
			if key != "" && k != key {
				continue
			}
			if cur := mv.tables[k]; (cur == nil || cur.ID != t.ID) && !seen[t] {
				seen[t] = true
				removed = append(removed, t)
			}
		}
	}
	for k, g := range byKey {
		c := tableChange{t: mv.tables[k]}
		if !g.whole && 2*len(g.parts) <= len(c.t.Partitions) {
			c.parts = slices.AppendSeq([]int{}, maps.Keys(g.parts)) // non-nil when empty: a patch
			slices.Sort(c.parts)
		}
		changed = append(changed, c)
	}
	sortChanges(changed)
	sortTables(removed)
	return changed, removed, true
}

// WatchPartitionMap sends the maps in scope (one table, or every table when
// tenant and table are empty) when the cluster version exceeds
// after_version, then again after every change, until the client goes away
// or the master closes. A slow watcher skips to the latest version. A
// watcher that asks for deltas gets them after a full map (see above).
func (m *Master) WatchPartitionMap(req *api.WatchPartitionMapRequest, stream grpc.ServerStreamingServer[api.WatchPartitionMapResponse]) error {
	if req == nil {
		return errNilRequest()
	}
	key := ""
	if req.Tenant != "" || req.Table != "" {
		if _, err := lookup(m.State(), "tenant", req.Tenant, "table", req.Table); err != nil {
			return err
		}
		key = tableKey(req.Tenant, req.Table)
	}
	ctx := stream.Context()
	// have is the version of the map the watcher holds (0: none).
	have := req.AfterVersion
	for {
		v := m.view.Load()
		if mv := v.mv; mv.version > have {
			msg, err := watchMsg(mv, have, req.Deltas, key)
			if err != nil {
				return rpcError("watch partition map", err)
			}
			if err := stream.SendMsg(msg); err != nil {
				return err
			}
			have = mv.version
		}
		select {
		case <-v.changed:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-m.closing:
			return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "master_closed", "master is shutting down")
		}
	}
}

// watchMsg is what a watcher of key ("" for every table) holding version
// have (0: nothing) is sent for mv: a delta if it asked for them and the
// history allows, else a full map. Whole-cluster messages are shared
// encoded ones.
func watchMsg(mv *mapVersion, have uint64, deltas bool, key string) (any, error) {
	if deltas && have > 0 {
		if key == "" && mv.hasDelta && mv.from == have {
			if mv.changedParts <= mv.deltaLimit() {
				return mv.deltaMsg()
			}
		} else if changed, removed, ok := mv.deltaSince(have, key); ok {
			return deltaResponse(have, mv.version, changed, removed), nil
		}
	}
	if key == "" {
		return mv.fullMsg()
	}
	resp := &api.WatchPartitionMapResponse{Version: mv.version}
	if t, ok := mv.tables[key]; ok {
		resp.Maps = append(resp.Maps, t.MapProto(mv.version))
	}
	return resp, nil
}

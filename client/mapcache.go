package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/internal/keyspace"
)

// tableState is the client's cached partition map of one table. The stored
// map is immutable: updates store a new one. Safe for concurrent use.
//
// The map is filled on first use by GetPartitionMap, then kept fresh by a
// WatchPartitionMap stream (one goroutine per table, owned by the Client)
// and patched or re-fetched when a server answers NOT_OWNER/STALE_EPOCH.
type tableState struct {
	c    *Client
	name string
	m    atomic.Pointer[api.PartitionMap]

	// watching is set while the watch goroutine runs (or is starting).
	watching atomic.Bool
	// seen is the cluster map version the watch has brought the cached
	// map to (the map's own version stays that of its table's last
	// change: deltas name only the tables that changed); needFull asks the
	// next watch for a full map, after a delta that did not start at seen.
	seen     atomic.Uint64
	needFull atomic.Bool

	mu sync.Mutex // guards inflight
	// inflight is the GetPartitionMap in progress, shared by every caller
	// that needs a fresh map meanwhile (a dead server makes every request
	// to it ask at once).
	inflight *mapFetch

	moveMu sync.Mutex // guards changed and moves
	// changed is closed (and set to nil) when the cached map changes: a
	// call waiting to retry wakes up and routes by the new map at once
	// instead of sleeping out its backoff. Made on demand.
	changed chan struct{}
	// moves holds, per partition id, a context cancelled when the
	// partition's entry in the cached map changes (epoch or replicas):
	// attempts in flight to the partition are cut short and retried on
	// the new map, so a call to a paused or cut-off primary follows the
	// failover instead of waiting for its deadline.
	moves map[uint64]*move
}

// move tracks one partition's entry for the attempts routed by it.
type move struct {
	entry  *api.Partition
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// errMoved is the cause of an attempt cut short because its partition's
// entry changed in the cached map.
var errMoved = errors.New("client: the partition moved (new epoch or replicas)")

// errSlowCopy cuts an attempt of a read that any copy may answer once it
// has waited spreadAttemptTimeout: the next attempt goes to another copy.
var errSlowCopy = errors.New("client: the copy did not answer in time")

// spreadAttemptTimeout bounds one attempt of a read that any copy may
// answer (bulk reads, ReadAny) when the partition has other copies: far
// above a read's time on a healthy copy, far below a call's deadline.
const spreadAttemptTimeout = time.Second

// movedCtx is the context of an attempt routed by an entry already
// replaced: cancelled from the start.
var movedCtx = func() context.Context {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errMoved)
	return ctx
}()

type mapFetch struct {
	done chan struct{} // closed when m and err are set
	m    *api.PartitionMap
	err  error
}

// state returns the cache of table name, making it on first use.
func (c *Client) state(name string) *tableState {
	c.mu.Lock()
	defer c.mu.Unlock()
	ts, ok := c.tables[name]
	if !ok {
		ts = &tableState{c: c, name: name}
		c.tables[name] = ts
	}
	return ts
}

// current returns the cached map, fetching one if there is none.
func (ts *tableState) current(ctx context.Context) (*api.PartitionMap, error) {
	if m := ts.m.Load(); m != nil {
		if !ts.watching.Load() { // a map stored by CreateTable
			ts.startWatch()
		}
		return m, nil
	}
	return ts.refresh(ctx)
}

// refresh fetches the map from a master and caches it, joining a fetch
// already in progress instead of starting another.
func (ts *tableState) refresh(ctx context.Context) (*api.PartitionMap, error) {
	for {
		ts.mu.Lock()
		f := ts.inflight
		if f == nil {
			f = &mapFetch{done: make(chan struct{})}
			ts.inflight = f
			ts.mu.Unlock()
			m, err := ts.c.fetchMap(ctx, ts.name)
			if err == nil {
				m = ts.store(m)
				ts.startWatch()
			} else if api.CodeOf(err) == api.ErrorCode_ERROR_CODE_NOT_FOUND {
				// The master says the table is gone (dropped, perhaps by
				// another client): the cached map is of a dead table.
				ts.forget()
			}
			f.m, f.err = m, err
			ts.mu.Lock()
			ts.inflight = nil
			ts.mu.Unlock()
			close(f.done)
			return m, err
		}
		ts.mu.Unlock()
		select {
		case <-f.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		// The fetch we joined ended because its own caller gave up: ours
		// has not, so try again.
		if f.err != nil && ctx.Err() == nil && ts.c.ctx.Err() == nil &&
			(errors.Is(f.err, context.Canceled) || errors.Is(f.err, context.DeadlineExceeded)) {
			continue
		}
		return f.m, f.err
	}
}

// store caches m unless the cached map is newer, and returns what is cached.
// Epochs only grow, so a cached entry with a higher epoch than m's (patched
// in from a server's NOT_OWNER answer) is kept.
func (ts *tableState) store(m *api.PartitionMap) *api.PartitionMap {
	for {
		cur := ts.m.Load()
		next := m
		if cur != nil {
			if m.GetVersion() < cur.GetVersion() {
				return cur
			}
			if cur.GetTable().GetId() == m.GetTable().GetId() {
				next = keepNewerEpochs(cur, m)
			}
		}
		if ts.m.CompareAndSwap(cur, next) {
			if next != cur {
				ts.notify(next)
			}
			return next
		}
	}
}

// notify wakes the calls waiting to retry and cuts short the attempts to
// partitions whose entry changed in next (nil: the table was forgotten).
func (ts *tableState) notify(next *api.PartitionMap) {
	ts.moveMu.Lock()
	defer ts.moveMu.Unlock()
	if ts.changed != nil {
		close(ts.changed)
		ts.changed = nil
	}
	if len(ts.moves) == 0 {
		return
	}
	byID := make(map[uint64]*api.Partition, len(next.GetPartitions()))
	for _, p := range next.GetPartitions() {
		byID[p.GetId()] = p
	}
	for id, mv := range ts.moves {
		if p := byID[id]; p == nil || !sameEntry(p, mv.entry) {
			mv.cancel(errMoved)
			delete(ts.moves, id)
		}
	}
}

// changedCh returns a channel closed at the next change of the cached map.
func (ts *tableState) changedCh() <-chan struct{} {
	ts.moveMu.Lock()
	defer ts.moveMu.Unlock()
	if ts.changed == nil {
		ts.changed = make(chan struct{})
	}
	return ts.changed
}

// moved returns a context cancelled (cause errMoved) when partition p's
// entry in the cached map changes; already cancelled when it has.
func (ts *tableState) moved(p *api.Partition) context.Context {
	ts.moveMu.Lock()
	defer ts.moveMu.Unlock()
	id := p.GetId()
	if mv := ts.moves[id]; mv != nil && (mv.entry == p || sameEntry(mv.entry, p)) {
		return mv.ctx
	}
	cur := entryOf(ts.m.Load(), p)
	if cur == nil || !sameEntry(cur, p) {
		return movedCtx
	}
	if old := ts.moves[id]; old != nil {
		old.cancel(errMoved)
	}
	if ts.moves == nil {
		ts.moves = make(map[uint64]*move)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	ts.moves[id] = &move{entry: cur, ctx: ctx, cancel: cancel}
	return ctx
}

// entryOf finds the entry of p's partition in m (nil if none).
func entryOf(m *api.PartitionMap, p *api.Partition) *api.Partition {
	ps := m.GetPartitions()
	if i := int(p.GetIndex()); i < len(ps) && ps[i].GetId() == p.GetId() {
		return ps[i]
	}
	for _, q := range ps {
		if q.GetId() == p.GetId() {
			return q
		}
	}
	return nil
}

// sameEntry reports whether a and b route alike: same epoch, same replicas
// in the same roles.
func sameEntry(a, b *api.Partition) bool {
	if a == b {
		return true
	}
	if a.GetEpoch() != b.GetEpoch() || len(a.GetReplicas()) != len(b.GetReplicas()) {
		return false
	}
	for i, r := range a.GetReplicas() {
		q := b.GetReplicas()[i]
		if r.GetAddr() != q.GetAddr() || r.GetRole() != q.GetRole() {
			return false
		}
	}
	return true
}

// keepNewerEpochs returns m with every partition that has a higher epoch in
// cur replaced by cur's entry (m itself when there is none).
func keepNewerEpochs(cur, m *api.PartitionMap) *api.PartitionMap {
	byID := make(map[uint64]*api.Partition, len(cur.GetPartitions()))
	for _, p := range cur.GetPartitions() {
		byID[p.GetId()] = p
	}
	var out *api.PartitionMap
	for i, p := range m.GetPartitions() {
		if c, ok := byID[p.GetId()]; ok && c.GetEpoch() > p.GetEpoch() {
			if out == nil {
				out = &api.PartitionMap{Table: m.GetTable(), Version: m.GetVersion(), Partitions: slices.Clone(m.GetPartitions()), Bulk: m.GetBulk()}
			}
			out.Partitions[i] = c
		}
	}
	if out == nil {
		return m
	}
	return out
}

// patch puts a server's view of one partition (from a NOT_OWNER or
// STALE_EPOCH detail) into the cached map when it is newer than the cached
// entry, and reports whether it did: then no master round trip is needed.
func (ts *tableState) patch(p *api.Partition) bool {
	if p == nil || p.GetId() == 0 {
		return false
	}
	for {
		cur := ts.m.Load()
		if cur == nil {
			return false
		}
		i := slices.IndexFunc(cur.GetPartitions(), func(q *api.Partition) bool { return q.GetId() == p.GetId() })
		if i < 0 || cur.GetPartitions()[i].GetEpoch() >= p.GetEpoch() {
			return false
		}
		next := &api.PartitionMap{Table: cur.GetTable(), Version: cur.GetVersion(), Partitions: slices.Clone(cur.GetPartitions()), Bulk: cur.GetBulk()}
		next.Partitions[i] = p
		if ts.m.CompareAndSwap(cur, next) {
			ts.notify(next)
			return true
		}
	}
}

// forget drops the cached map (the table was dropped).
func (ts *tableState) forget() {
	ts.m.Store(nil)
	ts.seen.Store(0)
	ts.notify(nil)
}

// route is where a key lives: its hash, for tables partitioned by key
// hash (point and bulk), and the key, for tables partitioned by key range
// (ordered).
type route struct {
	h   uint64
	key []byte
}

func routeOf(key []byte) route { return route{h: keyspace.Hash(key), key: key} }

// ordered reports whether m's table is partitioned by key range.
func ordered(m *api.PartitionMap) bool {
	return m.GetTable().GetKind() == api.TableKind_TABLE_KIND_ORDERED
}

// inPartition reports whether r lies in p, a partition of m.
func inPartition(m *api.PartitionMap, p *api.Partition, r route) bool {
	if ordered(m) {
		return keyInRange(r.key, p.GetKeyStart(), p.GetKeyEnd())
	}
	return p.GetStart() <= r.h && r.h <= p.GetEnd()
}

// keyInRange reports whether start <= key < end (empty end: unbounded).
func keyInRange(key, start, end []byte) bool {
	return bytes.Compare(start, key) <= 0 && (len(end) == 0 || bytes.Compare(key, end) < 0)
}

// partitionOf finds the partition of m holding r: by key range for an
// ordered table (its partitions are in key order), else by hash.
func partitionOf(m *api.PartitionMap, r route) (*api.Partition, bool) {
	ps := m.GetPartitions()
	if len(ps) == 0 {
		return nil, false
	}
	if ordered(m) {
		i := sort.Search(len(ps), func(i int) bool {
			end := ps[i].GetKeyEnd()
			return len(end) == 0 || bytes.Compare(r.key, end) < 0
		})
		if i < len(ps) && keyInRange(r.key, ps[i].GetKeyStart(), ps[i].GetKeyEnd()) {
			return ps[i], true
		}
		return nil, false
	}
	return partitionOfHash(ps, r.h)
}

// partitionOfHash finds the partition of ps holding hash h. Partitions
// are in index order and cut evenly (keyspace.Index), so the first guess
// is almost always right; a map cut otherwise (after a split) is searched
// by range.
func partitionOfHash(ps []*api.Partition, h uint64) (*api.Partition, bool) {
	if p := ps[keyspace.Index(h, len(ps))]; p.GetStart() <= h && h <= p.GetEnd() {
		return p, true
	}
	i := sort.Search(len(ps), func(i int) bool { return ps[i].GetEnd() >= h })
	if i < len(ps) && ps[i].GetStart() <= h {
		return ps[i], true
	}
	return nil, false
}

// replicaFor picks the replica an attempt of a ReadAny read goes to: any
// replica at first (spreading reads), then, after failures (tried holds
// their addresses), another secondary, then the primary, then any again.
func (c *Client) replicaFor(p *api.Partition, tried map[string]bool) *api.Replica {
	var untried []*api.Replica
	var primary *api.Replica
	for _, r := range p.GetReplicas() {
		if r.GetAddr() == "" {
			continue
		}
		if r.GetRole() == api.ReplicaRole_REPLICA_ROLE_PRIMARY {
			primary = r
		}
		if !tried[r.GetAddr()] && (len(tried) == 0 || r.GetRole() != api.ReplicaRole_REPLICA_ROLE_PRIMARY) {
			untried = append(untried, r)
		}
	}
	switch {
	case len(untried) > 1:
		// The less busy of two picked at random (the power of two
		// choices): a slow or loaded copy gets fewer of this client's
		// reads, and the load still spreads.
		i := c.jitter.intN(len(untried))
		j := (i + 1 + c.jitter.intN(len(untried)-1)) % len(untried)
		if c.inflight(untried[j].GetAddr()) < c.inflight(untried[i].GetAddr()) {
			i = j
		}
		return untried[i]
	case len(untried) == 1:
		return untried[0]
	case primary != nil && !tried[primary.GetAddr()]:
		return primary
	}
	clear(tried)
	if primary != nil {
		return primary
	}
	return nil
}

// primaryOf is the replica that takes requests for p: the primary.
func primaryOf(p *api.Partition) *api.Replica {
	for _, r := range p.GetReplicas() {
		if r.GetRole() == api.ReplicaRole_REPLICA_ROLE_PRIMARY && r.GetAddr() != "" {
			return r
		}
	}
	return nil
}

// errTableGone ends a watch whose table is no longer in the map.
var errTableGone = errors.New("client: watched table was dropped")

// startWatch starts the table's watch goroutine unless it runs already or
// the client is closed.
func (ts *tableState) startWatch() {
	if !ts.watching.CompareAndSwap(false, true) {
		return
	}
	c := ts.c
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		ts.watching.Store(false)
		return
	}
	c.wg.Add(1) // under c.mu, so Close's Wait cannot miss it
	c.mu.Unlock()
	go ts.watch()
}

// watch keeps the cached map fresh from a WatchPartitionMap stream,
// reopening it with backoff (on the next master when one is unavailable)
// until the client closes or the table is dropped.
func (ts *tableState) watch() {
	c := ts.c
	defer c.wg.Done()
	attempt := 0
	for {
		err := ts.watchOnce(&attempt)
		if c.ctx.Err() != nil {
			return
		}
		if errors.Is(err, errTableGone) {
			c.log.Debug("tabula: watched table dropped", "table", ts.name)
			ts.forget()
			ts.watching.Store(false)
			return
		}
		wait := c.jitter.backoff(attempt, watchBackoffBase, watchBackoffCap)
		attempt++
		c.log.Debug("tabula: partition map watch broke", "table", ts.name, "wait", wait, "err", err)
		if !sleepCtx(c.ctx, wait) {
			return
		}
	}
}

func (ts *tableState) watchOnce(attempt *int) error {
	c := ts.c
	n := uint32(len(c.opts.Masters))
	idx := c.master.Load() % n
	cc, err := c.conn(c.opts.Masters[idx])
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(c.ctx)
	defer cancel()
	// have is the version the cached map is known current at: the
	// master sends a delta from it when it still can.
	var have uint64
	if m := ts.m.Load(); m != nil {
		have = max(m.GetVersion(), ts.seen.Load())
	}
	if ts.needFull.Swap(false) {
		have = 0
	}
	stream, err := api.NewMasterClient(cc).WatchPartitionMap(ctx, &api.WatchPartitionMapRequest{
		Tenant: c.opts.Tenant, Table: ts.name, AfterVersion: have, Deltas: true,
	})
	for err == nil {
		var resp *api.WatchPartitionMapResponse
		if resp, err = stream.Recv(); err != nil {
			break
		}
		*attempt = 0
		if resp.GetDelta() && resp.GetFromVersion() != have {
			ts.needFull.Store(true)
			return fmt.Errorf("%w: delta from %d, cached map current at %d", api.ErrMapGap, resp.GetFromVersion(), have)
		}
		if err := ts.applyWatch(resp); err != nil {
			if errors.Is(err, api.ErrMapGap) {
				ts.needFull.Store(true)
			}
			return err
		}
		have = resp.GetVersion()
		ts.seen.Store(have)
	}
	switch api.CodeOf(err) {
	case api.ErrorCode_ERROR_CODE_UNAVAILABLE:
		c.master.CompareAndSwap(idx, (idx+1)%n)
	case api.ErrorCode_ERROR_CODE_NOT_FOUND:
		return errTableGone // dropped before the stream opened
	}
	return err
}

// applyWatch applies one watch response to the cached map: a full map
// holds the table's map (errTableGone when it does not), a delta the
// table's new map or its changed partitions (api.ErrMapGap when they do
// not apply to the cached map) if it changed, or names it removed
// (errTableGone) if it was dropped.
func (ts *tableState) applyWatch(resp *api.WatchPartitionMapResponse) error {
	tenant := ts.c.opts.Tenant
	ours := func(t *api.Table) bool {
		return t.GetName() == ts.name && (t.GetTenant() == "" || t.GetTenant() == tenant)
	}
	for _, m := range resp.GetMaps() {
		if ours(m.GetTable()) && len(m.GetPartitions()) > 0 {
			// A dropped and created again table is in removed too:
			// its new map is what counts.
			ts.store(m)
			return nil
		}
	}
	if !resp.GetDelta() {
		return errTableGone
	}
	for _, pm := range resp.GetPatches() {
		if !ours(pm.GetTable()) {
			continue
		}
		// Patched onto the map as the master sent it: a partition
		// patched in from a NOT_OWNER answer (newer) is kept by store.
		m, err := api.PatchMap(ts.m.Load(), pm)
		if err != nil {
			return err
		}
		ts.store(m)
		return nil
	}
	cur := ts.m.Load()
	for _, t := range resp.GetRemoved() {
		if ours(t) && (cur == nil || cur.GetTable().GetId() == t.GetId()) {
			return errTableGone
		}
	}
	return nil
}

package tablemaster

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/replication/stream"
)

// Bulk tables. A version's files are built offline (one per
// partition) and published: OpBulkPublish registers version N as loading
// with the size and CRC32C of every file; each partition's server receives
// its file from the publisher, verifies and loads it beside the versions it
// serves, and reports it in its heartbeats, which the master turns into
// OpBulkLoaded. When every partition's current server has loaded N, the
// same Apply switches the table to N (one map change: servers and clients
// see the new serving version together) and unloads versions beyond the
// table's retention. Rollback switches to a retained version loaded
// everywhere. A request names one version; the servers serve every version
// they hold loaded, so the switch fails no read.
//
// Every file is also written into a stream of its own, named
// by BulkStreamName, which the publisher writes and OpBulkStored records
// once the master has sealed it. A version switches only when every file
// is stored as well as loaded, so the serving version and every retained
// one can always be fetched from the stream layer: a partition moves off
// a dead or draining server like a memory one, and its new server fetches
// the files of the retained versions, verifies and loads them, and reports
// them as it would an upload. The streams of a version go when the version
// does (retention, an abandoned publish, a dropped table).

// Limits of bulk tables.
const (
	// DefaultBulkRetained is how many versions stay loaded by default: the
	// serving one and the previous one, for rollback.
	DefaultBulkRetained = 2
	// MaxBulkRetained bounds options.bulk_retained_versions.
	MaxBulkRetained = 8
	// MaxBulkFileBytes bounds one partition file (1 TiB).
	MaxBulkFileBytes = 1 << 40
)

// Bulk version states, as in api.BulkVersionState.
const (
	BulkLoading = "loading"
	BulkReady   = "ready"
	BulkServing = "serving"
)

// BulkState is a bulk table's versions.
type BulkState struct {
	// Current is the serving version, 0 before the first switch.
	Current uint64 `json:"current,omitempty"`
	// LastVersion is the highest version ever published: a new version
	// must be higher, so a number never names two different contents.
	LastVersion uint64 `json:"last_version,omitempty"`
	// Versions are the versions loading or retained, by version.
	Versions []BulkVersion `json:"versions,omitempty"`
	// Rows: each copy holds its own version and new versions roll out
	// row by row (rollout.go); false before the first version through
	// streams, and after one without: every copy holds every retained
	// version.
	Rows bool `json:"rows,omitempty"`
	// Rollout is the rollout under way, if any.
	Rollout *BulkRollout `json:"rollout,omitempty"`
}

// BulkVersion is one published version of a bulk table.
type BulkVersion struct {
	Version uint64 `json:"version"`
	// Base is the version a delta overlays; 0 for a full version.
	Base          uint64 `json:"base,omitempty"`
	State         string `json:"state"`
	CreatedUnixMs int64  `json:"created_unix_ms,omitempty"`
	// ServingSinceUnixMs is when it last became the serving version.
	ServingSinceUnixMs int64 `json:"serving_since_unix_ms,omitempty"`
	// Files are the partition files, in partition index order.
	Files []BulkFile `json:"files"`
	// LoadedBy[i] lists the servers that reported partition i's file
	// loaded; the partition counts as loaded once every serving copy it
	// has now is among them. A server leaves the list when it stops being
	// a copy of the partition (its files go with it).
	LoadedBy [][]string `json:"loaded_by,omitempty"`
	// LoadedOn is the list's form in logs and snapshots from before
	// serving copies (one server per partition): read as a member of
	// LoadedBy[i], never written.
	LoadedOn []string `json:"loaded_on,omitempty"`
	// Streams: the files go through streams (BulkFile.Stream) and the
	// version switches only once all are stored. False when the cluster
	// could not place a stream at publish (fewer than bulkStreamReplicas
	// live servers in distinct fault domains): the files then exist only
	// on the servers they were uploaded to, and a partition that moves
	// needs the version published again.
	Streams bool `json:"streams,omitempty"`
	// Error says why the version cannot load: a server refused the file
	// it fetched from the stream. A loading version with an error never
	// switches; the next publish abandons it.
	Error string `json:"error,omitempty"`
}

// bulkStreamReplicas is the replica count of the stream manager's extents
// (stream.ManagerOptions.Replicas, default 3), each in its own fault domain.
const bulkStreamReplicas = 3

// streamsPlaceable reports whether a new extent can be placed now: enough
// live extent nodes in distinct fault domains.
func (s *State) streamsPlaceable() bool {
	fds := map[string]bool{}
	for _, n := range s.StreamManager().Nodes() {
		if n.Alive {
			fds[n.FaultDomain] = true
		}
	}
	return len(fds) >= bulkStreamReplicas
}

// BulkFile is one partition file of a version.
type BulkFile struct {
	Size    uint64 `json:"size"`
	CRC     uint32 `json:"crc"`
	Records uint64 `json:"records,omitempty"`
	// Stream is the stream holding the file once OpBulkStored recorded it
	// (sealed); empty before.
	Stream string `json:"stream,omitempty"`
}

// sameContent reports whether a and b describe the same files (what was
// published; where they are stored aside).
func sameContent(a, b []BulkFile) bool {
	return slices.EqualFunc(a, b, func(x, y BulkFile) bool {
		return x.Size == y.Size && x.CRC == y.CRC && x.Records == y.Records
	})
}

// bulkStreamPrefix starts the name of every bulk file's stream.
const bulkStreamPrefix = api.BulkStreamPrefix

// BulkStreamName is api.BulkStreamName: the stream partition index's file
// of version of table tableID is written into.
func BulkStreamName(tableID, version uint64, index int) string {
	return api.BulkStreamName(tableID, version, index)
}

// parseBulkStreamName reverses BulkStreamName.
func parseBulkStreamName(name string) (tableID, version uint64, index int, ok bool) {
	rest, found := strings.CutPrefix(name, bulkStreamPrefix)
	if !found {
		return 0, 0, 0, false
	}
	f := strings.Split(rest, "/")
	if len(f) != 3 {
		return 0, 0, 0, false
	}
	t, err1 := strconv.ParseUint(f[0], 10, 64)
	v, err2 := strconv.ParseUint(f[1], 10, 64)
	i, err3 := strconv.ParseUint(f[2], 10, 31)
	if err1 != nil || err2 != nil || err3 != nil || BulkStreamName(t, v, int(i)) != name {
		return 0, 0, 0, false
	}
	return t, v, int(i), true
}

// dropBulkStreams deletes the streams of version of t (every partition's,
// recorded or still being written). A stream that is not there is fine.
func (s *State) dropBulkStreams(t *Table, version uint64) {
	for i := range t.Partitions {
		s.dropStream(BulkStreamName(t.ID, version, i))
	}
}

func (s *State) dropStream(name string) {
	if _, _, err := s.StreamManager().Stream(name); err != nil {
		return
	}
	if _, err := s.streams().Apply(stream.Command{Op: stream.OpDeleteStream, Stream: name}); err != nil && !errors.Is(err, stream.ErrStreamNotFound) {
		panic(fmt.Sprintf("tablemaster: delete stream %s: %v", name, err)) // it exists: a broken invariant
	}
}

// StrayBulkStreams lists the bulk file streams (BulkStreamName) that no
// version of a table holds: their table is gone, or their version was
// published and is no longer retained or loading. A stream of a version not
// published yet is not stray (a publisher registers before it writes).
func (s *State) StrayBulkStreams() []string {
	byID := map[uint64]*Table{}
	for _, t := range s.Tables {
		byID[t.ID] = t
	}
	var out []string
	for _, name := range s.StreamManager().Streams() {
		tid, v, i, ok := parseBulkStreamName(name)
		if !ok {
			continue
		}
		t := byID[tid]
		switch {
		case t == nil:
			if tid < s.NextTableID {
				out = append(out, name) // dropped
			}
		case t.Bulk == nil || i >= len(t.Partitions):
			out = append(out, name)
		case t.Bulk.version(v) < 0 && v <= t.Bulk.LastVersion:
			out = append(out, name)
		}
	}
	return out
}

// bulkStored reports whether every file of bv is stored in its stream (or
// bv does not go through streams).
func (bv *BulkVersion) bulkStored() bool {
	return !bv.Streams || !slices.ContainsFunc(bv.Files, func(f BulkFile) bool { return f.Stream == "" })
}

// bulkMovable reports whether partition i of bulk table t can move to
// another server without losing anything: every version loaded anywhere
// (all but those still loading, whose publisher retries on the new
// server) has its file in a stream, where the new server fetches it.
func (t *Table) bulkMovable(i int) bool {
	if t.Bulk == nil {
		return false
	}
	for _, v := range t.Bulk.Versions {
		if v.State != BulkLoading && (!v.Streams || v.Files[i].Stream == "") {
			return false
		}
	}
	return true
}

func (b *BulkState) clone() *BulkState {
	if b == nil {
		return nil
	}
	c := *b
	if b.Rollout != nil {
		r := *b.Rollout
		c.Rollout = &r
	}
	c.Versions = slices.Clone(b.Versions)
	for i := range c.Versions {
		c.Versions[i].Files = slices.Clone(c.Versions[i].Files)
		c.Versions[i].LoadedOn = slices.Clone(c.Versions[i].LoadedOn)
		// The inner lists are replaced, never modified in place
		// (addLoaded, forgetLoaded): sharing them is safe.
		c.Versions[i].LoadedBy = slices.Clone(c.Versions[i].LoadedBy)
	}
	return &c
}

// loadedBy reports whether server reported partition i's file of bv
// loaded (and has not stopped being a copy of the partition since).
func (bv *BulkVersion) loadedBy(i int, server string) bool {
	if server == "" {
		return false
	}
	if i < len(bv.LoadedOn) && bv.LoadedOn[i] == server {
		return true
	}
	return i < len(bv.LoadedBy) && slices.Contains(bv.LoadedBy[i], server)
}

// addLoaded records that server loaded partition i's file of bv (of a
// table of n partitions); it reports whether that is new.
func (bv *BulkVersion) addLoaded(i, n int, server string) bool {
	if bv.loadedBy(i, server) {
		return false
	}
	if len(bv.LoadedBy) < n {
		bv.LoadedBy = append(bv.LoadedBy, make([][]string, n-len(bv.LoadedBy))...)
	}
	bv.LoadedBy[i] = append(slices.Clone(bv.LoadedBy[i]), server)
	return true
}

// forgetLoaded drops server from the copies that loaded partition i, in
// every version of b: it no longer hosts the partition, and a later copy
// there starts without the files.
func (b *BulkState) forgetLoaded(i int, server string) {
	if b == nil {
		return
	}
	for k := range b.Versions {
		bv := &b.Versions[k]
		if i < len(bv.LoadedOn) && bv.LoadedOn[i] == server {
			bv.LoadedOn = slices.Clone(bv.LoadedOn)
			bv.LoadedOn[i] = ""
		}
		if i < len(bv.LoadedBy) && slices.Contains(bv.LoadedBy[i], server) {
			bv.LoadedBy[i] = slices.DeleteFunc(slices.Clone(bv.LoadedBy[i]), func(s string) bool { return s == server })
		}
	}
}

// loadedServers lists the servers that reported partition i's file of bv
// loaded.
func (bv *BulkVersion) loadedServers(i int) []string {
	var out []string
	if i < len(bv.LoadedOn) && bv.LoadedOn[i] != "" {
		out = append(out, bv.LoadedOn[i])
	}
	if i < len(bv.LoadedBy) {
		for _, s := range bv.LoadedBy[i] {
			if !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
	}
	return out
}

// version returns the index of version v, or -1.
func (b *BulkState) version(v uint64) int {
	return slices.IndexFunc(b.Versions, func(x BulkVersion) bool { return x.Version == v })
}

// bulkLoaded reports whether partition i of t has version bv loaded on
// every serving copy it has now.
func (t *Table) bulkLoaded(bv *BulkVersion, i int) bool {
	if t.Bulk.Rows {
		return t.rowsLoaded(bv, i)
	}
	p := &t.Partitions[i]
	if len(p.Replicas) == 0 {
		return false
	}
	for _, r := range p.Replicas {
		if !bv.loadedBy(i, r.ServerID) {
			return false
		}
	}
	return true
}

// BulkLoadedCount is how many partitions of t have bv loaded where they
// are hosted now.
func (t *Table) BulkLoadedCount(bv *BulkVersion) int {
	n := 0
	for i := range t.Partitions {
		if t.bulkLoaded(bv, i) {
			n++
		}
	}
	return n
}

// BulkRetained lists the versions servers keep loaded, ascending: every
// version in t.Bulk (loading ones included, so uploads are kept).
func (t *Table) BulkRetained() []uint64 {
	if t.Bulk == nil {
		return nil
	}
	out := make([]uint64, len(t.Bulk.Versions))
	for i, v := range t.Bulk.Versions {
		out[i] = v.Version
	}
	return out
}

// readyVersions lists the versions loaded everywhere and retained.
func (t *Table) readyVersions() []uint64 {
	var out []uint64
	for _, v := range t.Bulk.Versions {
		if v.State != BulkLoading {
			out = append(out, v.Version)
		}
	}
	return out
}

// bulkMaybeSwitch switches t to loading version v once every partition's
// server loaded it and every file is stored in its stream, unless a server
// refused its file (its publish failed). In rows mode the rollout moves on
// instead.
func (s *State) bulkMaybeSwitch(t *Table, v *BulkVersion, unixMs int64) {
	if t.Bulk.Rows {
		s.bulkAdvance(t, unixMs)
		t.pruneLoaded()
		return
	}
	if v.State == BulkLoading && v.Error == "" && v.bulkStored() && t.BulkLoadedCount(v) == len(t.Partitions) {
		s.bulkSwitch(t, v.Version, unixMs)
	}
}

// bulkSwitch makes version v (loaded everywhere) the serving one, then
// keeps only the retained versions: the serving one, the newest
// Options.BulkRetainedVersions-1 others loaded everywhere, any version
// still loading, and the bases of every kept delta. The streams of the
// versions dropped are deleted.
func (s *State) bulkSwitch(t *Table, v uint64, unixMs int64) {
	b := t.Bulk
	for i := range b.Versions {
		x := &b.Versions[i]
		switch {
		case x.Version == v:
			x.State, x.ServingSinceUnixMs = BulkServing, unixMs
		case x.State == BulkServing:
			x.State = BulkReady
		case x.State == BulkLoading && x.Version < v:
			// Only on rollback past a loading version can this not be
			// reached: publish abandons older loading versions.
		}
	}
	b.Current = v
	keep := map[uint64]bool{v: true}
	others := 1
	for i := len(b.Versions) - 1; i >= 0; i-- {
		x := b.Versions[i]
		switch {
		case x.State == BulkLoading && x.Version > v:
			keep[x.Version] = true
		case x.Version != v && x.State != BulkLoading && others < int(t.Options.BulkRetainedVersions):
			keep[x.Version] = true
			others++
		}
	}
	// Bases of kept deltas, transitively (a delta's base is older, so one
	// pass from the newest down closes the chain).
	for i := len(b.Versions) - 1; i >= 0; i-- {
		if x := b.Versions[i]; keep[x.Version] && x.Base != 0 {
			keep[x.Base] = true
		}
	}
	b.Versions = slices.DeleteFunc(b.Versions, func(x BulkVersion) bool {
		if !keep[x.Version] {
			s.dropBulkStreams(t, x.Version)
			return true
		}
		return false
	})
}

// BulkInfoProto returns t's bulk state as the wire message; detail adds
// the per-partition files and load flags.
func (t *Table) BulkInfoProto(detail bool) *api.BulkInfo {
	if t.Bulk == nil {
		return nil
	}
	info := &api.BulkInfo{Current: t.Bulk.Current, Rollout: t.RolloutProto()}
	for i := range t.Bulk.Versions {
		v := &t.Bulk.Versions[i]
		pv := &api.BulkVersion{
			Version: v.Version, BaseVersion: v.Base, State: bulkStateProto(v.State),
			CreatedUnixMs: v.CreatedUnixMs, ServingSinceUnixMs: v.ServingSinceUnixMs,
			LoadedPartitions: uint32(t.BulkLoadedCount(v)), Error: v.Error, Streams: v.Streams,
		}
		for pi, f := range v.Files {
			pv.Records += f.Records
			pv.Bytes += f.Size
			if detail {
				pv.Files = append(pv.Files, &api.BulkFile{Partition: uint32(pi), Size: f.Size, Crc32C: f.CRC, Records: f.Records, Stream: f.Stream})
				pv.Loaded = append(pv.Loaded, t.bulkLoaded(v, pi))
			}
		}
		info.Versions = append(info.Versions, pv)
	}
	return info
}

func bulkStateProto(s string) api.BulkVersionState {
	switch s {
	case BulkLoading:
		return api.BulkVersionState_BULK_VERSION_STATE_LOADING
	case BulkReady:
		return api.BulkVersionState_BULK_VERSION_STATE_READY
	case BulkServing:
		return api.BulkVersionState_BULK_VERSION_STATE_SERVING
	}
	return api.BulkVersionState_BULK_VERSION_STATE_UNSPECIFIED
}

// BulkFilesFromProto converts a publish request's files.
func BulkFilesFromProto(fs []*api.BulkFile) []BulkFile {
	out := make([]BulkFile, len(fs))
	for i, f := range fs {
		out[i] = BulkFile{Size: f.GetSize(), CRC: f.GetCrc32C(), Records: f.GetRecords()}
	}
	return out
}

// checkBulkStream checks, at proposal, that a bulk file's stream exists and
// is sealed to a non-zero length.
func (s *State) checkBulkStream(name string) error {
	_, exts, err := s.StreamManager().Stream(name)
	if err != nil {
		return errInvalid("stream", "stream_missing", 0, "stream %q: %v; write the file into it first", name, err)
	}
	var n int64
	for _, e := range exts {
		if !e.Sealed {
			return errInvalid("stream", "stream_not_sealed", 0, "stream %q has an open extent %d; it is sealed before it is recorded", name, e.ID)
		}
		n += e.Length
	}
	if n == 0 {
		return errInvalid("stream", "stream_empty", 0, "stream %q is empty", name)
	}
	return nil
}

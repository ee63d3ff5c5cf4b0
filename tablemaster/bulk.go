package tablemaster

import (
	"fmt"
	"slices"

	"github.com/tabuladb/tabula/api"
)

// Bulk tables (DESIGN §6). A version's files are built offline (one per
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
	// LoadedOn[i] is the server that reported partition i's file loaded;
	// the partition counts as loaded only while that server hosts it.
	LoadedOn []string `json:"loaded_on"`
}

// BulkFile is one partition file of a version.
type BulkFile struct {
	Size    uint64 `json:"size"`
	CRC     uint32 `json:"crc"`
	Records uint64 `json:"records,omitempty"`
}

func (b *BulkState) clone() *BulkState {
	if b == nil {
		return nil
	}
	c := *b
	c.Versions = slices.Clone(b.Versions)
	for i := range c.Versions {
		c.Versions[i].Files = slices.Clone(c.Versions[i].Files)
		c.Versions[i].LoadedOn = slices.Clone(c.Versions[i].LoadedOn)
	}
	return &c
}

// version returns the index of version v, or -1.
func (b *BulkState) version(v uint64) int {
	return slices.IndexFunc(b.Versions, func(x BulkVersion) bool { return x.Version == v })
}

// loaded reports whether partition i of t has version bv loaded on the
// server that hosts it now.
func (t *Table) bulkLoaded(bv *BulkVersion, i int) bool {
	p := &t.Partitions[i]
	if len(p.Replicas) == 0 || bv.LoadedOn[i] == "" {
		return false
	}
	for _, r := range p.Replicas {
		if r.ServerID != bv.LoadedOn[i] {
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

// bulkTable finds a bulk table for a bulk command.
func (s *State) bulkTable(cmd Command) (*Table, error) {
	if err := errValidateName("tenant", cmd.Tenant); err != nil {
		return nil, err
	}
	if err := errValidateName("table", cmd.Table); err != nil {
		return nil, err
	}
	t, err := s.Table(cmd.Tenant, cmd.Table)
	if err != nil {
		return nil, err
	}
	if t.Kind != api.TableKind_TABLE_KIND_BULK || t.Bulk == nil {
		return nil, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_WRONG_KIND, "not_bulk",
			"table %s/%s is a %s table; versions are published to bulk tables", t.Tenant, t.Name, api.KindName(t.Kind))
	}
	return t, nil
}

func (s *State) bulkPublish(cmd Command) (Result, error) {
	t, err := s.bulkTable(cmd)
	if err != nil {
		return Result{}, err
	}
	b := t.Bulk
	if cmd.Version == 0 {
		return Result{}, errInvalid("version", "version_zero", 0, "version must be 1 or more (build with --version N, or with --table to take the next one)")
	}
	if len(cmd.Files) != len(t.Partitions) {
		return Result{}, errInvalid("files", "partition_count", uint64(len(t.Partitions)),
			"%d files for a table of %d partitions (build with --table %s, or --partitions %d)", len(cmd.Files), len(t.Partitions), t.Name, len(t.Partitions))
	}
	for i, f := range cmd.Files {
		if f.Size == 0 || f.Size > MaxBulkFileBytes {
			return Result{}, errInvalid(fmt.Sprintf("files[%d].size", i), "file_size", MaxBulkFileBytes, "partition %d's file size %d is not in 1..%d", i, f.Size, uint64(MaxBulkFileBytes))
		}
	}
	if k := b.version(cmd.Version); k >= 0 {
		// The same version again: a resumed or repeated publish, fine if
		// it is the same content (the uploads go where it is not loaded).
		v := &b.Versions[k]
		if v.Base != cmd.BaseVersion || !slices.Equal(v.Files, cmd.Files) {
			return Result{}, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_ALREADY_EXISTS, "version_exists",
				"version %d of %s/%s was published with other files; build the new content as version %d or later", cmd.Version, t.Tenant, t.Name, b.LastVersion+1)
		}
		return Result{Table: t}, nil
	}
	if cmd.Version <= b.LastVersion {
		return Result{}, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_ALREADY_EXISTS, "version_taken",
			"version %d of %s/%s is not newer than version %d, published before; build as version %d or later", cmd.Version, t.Tenant, t.Name, b.LastVersion, b.LastVersion+1)
	}
	if cmd.BaseVersion != 0 {
		k := b.version(cmd.BaseVersion)
		if k < 0 || b.Versions[k].State == BulkLoading {
			return Result{}, errInvalid("base_version", "base_not_retained", 0,
				"delta base version %d of %s/%s is not a loaded, retained version (retained: %v)", cmd.BaseVersion, t.Tenant, t.Name, t.readyVersions())
		}
	}
	// Validation is over: mutate. A version still loading is abandoned by
	// a newer publish: its uploads are deleted.
	b.Versions = slices.DeleteFunc(b.Versions, func(v BulkVersion) bool { return v.State == BulkLoading })
	b.Versions = append(b.Versions, BulkVersion{
		Version: cmd.Version, Base: cmd.BaseVersion, State: BulkLoading, CreatedUnixMs: cmd.UnixMs,
		Files: slices.Clone(cmd.Files), LoadedOn: make([]string, len(t.Partitions)),
	})
	b.LastVersion = cmd.Version
	return Result{Changed: true, Table: t}, nil
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

func (s *State) bulkLoadedCmd(cmd Command) (Result, error) {
	t, err := s.bulkTable(cmd)
	if err != nil {
		return Result{}, err
	}
	b := t.Bulk
	k := b.version(cmd.Version)
	if k < 0 {
		// Unloaded or abandoned meanwhile: the server will drop it.
		return Result{}, nil
	}
	pi := slices.IndexFunc(t.Partitions, func(p Partition) bool { return p.ID == cmd.PartitionID })
	if pi < 0 {
		return Result{}, errInvalid("partition_id", "partition_not_in_table", 0, "partition %d is not in %s/%s", cmd.PartitionID, t.Tenant, t.Name)
	}
	if cmd.File == nil {
		return Result{}, errInvalid("file", "file_missing", 0, "the loaded file's size and crc are missing")
	}
	v := &b.Versions[k]
	if f := v.Files[pi]; f.Size != cmd.File.Size || f.CRC != cmd.File.CRC {
		return Result{}, errInvalid("file", "file_mismatch", 0, "server %s loaded a file of %d bytes, crc %08x, for partition %d of version %d; the version's file is %d bytes, crc %08x",
			cmd.ServerID, cmd.File.Size, cmd.File.CRC, pi, cmd.Version, f.Size, f.CRC)
	}
	hosted := slices.ContainsFunc(t.Partitions[pi].Replicas, func(r Replica) bool { return r.ServerID == cmd.ServerID })
	if !hosted || v.LoadedOn[pi] == cmd.ServerID {
		return Result{}, nil
	}
	v.LoadedOn[pi] = cmd.ServerID
	res := Result{Changed: true, Table: t}
	if v.State == BulkLoading && t.BulkLoadedCount(v) == len(t.Partitions) {
		t.bulkSwitch(cmd.Version, cmd.UnixMs)
	}
	return res, nil
}

func (s *State) bulkRollback(cmd Command) (Result, error) {
	t, err := s.bulkTable(cmd)
	if err != nil {
		return Result{}, err
	}
	b := t.Bulk
	k := b.version(cmd.Version)
	if k < 0 {
		return Result{}, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_NOT_FOUND, "version_not_retained",
			"version %d of %s/%s is not retained (retained: %v)", cmd.Version, t.Tenant, t.Name, t.readyVersions())
	}
	if cmd.Version == b.Current {
		return Result{Table: t}, nil
	}
	v := &b.Versions[k]
	if n := t.BulkLoadedCount(v); n < len(t.Partitions) {
		return Result{}, errCode(ErrInvalidArgument, api.ErrorCode_ERROR_CODE_UNAVAILABLE, "version_not_loaded",
			"version %d of %s/%s is loaded on %d of %d partitions (a partition moved, or it is still loading); publish it again to reload it", cmd.Version, t.Tenant, t.Name, n, len(t.Partitions))
	}
	t.bulkSwitch(cmd.Version, cmd.UnixMs)
	return Result{Changed: true, Table: t}, nil
}

// bulkSwitch makes version v (loaded everywhere) the serving one, then
// keeps only the retained versions: the serving one, the newest
// Options.BulkRetainedVersions-1 others loaded everywhere, any version
// still loading, and the bases of every kept delta.
func (t *Table) bulkSwitch(v uint64, unixMs int64) {
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
	b.Versions = slices.DeleteFunc(b.Versions, func(x BulkVersion) bool { return !keep[x.Version] })
}

// BulkInfoProto returns t's bulk state as the wire message; detail adds
// the per-partition files and load flags.
func (t *Table) BulkInfoProto(detail bool) *api.BulkInfo {
	if t.Bulk == nil {
		return nil
	}
	info := &api.BulkInfo{Current: t.Bulk.Current}
	for i := range t.Bulk.Versions {
		v := &t.Bulk.Versions[i]
		pv := &api.BulkVersion{
			Version: v.Version, BaseVersion: v.Base, State: bulkStateProto(v.State),
			CreatedUnixMs: v.CreatedUnixMs, ServingSinceUnixMs: v.ServingSinceUnixMs,
			LoadedPartitions: uint32(t.BulkLoadedCount(v)),
		}
		for pi, f := range v.Files {
			pv.Records += f.Records
			pv.Bytes += f.Size
			if detail {
				pv.Files = append(pv.Files, &api.BulkFile{Partition: uint32(pi), Size: f.Size, Crc32C: f.CRC, Records: f.Records})
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

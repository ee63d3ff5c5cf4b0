package tablemaster

import (
	"bytes"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/internal/keyspace"
)

// The catalog sub-machine: OpCreateTable and OpDropTable, and the rules
// that normalize a table's options.

// defaultReplication is the factor of a create-table request that names none.
func defaultReplication() uint32 {
	if replicationServed {
		return DefaultReplication
	}
	return 1
}

// defaultReplicationFor is the factor of a new table of kind that names
// none: DefaultReplication, or as many as the live servers' fault domains
// when they are fewer (a one-server development cluster gets 1; a factor
// asked for explicitly is refused above the domains instead). With no live
// server at all it is DefaultReplication: the cluster is starting. For a
// bulk table the factor is its number of serving copies.
func (s *State) defaultReplicationFor(kind api.TableKind) uint32 {
	n := defaultReplication()
	domains := map[string]bool{}
	for _, c := range s.candidates() {
		if c.Available {
			domains[c.domain()] = true
		}
	}
	if d := uint32(len(domains)); d > 0 && d < n {
		n = d
	}
	return n
}

// checkReplication checks a replication factor (defaults filled in) against
// the range and the switch: served says whether factors above 1 are served.
func checkReplication(n uint32, served bool) error {
	switch {
	case n < 1 || n > MaxReplication:
		return errInvalid("options.replication", "replication_out_of_range", MaxReplication,
			"options.replication is %d; it must be 1 to %d", n, MaxReplication)
	case n > 1 && !served:
		return errCode(ErrUnimplemented, api.ErrorCode_ERROR_CODE_UNIMPLEMENTED, "replication_not_implemented",
			"options.replication %d: replication factor >1 arrives with data-path replication", n)
	}
	return nil
}

// checkReplicationFits refuses a factor above the number of fault domains
// the available servers span: placement puts at most one replica of a
// partition in a domain, so such a table would stay short of copies for good
// while looking replicated. Any factor is accepted with no server at all
// (a cluster starting up: the partitions wait, unplaced, for servers).
func (s *State) checkReplicationFits(n uint32) error {
	if n <= 1 {
		return nil
	}
	domains := map[string]bool{}
	for _, c := range s.candidates() {
		if c.Available {
			domains[c.domain()] = true
		}
	}
	if d := len(domains); d > 0 && int(n) > d {
		return errInvalid("options.replication", "replication_above_fault_domains", uint64(d),
			"options.replication is %d but the live servers span %d fault domain(s), and each replica needs a domain of its own: "+
				"ask for at most %d replicas or start servers in more fault domains (tabula server --fault-domain)", n, d, d)
	}
	return nil
}

// NormalizeOptions checks a table's kind and options and fills in defaults
// (replication: defaultReplication).
func NormalizeOptions(kind api.TableKind, o *TableOptions) (TableOptions, error) {
	if o != nil {
		if err := checkSplitSettings(kind, o.splitSettings()); err != nil {
			return TableOptions{}, err
		}
	}
	if o != nil && len(o.SplitPoints) > 0 && kind != api.TableKind_TABLE_KIND_ORDERED {
		return TableOptions{}, errInvalid("options.split_points", "split_points_not_ordered", 0,
			"split points apply to ordered tables only; %s tables are partitioned by key hash (options.partitions)", api.KindName(kind))
	}
	switch kind {
	case api.TableKind_TABLE_KIND_POINT:
	case api.TableKind_TABLE_KIND_BULK:
		return normalizeBulkOptions(o)
	case api.TableKind_TABLE_KIND_ORDERED:
		return normalizeOrderedOptions(o)
	default:
		return TableOptions{}, errInvalid("kind", "kind_invalid", 0, "kind must be point, bulk or ordered (got %d)", int32(kind))
	}
	n, err := normalizeCommon(o)
	if err != nil {
		return TableOptions{}, err
	}
	if n.BulkRetainedVersions != 0 {
		return TableOptions{}, errInvalid("options.bulk_retained_versions", "bulk_option", 0, "options.bulk_retained_versions applies to bulk tables only")
	}
	if n.Storage == "" {
		n.Storage = StorageSSD
	}
	if n.Storage != StorageMemory && n.Storage != StorageSSD {
		return TableOptions{}, errInvalid("options.storage", "storage_invalid", 0,
			"options.storage %q is not supported; allowed values: %q, %q", n.Storage, StorageMemory, StorageSSD)
	}
	if n.Durability, err = ssdOption(n.Storage, "durability", n.Durability, DurabilitySync, DurabilityLazy,
		"; a memory table loses its data when its server stops"); err != nil {
		return TableOptions{}, err
	}
	if n.Compression, err = ssdOption(n.Storage, "compression", n.Compression, CompressionNone, CompressionS2, ""); err != nil {
		return TableOptions{}, err
	}
	return n, nil
}

// normalizeOrderedOptions: an ordered table takes a point table's
// options (its engine honours the same storage, durability and
// compression), and its partitions are the key ranges its split points
// cut: options.partitions is their number, filled in here.
func normalizeOrderedOptions(o *TableOptions) (TableOptions, error) {
	b := TableOptions{}
	if o != nil {
		b = *o
	}
	sp := b.SplitPoints
	if len(sp) >= api.MaxPartitions {
		return TableOptions{}, errInvalid("options.split_points", "too_many_partitions", api.MaxPartitions-1,
			"%d split points make %d partitions; the limit is %d partitions", len(sp), len(sp)+1, api.MaxPartitions)
	}
	for i, k := range sp {
		switch {
		case len(k) == 0:
			return TableOptions{}, errInvalid("options.split_points", "split_point_empty", 0, "split point %d is empty (every key is at or above the empty key)", i)
		case len(k) > api.MaxKeyBytes:
			return TableOptions{}, errInvalid("options.split_points", "key_too_large", api.MaxKeyBytes, "split point %d is %d bytes; keys are at most %d", i, len(k), api.MaxKeyBytes)
		case i > 0 && bytes.Compare(sp[i-1], k) >= 0:
			return TableOptions{}, errInvalid("options.split_points", "split_points_unordered", 0, "split points must be strictly increasing: %d (%q) is not above %d (%q)", i, k, i-1, sp[i-1])
		}
	}
	want := uint32(len(sp) + 1)
	if b.Partitions != 0 && b.Partitions != want {
		return TableOptions{}, errInvalid("options.partitions", "partitions_with_split_points", 0,
			"options.partitions is %d, but %d split points make %d partitions: an ordered table is partitioned by its split points", b.Partitions, len(sp), want)
	}
	b.Partitions = want
	b.SplitPoints = nil
	n, err := NormalizeOptions(api.TableKind_TABLE_KIND_POINT, &b)
	if err != nil {
		return TableOptions{}, err
	}
	n.SplitPoints = make([][]byte, len(sp))
	for i, k := range sp {
		n.SplitPoints[i] = bytes.Clone(k)
	}
	return n, nil
}

// normalizeBulkOptions: bulk tables keep their version files on the
// servers' disks (storage ssd); durability and compression are the
// builder's business, not options.
func normalizeBulkOptions(o *TableOptions) (TableOptions, error) {
	// options.replication is the number of serving copies of each
	// partition, in distinct fault domains: every copy loads each version
	// (from its stream) and answers reads, and a version switches once
	// every copy has it.
	b := TableOptions{}
	if o != nil {
		b = *o
	}
	n, err := normalizeCommon(&b)
	if err != nil {
		return TableOptions{}, err
	}
	if n.Storage == "" {
		n.Storage = StorageSSD
	}
	if n.Storage != StorageSSD {
		return TableOptions{}, errInvalid("options.storage", "storage_invalid", 0,
			"options.storage %q: bulk tables keep their version files on disk (storage %q)", n.Storage, StorageSSD)
	}
	if n.Durability != "" || n.Compression != "" || n.DefaultTTLMs != 0 {
		return TableOptions{}, errInvalid("options", "bulk_option", 0,
			"durability, compression and default TTL do not apply to bulk tables (their files are built offline and verified at load)")
	}
	if n.BulkRetainedVersions == 0 {
		n.BulkRetainedVersions = DefaultBulkRetained
	}
	if n.BulkRetainedVersions > MaxBulkRetained {
		return TableOptions{}, errInvalid("options.bulk_retained_versions", "too_many_retained", MaxBulkRetained,
			"options.bulk_retained_versions is %d; the limit is %d", n.BulkRetainedVersions, MaxBulkRetained)
	}
	return n, nil
}

// normalizeCommon checks and defaults the options of every kind.
func normalizeCommon(o *TableOptions) (TableOptions, error) {
	var n TableOptions
	if o != nil {
		n = *o
	}
	if n.Partitions == 0 {
		n.Partitions = api.DefaultPartitions
	}
	if n.Partitions > api.MaxPartitions {
		return TableOptions{}, errInvalid("options.partitions", "too_many_partitions", api.MaxPartitions,
			"options.partitions is %d; the limit is %d", n.Partitions, api.MaxPartitions)
	}
	if n.Replication == 0 {
		n.Replication = defaultReplication()
	}
	if err := checkReplication(n.Replication, replicationServed); err != nil {
		return TableOptions{}, err
	}
	if n.MaxValueBytes == 0 {
		n.MaxValueBytes = api.DefaultMaxValueBytes
	}
	if n.MaxValueBytes > api.MaxValueBytesLimit {
		return TableOptions{}, errInvalid("options.max_value_bytes", "max_value_bytes_too_large", api.MaxValueBytesLimit,
			"options.max_value_bytes is %d; the limit is %d", n.MaxValueBytes, api.MaxValueBytesLimit)
	}
	if n.DefaultTTLMs > api.MaxTTLMs {
		return TableOptions{}, errInvalid("options.default_ttl_ms", "ttl_too_long", api.MaxTTLMs,
			"options.default_ttl_ms is %d ms; the limit is %d ms (100 years)", n.DefaultTTLMs, uint64(api.MaxTTLMs))
	}
	return n, nil
}

// ssdOption validates an option only ssd tables take: empty for memory
// tables (refused otherwise, with why appended), else def when empty, else
// def or other.
func ssdOption(storage, name, v, def, other, why string) (string, error) {
	field, reason := "options."+name, name+"_invalid"
	switch {
	case storage == StorageMemory && v != "":
		return "", errInvalid(field, reason, 0, "%s %q applies to ssd tables only%s", field, v, why)
	case storage == StorageMemory:
		return "", nil
	case v == "":
		return def, nil
	case v != def && v != other:
		return "", errInvalid(field, reason, 0, "%s %q is not supported; allowed values: %q, %q", field, v, def, other)
	}
	return v, nil
}

// partitionCount is the number of partitions of every table.
func (s *State) partitionCount() int {
	n := 0
	for _, t := range s.Tables {
		n += len(t.Partitions)
	}
	return n
}

func (s *State) createTable(cmd *CreateTable, unixMs int64, chk bool) (Result, error) {
	if err := checkName(chk, "tenant", cmd.Tenant); err != nil {
		return Result{}, err
	}
	if err := checkName(chk, "name", cmd.Table); err != nil {
		return Result{}, err
	}
	var req TableOptions
	if cmd.Options != nil {
		req = *cmd.Options
	}
	if req.Replication == 0 {
		// The master logs the factor it resolved (CreateTable fills the
		// default in), so a replay never depends on today's default; 0 is
		// from a master before that, whose default was 1.
		req.Replication = 1
	}
	var opts TableOptions
	if chk {
		var err error
		if opts, err = NormalizeOptions(cmd.Kind, &req); err != nil {
			return Result{}, err
		}
		// Logged normalized: a replay needs no defaults.
		logged := opts
		cmd.Options = &logged
	} else {
		opts = fillOptionDefaults(cmd.Kind, req)
	}
	if _, ok := s.Tenants[cmd.Tenant]; !ok {
		return Result{}, errTenantNotFound(cmd.Tenant)
	}
	if chk {
		if err := s.checkReplicationFits(opts.Replication); err != nil {
			return Result{}, err
		}
	}
	key := tableKey(cmd.Tenant, cmd.Table)
	if _, ok := s.Tables[key]; ok {
		return Result{}, errCode(ErrTableExists, api.ErrorCode_ERROR_CODE_ALREADY_EXISTS, "table_exists", "table %s already exists", key)
	}
	if total := s.partitionCount() + int(opts.Partitions); chk && total > api.MaxClusterPartitions {
		return Result{}, errInvalid("options.partitions", "cluster_partition_limit", api.MaxClusterPartitions,
			"the cluster would hold %d partitions; the limit is %d (it keeps the master's snapshot and the servers' map watch bounded)", total, api.MaxClusterPartitions)
	}
	// Validation is over: mutate.
	n := int(opts.Partitions)
	t := &Table{
		Tenant: cmd.Tenant, Name: cmd.Table, Kind: cmd.Kind, Options: opts,
		ID: s.NextTableID, CreatedUnixMs: unixMs,
		Partitions: make([]Partition, n),
	}
	if cmd.Kind == api.TableKind_TABLE_KIND_BULK {
		t.Bulk = &BulkState{}
	}
	for i := range t.Partitions {
		start, end := keyspace.Range(i, n)
		t.Partitions[i] = Partition{ID: s.NextPartitionID + uint64(i), Index: uint32(i), Start: start, End: end}
		if cmd.Kind == api.TableKind_TABLE_KIND_ORDERED {
			t.Partitions[i].Start, t.Partitions[i].End = 0, 0
			if i > 0 {
				t.Partitions[i].KeyStart = opts.SplitPoints[i-1]
			}
			if i < len(opts.SplitPoints) {
				t.Partitions[i].KeyEnd = opts.SplitPoints[i]
			}
		}
		if t.replicatesByLog() {
			t.Partitions[i].Log = &PartitionLog{Stream: LogStreamName(t.Partitions[i].ID)}
		}
	}
	s.NextTableID++
	s.NextPartitionID += uint64(n)
	s.tablesW()[key] = t
	s.ownNewTable(t)
	cands := s.candidates()
	var moved []uint64
	for i := range t.Partitions {
		if s.fill(t, i, cands) {
			moved = append(moved, t.Partitions[i].ID)
		}
	}
	return Result{Changed: true, Table: t, Moved: moved}, nil
}

func (s *State) dropTable(cmd *DropTable, chk bool) (Result, error) {
	if err := checkName(chk, "tenant", cmd.Tenant); err != nil {
		return Result{}, err
	}
	if err := checkName(chk, "name", cmd.Table); err != nil {
		return Result{}, err
	}
	t, err := s.Table(cmd.Tenant, cmd.Table)
	if err != nil {
		return Result{}, err
	}
	if t.Bulk != nil {
		for _, v := range t.Bulk.Versions {
			s.dropBulkStreams(t, v.Version)
		}
	}
	s.dropLogStreams(t)
	delete(s.tablesW(), tableKey(cmd.Tenant, cmd.Table))
	return Result{Changed: true}, nil
}

// checkName is errValidateName at proposal (chk), nothing for a logged
// command.
func checkName(chk bool, field, name string) error {
	if !chk {
		return nil
	}
	return errValidateName(field, name)
}

// fillOptionDefaults is the options a logged OpCreateTable applies: o
// with every zero field defaulted as NormalizeOptions would, refusing
// nothing (a logged command was validated when it was proposed; masters
// from before it was logged normalized did not log the defaults).
func fillOptionDefaults(kind api.TableKind, o TableOptions) TableOptions {
	if o.Partitions == 0 {
		o.Partitions = api.DefaultPartitions
	}
	if o.Replication == 0 {
		o.Replication = 1
	}
	if o.MaxValueBytes == 0 {
		o.MaxValueBytes = api.DefaultMaxValueBytes
	}
	if o.Storage == "" {
		o.Storage = StorageSSD
	}
	if kind == api.TableKind_TABLE_KIND_BULK {
		// The logged factor is the table's serving copies (logs from
		// before copies carry 0, defaulted to 1 above).
		if o.BulkRetainedVersions == 0 {
			o.BulkRetainedVersions = DefaultBulkRetained
		}
		return o
	}
	if o.Storage != StorageMemory {
		if o.Durability == "" {
			o.Durability = DurabilitySync
		}
		if o.Compression == "" {
			o.Compression = CompressionNone
		}
	}
	return o
}

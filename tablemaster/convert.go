package tablemaster

import "github.com/tabuladb/tabula/api"

// Proto returns t as the wire message.
func (t *Table) Proto() *api.Table {
	return &api.Table{
		Tenant: t.Tenant,
		Name:   t.Name,
		Kind:   t.Kind,
		Options: &api.TableOptions{
			Partitions:    t.Options.Partitions,
			Replication:   t.Options.Replication,
			MaxValueBytes: t.Options.MaxValueBytes,
			DefaultTtlMs:  t.Options.DefaultTTLMs,
			Storage:       t.Options.Storage,
			Durability:    t.Options.Durability,
			Compression:   t.Options.Compression,

			BulkRetainedVersions: t.Options.BulkRetainedVersions,
			SplitPoints:          t.Options.SplitPoints,
			MinPartitions:        t.Options.MinPartitions,
			MaxPartitions:        t.Options.MaxPartitions,
			SplitSizeBytes:       t.Options.SplitSizeBytes,
			SplitQps:             t.Options.SplitQPS,
		},
		Id:            t.ID,
		CreatedUnixMs: t.CreatedUnixMs,
	}
}

// MapProto returns t's partition map as the wire message, stamped with the
// cluster map version it was taken at.
func (t *Table) MapProto(version uint64) *api.PartitionMap {
	m := &api.PartitionMap{Table: t.Proto(), Version: version, Partitions: make([]*api.Partition, len(t.Partitions))}
	for i := range t.Partitions {
		m.Partitions[i] = t.partitionProto(i)
	}
	m.Bulk = t.BulkInfoProto(false)
	m.Coprocessors = t.CoprocsProto()
	return m
}

// partitionProto is partition i of t as the wire message, with what each
// copy of a bulk partition serves and holds.
func (t *Table) partitionProto(i int) *api.Partition {
	ap := t.Partitions[i].Proto()
	if t.Bulk == nil {
		return ap
	}
	for k := range t.Partitions[i].Replicas {
		r := &t.Partitions[i].Replicas[k]
		ap.Replicas[k].BulkServes = t.copyServes(r)
		ap.Replicas[k].BulkHolds = t.copyHolds(i, r)
	}
	return ap
}

// Proto returns p as the wire message.
func (p Partition) Proto() *api.Partition {
	ap := &api.Partition{Id: p.ID, Start: p.Start, End: p.End, Epoch: p.Epoch, Index: p.Index,
		KeyStart: p.KeyStart, KeyEnd: p.KeyEnd, Replicas: make([]*api.Replica, len(p.Replicas))}
	for i, r := range p.Replicas {
		ap.Replicas[i] = &api.Replica{ServerId: r.ServerID, Addr: r.Addr, Role: r.Role, FaultDomain: r.FaultDomain}
	}
	if p.Log != nil {
		ap.Log = &api.PartitionLog{Stream: p.Log.Stream, Extent: p.Log.Extent}
	}
	ap.DataLost = p.DataLost != nil
	if p.Handoff != nil {
		ap.HandoffFrom = p.Handoff.From
	}
	if sp := p.Split; sp != nil {
		ap.Split = &api.PartitionSplit{LeftId: sp.Left, RightId: sp.Right, Hash: sp.Hash, Key: sp.Key}
	}
	ap.SplitFrom, ap.SplitLsn = p.SplitFrom, p.SplitLSN
	ap.SplitReason, ap.SplitUnixMs = p.SplitReason, p.SplitUnixMs
	if mg := p.Merge; mg != nil {
		ap.Merge = &api.PartitionMerge{LeftId: mg.Left, RightId: mg.Right, ChildId: mg.Child}
	}
	ap.MergeLeft, ap.MergeRight, ap.MergeLsn = p.MergeLeft, p.MergeRight, p.MergeLSN
	return ap
}

// optionsFromProto converts request options; nil means all defaults.
func optionsFromProto(o *api.TableOptions) *TableOptions {
	if o == nil {
		return nil
	}
	return &TableOptions{
		Partitions:    o.GetPartitions(),
		Replication:   o.GetReplication(),
		MaxValueBytes: o.GetMaxValueBytes(),
		DefaultTTLMs:  o.GetDefaultTtlMs(),
		Storage:       o.GetStorage(),
		Durability:    o.GetDurability(),
		Compression:   o.GetCompression(),

		BulkRetainedVersions: o.GetBulkRetainedVersions(),
		SplitPoints:          o.GetSplitPoints(),
		MinPartitions:        o.GetMinPartitions(),
		MaxPartitions:        o.GetMaxPartitions(),
		SplitSizeBytes:       o.GetSplitSizeBytes(),
		SplitQPS:             o.GetSplitQps(),
	}
}

// DataLoss returns the partitions marked DataLost of table tenant/table, or
// of every table when both are empty, in tenant, table and index order.
func (s *State) DataLoss(tenant, table string) []*api.LostPartition {
	var out []*api.LostPartition
	for _, t := range s.TablesOf(tenant) {
		if table != "" && t.Name != table {
			continue
		}
		for _, p := range t.Partitions {
			if d := p.DataLost; d != nil {
				out = append(out, &api.LostPartition{
					Tenant: t.Tenant, Table: t.Name, Index: p.Index, PartitionId: p.ID,
					ServerId: d.ServerID, LostUnixMs: d.UnixMs, Epoch: d.Epoch,
				})
			}
		}
	}
	return out
}

package api

import (
	"errors"
	"fmt"
	"slices"
)

// ErrMapGap means a map watch delta does not apply to the map the watcher
// holds (it starts at another version, or patches a table or partition
// the watcher does not hold): the watcher asks for a full map.
var ErrMapGap = errors.New("api: map delta does not apply to the map held")

// PatchMap returns held with a patch of WatchPartitionMapResponse.patches
// applied: the patch's table, version, bulk and coprocessors, and its
// partitions in place of held's at their indexes. held is not modified;
// the result shares the unpatched partitions with it. It fails with
// ErrMapGap when held is not the patched table (another id) or has not a
// partition of the same id at a patched index.
func PatchMap(held, patch *PartitionMap) (*PartitionMap, error) {
	if held == nil || held.GetTable().GetId() != patch.GetTable().GetId() {
		return nil, fmt.Errorf("%w: patch of table %s/%s id %d, held id %d", ErrMapGap,
			patch.GetTable().GetTenant(), patch.GetTable().GetName(), patch.GetTable().GetId(), held.GetTable().GetId())
	}
	m := &PartitionMap{Table: patch.GetTable(), Version: patch.GetVersion(), Bulk: patch.GetBulk(),
		Coprocessors: patch.GetCoprocessors(), Partitions: slices.Clone(held.GetPartitions())}
	for _, p := range patch.GetPartitions() {
		i := int(p.GetIndex())
		if i >= len(m.Partitions) || m.Partitions[i].GetId() != p.GetId() {
			return nil, fmt.Errorf("%w: patch of partition %d at index %d of table %s/%s, not held there", ErrMapGap,
				p.GetId(), i, patch.GetTable().GetTenant(), patch.GetTable().GetName())
		}
		m.Partitions[i] = p
	}
	return m, nil
}

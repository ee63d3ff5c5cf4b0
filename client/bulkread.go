package client

import (
	"maps"
	"slices"
	"strconv"

	"github.com/tabuladb/tabula/api"
)

// Bulk reads go to the copies serving the version they read. Outside a
// rollout every copy serves the table's current version; during one, a
// row of copies at a time switches to the new version, so a
// partition's copies serve one of two versions, and a request that must
// see one version (a batch, a scan) picks the version first and then a
// copy serving it in each partition.

// bulkCopyFor picks the copy of bulk partition p a read of version goes
// to (0: any copy serving some version): of the copies serving it and not
// tried yet, the less busy of two at random. When all were tried it
// starts over, unless giveUp and another version is served: then it
// returns nil (a batch or scan that picked the version picks another); nil
// too when no copy serves it.
func (c *Client) bulkCopyFor(p *api.Partition, version uint64, tried map[string]bool, giveUp bool) *api.Replica {
	var serving, untried []*api.Replica
	other := false // a copy serves another version
	for _, r := range p.GetReplicas() {
		if s := r.GetBulkServes(); s != 0 && s != version && r.GetAddr() != "" {
			other = true
		}
		if r.GetAddr() == "" || r.GetBulkServes() == 0 || version != 0 && r.GetBulkServes() != version {
			continue
		}
		serving = append(serving, r)
	}
	if len(serving) == 0 && version != 0 {
		// No copy serves it, but a copy holding it (a delta's base
		// loaded under the delta a copy serves) answers a read of it.
		for _, r := range p.GetReplicas() {
			if r.GetAddr() != "" && r.GetBulkServes() != 0 && slices.Contains(r.GetBulkHolds(), version) {
				serving = append(serving, r)
			}
		}
	}
	for _, r := range serving {
		if !tried[r.GetAddr()] {
			untried = append(untried, r)
		}
	}
	if len(untried) == 0 && giveUp && other && len(serving) > 0 {
		return nil
	}
	if len(untried) == 0 {
		clear(tried)
		untried = serving
	}
	switch len(untried) {
	case 0:
		return nil
	case 1:
		return untried[0]
	}
	// The power of two choices: a slow or loaded copy gets fewer of this
	// client's reads, and the load still spreads.
	i := c.jitter.intN(len(untried))
	j := (i + 1 + c.jitter.intN(len(untried)-1)) % len(untried)
	if c.inflight(untried[j].GetAddr()) < c.inflight(untried[i].GetAddr()) {
		i = j
	}
	return untried[i]
}

// bulkNotServed is the error of a read of version (0: any) of partition p
// that no copy serves by the map: VERSION_GONE, which makes a batch or a
// scan start over on a version the next map serves.
func bulkNotServed(p *api.Partition, version uint64) error {
	if version == 0 {
		return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "no_serving_copy", "no copy of partition %d serves a version yet (loading)", p.GetId())
	}
	return api.Status(&api.ErrorDetail{Code: api.ErrorCode_ERROR_CODE_VERSION_GONE, Reason: "version_not_served"},
		"no copy of partition "+strconv.FormatUint(p.GetId(), 10)+" serves version "+strconv.FormatUint(version, 10)+" (a retained version serves again once rolled out: tabula bulk rollback)")
}

// chooseBulkVersion picks the version a multi-partition read of bulk map m
// reads: among the versions every partition has a copy serving, one at
// random in proportion to the copies serving it (so a rollout's rows share
// the reads as they share the copies); the table's current one when none
// qualifies. Versions in avoid (an earlier attempt found no copy of one
// answering) are taken only when nothing else qualifies.
func (c *Client) chooseBulkVersion(m *api.PartitionMap, avoid map[uint64]bool) uint64 {
	parts := m.GetPartitions()
	counts := map[uint64]int{}
	for _, r := range parts[0:min(1, len(parts))] {
		for _, x := range r.GetReplicas() {
			if v := x.GetBulkServes(); v != 0 {
				counts[v] = 0
			}
		}
	}
	for v := range counts {
		n := 0
		for _, p := range parts {
			k := 0
			for _, x := range p.GetReplicas() {
				if x.GetBulkServes() == v && x.GetAddr() != "" {
					k++
				}
			}
			if k == 0 {
				n = 0
				break
			}
			n += k
		}
		counts[v] = n
	}
	if len(avoid) > 0 {
		others := 0
		for v, n := range counts {
			if !avoid[v] {
				others += n
			}
		}
		if others > 0 {
			for v := range avoid {
				delete(counts, v)
			}
		}
	}
	total := 0
	for _, n := range counts {
		total += n
	}
	if total == 0 {
		return m.GetBulk().GetCurrent()
	}
	pick := c.jitter.intN(total)
	// In version order, so a seeded client picks the same.
	var best uint64
	for _, v := range slices.Sorted(maps.Keys(counts)) {
		if pick < counts[v] {
			return v
		}
		pick -= counts[v]
		best = v
	}
	return best
}

// holderOf is the copy of p whose map entry holds version (bulk_holds),
// preferring one that does not serve it yet (the copy loading it); nil if
// none does.
func holderOf(p *api.Partition, version uint64) *api.Replica {
	var out *api.Replica
	for _, r := range p.GetReplicas() {
		for _, v := range r.GetBulkHolds() {
			if v == version && r.GetAddr() != "" && (out == nil || out.GetBulkServes() == version) {
				out = r
			}
		}
	}
	return out
}

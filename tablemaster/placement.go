package tablemaster

import (
	"cmp"
	"slices"
)

// Candidate is a server as placement sees it: a row of the state snapshot
// that Place is a pure function of.
type Candidate struct {
	ID string
	// FaultDomain groups servers that fail together (a rack, a zone). Empty
	// means a domain of the server's own.
	FaultDomain string
	// Replicas is how many replicas (of any table) the server holds now.
	Replicas int
	// Available: alive and not draining. Only available servers get new replicas.
	Available bool
}

// domain is the fault domain placement uses for c.
func (c Candidate) domain() string {
	if c.FaultDomain == "" {
		return "\x00server:" + c.ID // cannot collide with a named domain
	}
	return c.FaultDomain
}

// Place picks up to n servers for new replicas of one partition whose
// replicas are on hosts now. It never picks an unavailable server, a host, or
// two servers of one fault domain (hosts' domains count as taken), and it
// spreads load: fewest replicas first, ties broken by server id, so the
// result is a pure function of its arguments. It returns fewer than n ids
// when fewer servers qualify; the caller leaves the partition
// under-replicated until more arrive. Place does not modify cands.
//
// Candidates for placing many partitions in a row should have their Replicas
// counts raised after each call (see State.fill), so the spread stays even:
// 12 partitions on 3 servers land 4 on each.
func Place(cands []Candidate, hosts []string, n int) []string {
	if n <= 0 {
		return nil
	}
	takenDomain := make(map[string]bool, len(hosts)+n)
	isHost := make(map[string]bool, len(hosts))
	for _, h := range hosts {
		isHost[h] = true
		takenDomain[Candidate{ID: h}.domain()] = true // a host missing from cands is its own domain
	}
	for _, c := range cands {
		if isHost[c.ID] {
			takenDomain[c.domain()] = true
		}
	}
	order := make([]Candidate, 0, len(cands))
	for _, c := range cands {
		if c.Available && !isHost[c.ID] && !takenDomain[c.domain()] {
			order = append(order, c)
		}
	}
	slices.SortFunc(order, func(a, b Candidate) int {
		if c := cmp.Compare(a.Replicas, b.Replicas); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	var picks []string
	for _, c := range order {
		if len(picks) == n {
			break
		}
		if takenDomain[c.domain()] {
			continue
		}
		takenDomain[c.domain()] = true
		picks = append(picks, c.ID)
	}
	return picks
}

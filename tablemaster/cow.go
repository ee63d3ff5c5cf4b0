package tablemaster

import (
	"slices"
)

// Copy-on-write. A command is applied to the successor of the published
// State (State.successor): a shallow copy that shares every table, server,
// tenant and the stream manager with it. A command copies only what it
// modifies, each domain on its own: the map of tables (pointers) when it
// adds, drops or replaces a table, then each table it changes (its
// partitions, ~100); the servers' map and each server it changes; the
// stream manager only when it changes streams or nodes. A published State
// is never modified again, so the copies it shares stay valid for it.
//
// A State with no cow (one being replayed, or a Clone) is owned whole by
// its user and is modified in place.

// cow records what a State under construction owns already.
type cow struct {
	tenants, tables, servers, streams bool // the map (manager) is its own
	requests                          bool // the requests' map is its own
	ownTables                         map[*Table]bool
	ownServers                        map[*Server]bool
}

// successor returns a copy of s that shares everything with it and copies
// on write (see above). Apply commands to it, then seal it.
func (s *State) successor() *State {
	c := *s
	c.cow = &cow{ownTables: map[*Table]bool{}, ownServers: map[*Server]bool{}}
	c.primaries = nil
	return &c
}

// seal ends the copy-on-write of a successor: it may be published.
func (s *State) seal() { s.cow = nil }

// tenantsW returns the tenants' map for writing.
func (s *State) tenantsW() map[string]*Tenant {
	if s.cow != nil && !s.cow.tenants {
		s.Tenants = cloneMap(s.Tenants)
		s.cow.tenants = true
	}
	return s.Tenants
}

// tablesW returns the tables' map for writing.
func (s *State) tablesW() map[string]*Table {
	if s.cow != nil && !s.cow.tables {
		s.Tables = cloneMap(s.Tables)
		s.cow.tables = true
	}
	return s.Tables
}

// serversW returns the servers' map for writing.
func (s *State) serversW() map[string]*Server {
	if s.cow != nil && !s.cow.servers {
		s.Servers = cloneMap(s.Servers)
		s.cow.servers = true
	}
	return s.Servers
}

func cloneMap[V any](m map[string]V) map[string]V {
	c := make(map[string]V, len(m)+1)
	for k, v := range m {
		c[k] = v
	}
	return c
}

// mutTable returns t (a table of s, or the original of one) for writing:
// s's own copy if it has one, else a deep copy that replaces it in
// s.Tables. Use the returned table
// (and pointers into it) from then on.
func (s *State) mutTable(t *Table) *Table {
	s.notePrimaries(t) // before any change: handoff.go compares after it
	if s.cow == nil || s.cow.ownTables[t] {
		return t
	}
	key := tableKey(t.Tenant, t.Name)
	if cur := s.Tables[key]; s.cow.ownTables[cur] {
		return cur // copied already, from another pointer to the original
	}
	c := cloneTable(t)
	s.tablesW()[key] = c
	s.cow.ownTables[c] = true
	return c
}

// ownNewTable records that t, made by this command, is s's own.
func (s *State) ownNewTable(t *Table) {
	if s.cow != nil {
		s.cow.ownTables[t] = true
	}
}

// mutServer returns server id of s for writing (nil if there is none).
func (s *State) mutServer(id string) *Server {
	srv := s.Servers[id]
	if srv == nil || s.cow == nil || s.cow.ownServers[srv] {
		return srv
	}
	c := *srv
	s.serversW()[id] = &c
	s.cow.ownServers[&c] = true
	return &c
}

// ownNewServer records that srv, made by this command, is s's own.
func (s *State) ownNewServer(srv *Server) {
	if s.cow != nil {
		s.cow.ownServers[srv] = true
	}
}

// cloneTable returns a deep copy of t.
func cloneTable(v *Table) *Table {
	t := *v
	t.Partitions = slices.Clone(v.Partitions)
	t.Bulk = v.Bulk.clone()
	t.Coprocs = cloneCoprocs(v.Coprocs)
	for i := range t.Partitions {
		t.Partitions[i].Replicas = slices.Clone(t.Partitions[i].Replicas)
		if l := t.Partitions[i].Log; l != nil {
			c := *l
			t.Partitions[i].Log = &c
		}
	}
	return &t
}

// mutPartition finds partition id and returns it and its table for
// writing (nil, nil if there is none).
func (s *State) mutPartition(id uint64) (*Table, *Partition) {
	t, p := s.partition(id)
	if t == nil {
		return nil, nil
	}
	k := p.Index
	t = s.mutTable(t)
	return t, &t.Partitions[k]
}

// staleAddr reports whether a replica of t on server id has an address or
// fault domain other than addr and fd.
func (t *Table) staleAddr(id, addr, fd string) bool {
	for _, p := range t.Partitions {
		for _, r := range p.Replicas {
			if r.ServerID == id && (r.Addr != addr || r.FaultDomain != fd) {
				return true
			}
		}
	}
	return false
}

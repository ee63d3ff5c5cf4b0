package stream

import (
	"maps"
	"slices"
)

// Clone returns a deep copy of m: what Snapshot and LoadSnapshot give,
// without encoding. The master clones its whole state for every command
// it applies; through JSON that cost 1.7 ms with 300 extents, and a
// failover applies dozens of commands in a row.
func (m *Manager) Clone() *Manager {
	c := *m
	c.nodes = make(map[string]*NodeMeta, len(m.nodes))
	for k, v := range m.nodes {
		n := *v
		c.nodes[k] = &n
	}
	c.streams = make(map[string]*StreamMeta, len(m.streams))
	for k, v := range m.streams {
		s := *v
		s.Extents = slices.Clone(v.Extents)
		s.Restarts = slices.Clone(v.Restarts)
		c.streams[k] = &s
	}
	c.extents = make(map[uint64]*ExtentMeta, len(m.extents))
	for k, v := range m.extents {
		e := v.clone()
		c.extents[k] = &e
	}
	c.deletes = maps.Clone(m.deletes)
	c.fragDels = maps.Clone(m.fragDels)
	c.refs = maps.Clone(m.refs)
	c.hosted = maps.Clone(m.hosted)
	return &c
}

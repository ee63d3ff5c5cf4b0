package tablemaster

import (
	"slices"

	"github.com/tabuladb/tabula/api"
)

// Coprocessors. A deploy stores the module under its SHA-256 in
// the master's data directory (coprocstore.go) and records it as the next
// version of the table's coprocessor (OpCoprocDeploy). Servers hosting the
// table fetch and compile it in the background and report it in
// heartbeats (OpCoprocReady); once every hosting server has, the alias
// "live" moves to it if it is newer than every version live before
// (Coproc.MaxLive: a version rolled back from stays rolled back). A report
// the state records already is proposed again when it would now promote
// (the last host without it left the table). Rollback points live at
// another version compiled everywhere.

// Ops of coprocessors.
const (
	// OpCoprocDeploy registers Coproc (SHA-256, size, methods) as a new
	// version of coprocessor Name of Tenant/Table (the same bytes again:
	// no change).
	OpCoprocDeploy Op = "coproc_deploy"
	// OpCoprocReady records that ServerID compiled Name's Version.
	OpCoprocReady Op = "coproc_ready"
	// OpCoprocRollback points Name's live alias at Version.
	OpCoprocRollback Op = "coproc_rollback"
)

// Limits of coprocessors.
const (
	// MaxCoprocVersions is how many versions of one coprocessor are kept;
	// a deploy beyond it drops the oldest version that is not live.
	MaxCoprocVersions = 16
	// MaxCoprocsPerTable bounds the coprocessors of a table.
	MaxCoprocsPerTable = 64
)

// Coproc is one named coprocessor of a table.
type Coproc struct {
	Live uint64 `json:"live,omitempty"`
	// MaxLive is the newest version that has been live: a version at or
	// below it is promoted only by a rollback, never again by a ready
	// report (a rolled-back version stays rolled back when a server
	// reports it, or a new host compiles it).
	MaxLive  uint64          `json:"max_live,omitempty"`
	Next     uint64          `json:"next"`
	Versions []CoprocVersion `json:"versions"`
}

// CoprocVersion is one deployed module.
type CoprocVersion struct {
	Version       uint64   `json:"version"`
	SHA256        string   `json:"sha256"`
	Size          uint64   `json:"size"`
	CreatedUnixMs int64    `json:"created_unix_ms,omitempty"`
	Methods       []string `json:"methods,omitempty"`
	Writes        bool     `json:"writes,omitempty"`
	// ReadyOn lists the servers that compiled it, sorted.
	ReadyOn []string `json:"ready_on,omitempty"`
}

func cloneCoprocs(m map[string]*Coproc) map[string]*Coproc {
	if m == nil {
		return nil
	}
	out := make(map[string]*Coproc, len(m))
	for k, c := range m {
		cc := *c
		cc.Versions = slices.Clone(c.Versions)
		for i := range cc.Versions {
			cc.Versions[i].ReadyOn = slices.Clone(cc.Versions[i].ReadyOn)
			cc.Versions[i].Methods = slices.Clone(cc.Versions[i].Methods)
		}
		out[k] = &cc
	}
	return out
}

// hosts lists the servers hosting t's partitions, sorted.
func (t *Table) hosts() []string {
	var out []string
	for _, p := range t.Partitions {
		for _, r := range p.Replicas {
			if !slices.Contains(out, r.ServerID) {
				out = append(out, r.ServerID)
			}
		}
	}
	slices.Sort(out)
	return out
}

// readyEverywhere reports whether every server hosting t has compiled v.
func (t *Table) readyEverywhere(v *CoprocVersion) bool {
	hosts := t.hosts()
	if len(hosts) == 0 {
		return false
	}
	for _, h := range hosts {
		if !slices.Contains(v.ReadyOn, h) {
			return false
		}
	}
	return true
}

// promotable reports whether ready reports may make v live: it is newer
// than the live version and than every version live before.
func (c *Coproc) promotable(v uint64) bool { return v > c.Live && v > c.MaxLive }

func (c *Coproc) version(v uint64) int {
	return slices.IndexFunc(c.Versions, func(x CoprocVersion) bool { return x.Version == v })
}

// CoprocsProto returns t's coprocessors as wire messages, by name.
func (t *Table) CoprocsProto() []*api.Coprocessor {
	if len(t.Coprocs) == 0 {
		return nil
	}
	hosts := t.hosts()
	names := make([]string, 0, len(t.Coprocs))
	for n := range t.Coprocs {
		names = append(names, n)
	}
	slices.Sort(names)
	out := make([]*api.Coprocessor, 0, len(names))
	for _, n := range names {
		c := t.Coprocs[n]
		pc := &api.Coprocessor{Name: n, Live: c.Live, Servers: uint32(len(hosts))}
		for _, v := range c.Versions {
			ready := 0
			for _, h := range hosts {
				if slices.Contains(v.ReadyOn, h) {
					ready++
				}
			}
			pc.Versions = append(pc.Versions, &api.CoprocVersion{Version: v.Version, Sha256: v.SHA256, Size: v.Size,
				CreatedUnixMs: v.CreatedUnixMs, ReadyServers: uint32(ready), Methods: v.Methods, Writes: v.Writes})
		}
		out = append(out, pc)
	}
	return out
}

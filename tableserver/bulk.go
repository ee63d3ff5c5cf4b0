package tableserver

import (
	"cmp"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/engines"
	"github.com/tabuladb/tabula/engines/bulk"
)

// bulkPart is a bulk partition hosted here: its serving engine
// (engines/bulk: loaded versions, versioned reads, staging files) and what
// the server tracks to fetch missing versions from their streams
// (bulkfetch.go). Safe for concurrent use.
type bulkPart struct {
	*bulk.Engine
	id  uint64
	log *slog.Logger

	// storeMu serializes storing uploaded files into streams (bulkstore.go).
	storeMu sync.Mutex

	// mu guards the fields below.
	mu sync.Mutex
	// fetching: a fetch of missing versions from streams is running.
	fetching bool
	// rejected are the retained versions whose file, fetched from its
	// stream, is bad: not fetched again, reported in heartbeats.
	rejected map[uint64]*api.BulkLoaded
}

// openBulkPart opens partition p of bulk table t over dir through the
// engine registry.
func (s *Server) openBulkPart(t *api.Table, p *api.Partition, dir string) (*bulkPart, error) {
	log := s.log.With("partition", p.GetId())
	e, err := engines.Open(engines.KindBulk, engines.Options{
		Dir:        dir,
		Logger:     log,
		Partition:  int(p.GetIndex()),
		Partitions: int(t.GetOptions().GetPartitions()),
	})
	if err != nil {
		return nil, fmt.Errorf("open bulk engine for partition %d: %w", p.GetId(), err)
	}
	be, ok := e.(*bulk.Engine)
	if !ok {
		return nil, fmt.Errorf("open bulk engine for partition %d: the registry gave a %T", p.GetId(), e)
	}
	return &bulkPart{Engine: be, id: p.GetId(), log: log, rejected: map[uint64]*api.BulkLoaded{}}, nil
}

// sync makes the engine hold the versions the map retains and serve its
// current one, and forgets rejections of versions no longer retained.
// Only the watch goroutine calls it.
func (b *bulkPart) sync(retained []uint64, current uint64) {
	b.mu.Lock()
	for v := range b.rejected {
		if !slices.Contains(retained, v) {
			delete(b.rejected, v)
		}
	}
	b.mu.Unlock()
	b.Retain(retained, current)
}

// loaded lists the loaded versions for a heartbeat, and the rejected
// ones with their error.
func (b *bulkPart) loaded() []*api.BulkLoaded {
	var out []*api.BulkLoaded
	for _, l := range b.Loaded() {
		out = append(out, &api.BulkLoaded{Version: l.Version, Size: l.Size, Crc32C: l.CRC})
	}
	b.mu.Lock()
	for _, r := range b.rejected {
		out = append(out, r)
	}
	b.mu.Unlock()
	slices.SortFunc(out, func(a, c *api.BulkLoaded) int { return cmp.Compare(a.GetVersion(), c.GetVersion()) })
	return out
}

// bulkCapacity is the bulk capacity the server registers (Options.
// BulkCapacity): 0 for not limited.
func (s *Server) bulkCapacity() uint64 {
	switch c := s.opts.BulkCapacity; {
	case c < 0:
		return 0
	case c > 0:
		return uint64(c)
	}
	return memTotal() / 2
}

// memTotal is the machine's memory by /proc/meminfo (0 where it cannot be
// read).
func memTotal() uint64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "MemTotal:" {
			kb, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

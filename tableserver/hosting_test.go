package tableserver

import (
	"errors"
	"testing"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/engines"
	_ "github.com/tabuladb/tabula/engines/point"
)

// mapAt is a one-table, one-partition map with the partition's primary on
// server and the given epoch.
func mapAt(version, epoch uint64, server string) *api.WatchPartitionMapResponse {
	t := &api.Table{Tenant: "default", Name: "t", Id: 1, Kind: api.TableKind_TABLE_KIND_POINT,
		Options: &api.TableOptions{Partitions: 1, Replication: 1, Storage: "ssd", Durability: "sync"}}
	p := &api.Partition{Id: 7, Start: 0, End: ^uint64(0), Epoch: epoch,
		Replicas: []*api.Replica{{ServerId: server, Role: api.ReplicaRole_REPLICA_ROLE_PRIMARY}}}
	return &api.WatchPartitionMapResponse{Version: version, Maps: []*api.PartitionMap{{Table: t, Version: version, Partitions: []*api.Partition{p}}}}
}

// A partition that stays on its server while its epoch grows keeps its
// data: recording the new epoch must not move the open directory aside
// (it did, and a restart then served the partition empty).
func TestNewEpochKeepsData(t *testing.T) {
	s := newDirServer(t)
	id := "srv-1"
	s.serverID.Store(&id)
	h, _, _ := s.reconcile(s.hosting.Load(), mapAt(1, 1, id))
	r := h.replicas[7]
	if r == nil {
		t.Fatalf("partition not opened: %v", h.failed[7])
	}
	if err := r.writer.Apply([]engines.Mutation{{Key: []byte("k"), Value: []byte("v")}}); err != nil {
		t.Fatal(err)
	}
	h2, gone, _ := s.reconcile(h, mapAt(2, 2, id))
	if len(gone) != 0 || h2.replicas[7] == nil {
		t.Fatalf("partition left the hosting at a new epoch")
	}
	if err := r.engine.Close(); err != nil {
		t.Fatal(err)
	}
	// A restart: the partition reopens at epoch 2 from its directory.
	h3, _, _ := s.reconcile(&hosting{replicas: map[uint64]*replica{}}, mapAt(3, 2, id))
	r3 := h3.replicas[7]
	if r3 == nil {
		t.Fatalf("partition not reopened: %v", h3.failed[7])
	}
	defer r3.engine.Close()
	v, _, err := r3.engine.Get([]byte("k"))
	if errors.Is(err, engines.ErrNotFound) || string(v) != "v" {
		t.Fatalf("acknowledged write lost after a new epoch and a restart: %q, %v", v, err)
	}
}

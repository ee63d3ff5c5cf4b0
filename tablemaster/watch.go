package tablemaster

import (
	"fmt"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tabuladb/tabula/api"
)

// Map watches. Every table server watches the whole cluster map, so one map
// change is sent to every server: the response of a version is built and
// marshalled once (mapVersion) and its bytes are sent as they are to every
// watcher (watchCodec). Marshalling per watcher cost the master a core at
// 200 servers x 100 partitions (see RATIONALE.md, "map watches").

// encodedMsg is a message marshalled once, sent as is by watchCodec to
// every stream that sends it. Its bytes are never modified.
type encodedMsg struct{ b []byte }

func encode(m proto.Message) (*encodedMsg, error) {
	b, err := proto.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("tablemaster: encode watch response: %w", err)
	}
	return &encodedMsg{b: b}, nil
}

// watchCodec is gRPC's proto codec that sends an *encodedMsg's bytes
// unchanged. Master.Serve installs it: the map watch sends *encodedMsg.
type watchCodec struct{ proto encoding.CodecV2 }

func newWatchCodec() watchCodec { return watchCodec{proto: encoding.GetCodecV2("proto")} }

func (watchCodec) Name() string { return "proto" }

func (c watchCodec) Marshal(v any) (mem.BufferSlice, error) {
	if e, ok := v.(*encodedMsg); ok {
		// A SliceBuffer's Free does nothing: the shared bytes stay intact
		// for the other streams.
		return mem.BufferSlice{mem.SliceBuffer(e.b)}, nil
	}
	return c.proto.Marshal(v)
}

func (c watchCodec) Unmarshal(data mem.BufferSlice, v any) error { return c.proto.Unmarshal(data, v) }

// serverCodec is the gRPC option that installs watchCodec.
func serverCodec() grpc.ServerOption { return grpc.ForceServerCodecV2(newWatchCodec()) }

// mapVersion is one published map version as watchers see it: the tables
// of the first State published at it (later States at the same version
// change only the stream manager, never a table) and its whole-cluster
// full response, built on first need. Safe for concurrent use.
type mapVersion struct {
	version uint64
	tables  *State // read only its Tables

	mu   sync.Mutex // guards full
	full *encodedMsg
}

func newMapVersion(s *State) *mapVersion { return &mapVersion{version: s.Version, tables: s} }

// fullMsg returns the full response of every table at this version.
func (mv *mapVersion) fullMsg() (*encodedMsg, error) {
	mv.mu.Lock()
	defer mv.mu.Unlock()
	if mv.full != nil {
		return mv.full, nil
	}
	resp := &api.WatchPartitionMapResponse{Version: mv.version}
	for _, t := range mv.tables.TablesOf("") {
		resp.Maps = append(resp.Maps, t.MapProto(mv.version))
	}
	e, err := encode(resp)
	if err != nil {
		return nil, err
	}
	mv.full = e
	return e, nil
}

// WatchPartitionMap sends the maps in scope (one table, or every table when
// tenant and table are empty) when the cluster version exceeds
// after_version, then again after every change, until the client goes away
// or the master closes. A slow watcher skips to the latest version.
func (m *Master) WatchPartitionMap(req *api.WatchPartitionMapRequest, stream grpc.ServerStreamingServer[api.WatchPartitionMapResponse]) error {
	if req == nil {
		return errNilRequest()
	}
	whole := req.Tenant == "" && req.Table == ""
	if !whole {
		if _, err := lookup(m.State(), "tenant", req.Tenant, "table", req.Table); err != nil {
			return err
		}
	}
	ctx := stream.Context()
	after := req.AfterVersion
	for {
		v := m.view.Load()
		if v.state.Version > after {
			var msg any
			if whole {
				e, err := v.mv.fullMsg()
				if err != nil {
					return rpcError("watch partition map", err)
				}
				msg = e
			} else {
				resp := &api.WatchPartitionMapResponse{Version: v.state.Version}
				if t, ok := v.state.Tables[tableKey(req.Tenant, req.Table)]; ok {
					resp.Maps = append(resp.Maps, t.MapProto(v.state.Version))
				}
				msg = resp
			}
			if err := stream.SendMsg(msg); err != nil {
				return err
			}
			after = v.state.Version
		}
		select {
		case <-v.changed:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-m.closing:
			return api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "master_closed", "master is shutting down")
		}
	}
}

package client

import (
	"context"
	"encoding/json"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/internal/streamerr"
	"github.com/tabuladb/tabula/replication/stream"
)

// Streams is the stream manager of the cluster, reached through the
// masters: the control plane of the stream layer (replicated append-only
// extents). It implements stream.ManagerClient, so a stream.Client can
// append to and read streams through it. Safe for concurrent use.
type Streams struct{ c *Client }

var (
	_ stream.ManagerClient    = Streams{}
	_ stream.FragmentReporter = Streams{}
)

// Streams returns the cluster's stream manager.
func (c *Client) Streams() Streams { return Streams{c} }

// StreamConns returns connections to extent nodes that sign with the
// client's credential (for a stream.Client); the caller closes them.
func (c *Client) StreamConns() *stream.Conns {
	opts := c.opts.Credential.auth().DialOptions()
	if c.opts.TLS != nil {
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(c.opts.TLS)))
	}
	return stream.NewConns(opts...)
}

func (s Streams) call(ctx context.Context, req *api.StreamRequest, out any) error {
	what := fmt.Sprintf("client: stream %s", req.Op)
	var resp *api.StreamResponse
	err := s.c.masterCall(ctx, what, func(ctx context.Context, mc api.MasterClient) error {
		var err error
		resp, err = mc.Stream(ctx, req)
		return err
	})
	if err != nil {
		return streamerr.FromStatus(err)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(resp.GetJson(), out); err != nil {
		return fmt.Errorf("%s: decode the answer: %w", what, err)
	}
	return nil
}

// Create makes the empty stream name; code, when not empty, is its coding
// policy (stream.CodeLRC12: sealed extents are erasure coded).
func (s Streams) Create(ctx context.Context, name, code string) (stream.StreamInfo, error) {
	var info stream.StreamInfo
	err := s.call(ctx, &api.StreamRequest{Op: api.StreamOp_STREAM_OP_CREATE, Stream: name, Code: code}, &info)
	return info, err
}

// SetCode sets the stream's coding policy ("" for none).
func (s Streams) SetCode(ctx context.Context, name, code string) error {
	return s.call(ctx, &api.StreamRequest{Op: api.StreamOp_STREAM_OP_SET_CODE, Stream: name, Code: code}, nil)
}

// ReportCorruptFragment implements stream.FragmentReporter.
func (s Streams) ReportCorruptFragment(ctx context.Context, extent uint64, index int, node string) error {
	return s.call(ctx, &api.StreamRequest{Op: api.StreamOp_STREAM_OP_REPORT_CORRUPT_FRAGMENT, Extent: extent, Index: int32(index), Node: node}, nil)
}

// Delete removes the stream name; extents no stream references are
// garbage-collected.
func (s Streams) Delete(ctx context.Context, name string) error {
	return s.call(ctx, &api.StreamRequest{Op: api.StreamOp_STREAM_OP_DELETE, Stream: name}, nil)
}

// StreamSummary is one stream in List.
type StreamSummary struct {
	Name        string `json:"name"`
	Extents     int    `json:"extents"`
	Sealed      int    `json:"sealed"`
	SealedBytes int64  `json:"sealed_bytes"`
}

// List lists the streams by name.
func (s Streams) List(ctx context.Context) ([]StreamSummary, error) {
	var out []StreamSummary
	err := s.call(ctx, &api.StreamRequest{Op: api.StreamOp_STREAM_OP_LIST}, &out)
	return out, err
}

// ExtentStat is an extent's placement and the stream manager's record of it.
type ExtentStat struct {
	Placement stream.ExtentPlacement `json:"placement"`
	Meta      stream.ExtentMeta      `json:"meta"`
}

// ExtentStat describes extent id.
func (s Streams) ExtentStat(ctx context.Context, id uint64) (ExtentStat, error) {
	var out ExtentStat
	err := s.call(ctx, &api.StreamRequest{Op: api.StreamOp_STREAM_OP_EXTENT, Extent: id}, &out)
	return out, err
}

// Nodes lists the extent nodes (every table server is one).
func (s Streams) Nodes(ctx context.Context) ([]stream.NodeMeta, error) {
	var out []stream.NodeMeta
	err := s.call(ctx, &api.StreamRequest{Op: api.StreamOp_STREAM_OP_NODES}, &out)
	return out, err
}

// Stream implements stream.ManagerClient.
func (s Streams) Stream(ctx context.Context, name string) (stream.StreamInfo, error) {
	var info stream.StreamInfo
	err := s.call(ctx, &api.StreamRequest{Op: api.StreamOp_STREAM_OP_GET, Stream: name}, &info)
	return info, err
}

// Extent implements stream.ManagerClient.
func (s Streams) Extent(ctx context.Context, id uint64) (stream.ExtentPlacement, error) {
	st, err := s.ExtentStat(ctx, id)
	return st.Placement, err
}

// OpenWriter implements stream.ManagerClient.
func (s Streams) OpenWriter(ctx context.Context, name string) (stream.StreamInfo, error) {
	var info stream.StreamInfo
	err := s.call(ctx, &api.StreamRequest{Op: api.StreamOp_STREAM_OP_OPEN_WRITER, Stream: name}, &info)
	return info, err
}

// SealAndAllocate implements stream.ManagerClient.
func (s Streams) SealAndAllocate(ctx context.Context, name string, epoch, extent uint64) (stream.StreamInfo, error) {
	var info stream.StreamInfo
	err := s.call(ctx, &api.StreamRequest{Op: api.StreamOp_STREAM_OP_SEAL_AND_ALLOCATE, Stream: name, Epoch: epoch, Extent: extent}, &info)
	return info, err
}

// ReportCorrupt implements stream.ManagerClient.
func (s Streams) ReportCorrupt(ctx context.Context, extent uint64, node string) error {
	return s.call(ctx, &api.StreamRequest{Op: api.StreamOp_STREAM_OP_REPORT_CORRUPT, Extent: extent, Node: node}, nil)
}

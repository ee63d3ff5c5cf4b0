package tablemaster

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/internal/streamerr"
	"github.com/tabuladb/tabula/replication/stream"
)

// The master is the stream manager: the stream layer's state
// machine (replication/stream.Manager) is part of State, its commands go
// through the same command log (OpStream), every table server is an extent
// node (added when it registers, marked down when it is declared dead), and
// a stream.Driver in the master runs the seal protocol and the manager's
// tasks (re-replication, repair, garbage collection) against the nodes.

// OpStream applies Command.StreamCmd to the stream manager.
const OpStream Op = "stream"

// StreamState is the stream manager inside State. It encodes as the
// manager's own snapshot.
type StreamState struct {
	M *stream.Manager
}

func newStreamState() *StreamState {
	return &StreamState{M: stream.NewManager(stream.ManagerOptions{})}
}

// MarshalJSON implements json.Marshaler.
func (s *StreamState) MarshalJSON() ([]byte, error) { return s.M.Snapshot(), nil }

// UnmarshalJSON implements json.Unmarshaler.
func (s *StreamState) UnmarshalJSON(b []byte) error {
	m, err := stream.LoadSnapshot(b)
	if err != nil {
		return err
	}
	s.M = m
	return nil
}

func (s *StreamState) clone() *StreamState {
	if s == nil {
		return nil
	}
	return &StreamState{M: s.M.Clone()}
}

// streams returns the stream manager for writing: its own copy in a
// successor State (cow.go), created for a state from before it existed.
// Readers use StreamManager.
func (s *State) streams() *stream.Manager {
	if s.Streams == nil {
		s.Streams = newStreamState()
	} else if s.cow != nil && !s.cow.streams {
		s.Streams = s.Streams.clone()
	}
	if s.cow != nil {
		s.cow.streams = true
	}
	return s.Streams.M
}

// StreamManager returns the stream manager, read only: callers must not
// modify it (the Master publishes immutable states).
func (s *State) StreamManager() *stream.Manager {
	if s.Streams == nil {
		return stream.NewManager(stream.ManagerOptions{})
	}
	return s.Streams.M
}

// streamNodeEvent keeps the extent nodes in step with the table servers:
// every server is an extent node. The manager refuses nothing valid here;
// its error would only mean a broken invariant, and Apply must not fail a
// server registration for it, so it is dropped.
func (s *State) streamNodeEvent(c stream.Command) {
	_, _ = s.streams().Apply(c)
}

// masterStreamLog is the stream.StateLog of the master: commands go
// through propose (logged, fsynced, published).
type masterStreamLog struct{ m *Master }

func (l masterStreamLog) Apply(_ context.Context, c stream.Command) (stream.Result, error) {
	res, _, err := l.m.propose(Command{UnixMs: l.m.opts.Now().UnixMilli(), Payload: StreamCommand{StreamCmd: &c}}, nil, nil)
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			return stream.Result{}, streamerr.FromStatus(e)
		}
		return stream.Result{}, err
	}
	return res.Stream, nil
}

func (l masterStreamLog) View(fn func(m *stream.Manager)) { fn(l.m.State().StreamManager()) }

// streamLoop runs the stream manager's tasks and refreshes the nodes'
// inventories until Close.
func (m *Master) streamLoop() {
	defer m.wg.Done()
	tasks := time.NewTicker(m.opts.StreamTaskInterval)
	defer tasks.Stop()
	var lastSync time.Time
	for {
		select {
		case <-m.closing:
			return
		case <-tasks.C:
		}
		if !m.leads() {
			continue
		}
		ctx, cancel := context.WithTimeout(m.streamCtx, time.Minute)
		if n, err := m.streamDriver.RunTasks(ctx); err != nil && ctx.Err() == nil {
			m.logger.Warn("tablemaster: stream tasks", "done", n, "err", err)
		} else if n > 0 {
			m.logger.Info("tablemaster: stream tasks done", "tasks", n)
		}
		if time.Since(lastSync) >= m.opts.StreamSyncInterval {
			lastSync = time.Now()
			m.dropStrayBulkStreams(ctx)
			for _, nd := range m.State().StreamManager().Nodes() {
				if nd.Alive {
					if err := m.streamDriver.SyncNode(ctx, nd.ID); err != nil && ctx.Err() == nil {
						m.logger.Debug("tablemaster: stream node sync", "node", nd.ID, "err", err)
					}
				}
			}
		}
		cancel()
	}
}

// Stream serves the stream manager's operations (api.StreamOp).
func (m *Master) Stream(ctx context.Context, req *api.StreamRequest) (*api.StreamResponse, error) {
	if req == nil {
		return nil, errNilRequest()
	}
	what := "stream " + req.Op.String()
	var (
		out any
		err error
	)
	d := m.streamDriver
	switch req.Op {
	case api.StreamOp_STREAM_OP_CREATE:
		_, err = d.Apply(ctx, stream.Command{Op: stream.OpCreateStream, Stream: req.Stream, Code: req.Code})
		if err == nil {
			out, err = d.Stream(ctx, req.Stream)
		}
	case api.StreamOp_STREAM_OP_DELETE:
		_, err = d.Apply(ctx, stream.Command{Op: stream.OpDeleteStream, Stream: req.Stream})
		out = struct{}{}
	case api.StreamOp_STREAM_OP_LIST:
		type summary struct {
			Name    string `json:"name"`
			Extents int    `json:"extents"`
			Sealed  int    `json:"sealed"`
			Bytes   int64  `json:"sealed_bytes"`
		}
		list := []summary{}
		sm := m.State().StreamManager()
		for _, name := range sm.Streams() {
			meta, exts, serr := sm.Stream(name)
			if serr != nil {
				continue
			}
			s := summary{Name: meta.Name, Extents: len(exts)}
			for _, e := range exts {
				if e.Sealed {
					s.Sealed++
					s.Bytes += e.Length
				}
			}
			list = append(list, s)
		}
		out = list
	case api.StreamOp_STREAM_OP_GET:
		out, err = d.Stream(ctx, req.Stream)
	case api.StreamOp_STREAM_OP_EXTENT:
		var p stream.ExtentPlacement
		if p, err = d.Extent(ctx, req.Extent); err == nil {
			meta, _ := m.State().StreamManager().Extent(req.Extent)
			out = struct {
				Placement stream.ExtentPlacement `json:"placement"`
				Meta      stream.ExtentMeta      `json:"meta"`
			}{p, meta}
		}
	case api.StreamOp_STREAM_OP_OPEN_WRITER:
		out, err = d.OpenWriter(ctx, req.Stream)
	case api.StreamOp_STREAM_OP_SEAL_AND_ALLOCATE:
		out, err = d.SealAndAllocate(ctx, req.Stream, req.Epoch, req.Extent)
	case api.StreamOp_STREAM_OP_REPORT_CORRUPT:
		err = d.ReportCorrupt(ctx, req.Extent, req.Node)
		out = struct{}{}
	case api.StreamOp_STREAM_OP_NODES:
		out = m.State().StreamManager().Nodes()
	case api.StreamOp_STREAM_OP_REPORT_CORRUPT_FRAGMENT:
		err = d.ReportCorruptFragment(ctx, req.Extent, int(req.Index), req.Node)
		out = struct{}{}
	case api.StreamOp_STREAM_OP_SET_CODE:
		_, err = d.Apply(ctx, stream.Command{Op: stream.OpSetCode, Stream: req.Stream, Code: req.Code})
		if err == nil {
			out, err = d.Stream(ctx, req.Stream)
		}
	default:
		return nil, errInvalid("op", "stream_op_invalid", 0, "unknown stream op %v", req.Op)
	}
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			return nil, e // a refused command: its status already
		}
		return nil, streamerr.ToStatus(what, err)
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, api.Errorf(api.ErrorCode_ERROR_CODE_UNAVAILABLE, "encode", "%s: %v", what, err)
	}
	return &api.StreamResponse{Json: b}, nil
}

// dropStrayBulkStreams deletes the bulk file streams no version holds (a
// publisher that wrote one after its version was abandoned or its table
// dropped). The state drops the streams of the versions it drops itself;
// this catches the writes that raced with that.
func (m *Master) dropStrayBulkStreams(ctx context.Context) {
	for _, name := range m.State().StrayBulkStreams() {
		_, err := m.streamDriver.Apply(ctx, stream.Command{Op: stream.OpDeleteStream, Stream: name})
		if err != nil && !errors.Is(err, stream.ErrStreamNotFound) {
			m.logger.Warn("tablemaster: delete a stray bulk stream", "stream", name, "err", err)
			continue
		}
		m.logger.Info("tablemaster: deleted a stray bulk stream", "stream", name)
	}
}

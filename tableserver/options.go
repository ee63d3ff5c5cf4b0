package tableserver

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/tabuladb/tabula/engines/vfs"
)

// Options configure a Server. DataDir and Masters are required; every other
// zero value takes the default its comment gives.
// defaultReplicateTimeout is Options.ReplicateTimeout's default: a
// partition log's secondary that does not answer a batch within it (a
// paused process) leaves the ack set rather than holding writes.
const defaultReplicateTimeout = 150 * time.Millisecond

type Options struct {
	// Masters are the Table Master addresses, tried in turn.
	Masters []string
	// ClusterKey is the cluster credential's key: the server signs its
	// calls to the master and other servers with it, and checks every
	// incoming call's signature against it or the tenants' keys (fetched
	// from the master). Nil turns authentication off (in-process tests
	// only; the tabula binary always sets one).
	ClusterKey []byte
	// TLS, when set, is served on the listener; DialTLS, when set, is
	// used for every connection the server makes (masters, peers' extent
	// nodes, copy sources). Nil: plaintext (internal/tlsfiles).
	TLS     *tls.Config
	DialTLS *tls.Config
	// DataDir holds the server's identity and its partitions' files.
	DataDir string
	// Advertise is the address clients and the master reach this server at.
	// Default: the listener's address.
	Advertise string
	// InternalListener, when set, is the cluster's own listener (Serve
	// serves it beside the client one): the extent node (replication,
	// coding, the commit logs' appends and reads) and every other call,
	// but only from the cluster credential, with admission of its own.
	// The server registers InternalAdvertise (default: the listener's
	// address) and the master gives that address to the stream layer, so
	// other servers reach this extent node there and client load on the
	// client listener never meets replication traffic. Nil: one listener
	// serves everything.
	InternalListener  net.Listener
	InternalAdvertise string
	// BulkCapacity is the bytes of bulk version files this server may hold
	// loaded, registered with the master: a rollout places no copy on a
	// server without room for its file. 0: half the machine's memory (not
	// limited when that cannot be read); negative: not limited.
	BulkCapacity int64
	// FaultDomain is the failure group (rack, host) the master spreads
	// replicas across: no two replicas of a partition share one. Default
	// empty: a domain of the server's own, "server:<id>" (the master names
	// it; stable across restarts, as the id is kept in DataDir). Servers
	// that fail together (one host, one rack) should name a shared domain.
	FaultDomain string
	// Incarnation identifies this run of the server to the master, which
	// refuses a second process registering a live server's id (see
	// tablemaster's OpRegisterServer). Default: a random nonzero number
	// chosen by Open, so every start is a new incarnation; set it only to
	// test that.
	Incarnation uint64
	// MaxInFlight is how many requests may run at once before new ones get
	// SERVER_BUSY. Default 4096.
	MaxInFlight int
	// MaxInternalInFlight is the same for cluster traffic (extent
	// replication, replica copies), counted apart so that client load
	// never refuses it. Default 4096.
	MaxInternalInFlight int
	// MaxInFlightBytes bounds the bytes of client requests being worked on
	// at once; one that does not fit gets SERVER_BUSY (a request larger
	// than the whole budget runs when nothing else is in flight). Stream
	// replication is not counted. Default DefaultMaxInFlightBytes.
	MaxInFlightBytes int64
	// MaxConcurrentStreams bounds the concurrent calls on one connection.
	// Default DefaultMaxConcurrentStreams.
	MaxConcurrentStreams uint32
	// CoprocMaxDeadline caps a coprocessor call's deadline: a longer
	// timeout asked for is cut to it. Default DefaultCoprocMaxDeadline.
	CoprocMaxDeadline time.Duration
	// PartitionOpsPerSec bounds the keys read and written per second in
	// any one partition hosted here, every tenant alike, so one hot
	// partition cannot take the whole server; over it a request gets
	// SERVER_BUSY (reason partition_busy). Default
	// DefaultPartitionOpsPerSec; negative: unlimited.
	PartitionOpsPerSec float64
	// BusyRetryAfter is the retry_after a SERVER_BUSY answer carries.
	// Default 10ms.
	BusyRetryAfter time.Duration
	// DrainTimeout bounds how long Drain waits for in-flight requests.
	// Default 5s.
	DrainTimeout time.Duration
	// CoprocCacheDir keeps coprocessors' compiled machine code across
	// restarts. Default <DataDir>/coproc-cache. Servers may share one.
	CoprocCacheDir string
	// ScrubInterval is the pause between the extent node's background
	// passes re-verifying every block of every extent replica. Default 10
	// minutes; negative turns the scrubber off.
	ScrubInterval time.Duration
	// ReplicateCalls is how many replication batches the extent node keeps
	// in flight to each other server (stream.NodeOptions.ReplicateCalls).
	// Default 1, best when the CPU is the limit; 2–4 lower write latency
	// on servers with cores to spare.
	ReplicateCalls int
	// ReplicateTimeout is how long a replication batch to another server
	// may go unanswered before that server's copies leave the ack sets of
	// the extents (they rejoin once it answers again): the floor of a
	// timeout that follows each link's round trips, up to
	// ReplicateTimeoutMax. Defaults 150 ms and 8× ReplicateTimeout; a
	// max equal to the floor fixes it.
	ReplicateTimeout, ReplicateTimeoutMax time.Duration
	// RepairBandwidth bounds the bytes per second this server copies into
	// new replicas of its partitions, every copy together, so foreground
	// requests keep their latency. Default DefaultRepairBandwidth;
	// negative: unlimited.
	RepairBandwidth int64
	// EngineSyncWrites has the engines of replicated partitions fsync
	// every write, as an unreplicated ssd table's do, though the commit
	// log is already the durable record. It costs write throughput and
	// exists to measure what flushing lazily gains (RATIONALE.md).
	EngineSyncWrites bool
	// ReadCacheBytes is the one read-cache budget every disk-backed
	// partition of this server shares (each gets an equal share, resized
	// as partitions come and go). Default DefaultReadCacheBytes.
	ReadCacheBytes int64
	// LogExtentBytes is how large a partition's commit-log extent grows
	// before the primary moves the log to a new one: the unit the master
	// deletes once every replica flushed past it. Default 64 MiB.
	LogExtentBytes int64
	// LogFlushInterval is how often the server makes its replicated
	// partitions' engines durable and reports the LSN they reached, which
	// bounds how much commit log the master keeps. Default 5s.
	LogFlushInterval time.Duration
	// EngineFS, if set, is the file system the partitions' engines keep
	// their files on instead of the operating system's: for tests that
	// inject disk faults (a vfs.MemFS).
	EngineFS vfs.FS
	// Now is the wall clock TTLs are measured by: the partitions' engines
	// expire keys by it, and a replica keeps a write's outcome for its
	// request id requestTTL by it from when it applied the write. Default
	// time.Now; tests skew a server's clock with it.
	Now func() time.Time
	// Logger receives the server's events. Default slog.Default().
	Logger *slog.Logger
	// OnMapApplied, when set, is called (on the map-watch goroutine) after
	// each cluster map is applied, with how long applying took: opening and
	// closing partitions, loading and unloading bulk versions, and the
	// atomic switch reads see. For metrics and benchmarks.
	OnMapApplied func(version uint64, took time.Duration)
	// OnSplit, when set, is called as a replica splits partition pid at
	// the split record's LSN: once after applying the record, before the
	// engine split (committed false), and once after it (the SPLIT marker
	// written), before the split is reported. A crash point for tests: if
	// ctx (the replica's) is done when it returns, the split stops there
	// as a crash would stop it.
	OnSplit func(ctx context.Context, pid, lsn uint64, committed bool)
	// OnMerge, when set, is called as a server merges the engines of two
	// partitions into child: once both parents applied their merge
	// records, before the engines' merge (committed false), and once
	// after it (the MERGED marker written), before it is reported. A
	// crash point for tests: if ctx (the left parent's replica's) is done
	// when it returns, the merge stops there as a crash would stop it.
	OnMerge func(ctx context.Context, child uint64, committed bool)
	// Metrics, when set, receives the server's figures (engines, extent
	// node, replication, coprocessors; metrics.go): Open registers a
	// collector that reads them at scrape time, Close unregisters it.
	// Two servers in one process need it wrapped with a label apart
	// (prometheus.WrapRegistererWith).
	Metrics prometheus.Registerer
	// UnaryInterceptors and StreamInterceptors run around every RPC the
	// server's gRPC service answers (TableServer and ExtentNode), in
	// order, before admission control: metrics (internal/metrics) and the
	// like. Default none.
	UnaryInterceptors  []grpc.UnaryServerInterceptor
	StreamInterceptors []grpc.StreamServerInterceptor
}

// Validate says what is wrong with o, if anything.
func (o Options) Validate() error {
	var errs []error
	if len(o.Masters) == 0 {
		errs = append(errs, errors.New("tableserver: at least one master address is required"))
	}
	if o.DataDir == "" {
		errs = append(errs, errors.New("tableserver: a data directory is required"))
	}
	if o.MaxInFlight < 0 {
		errs = append(errs, errors.New("tableserver: MaxInFlight must not be negative"))
	}
	if o.ReplicateCalls < 0 || o.ReplicateCalls > 64 {
		errs = append(errs, fmt.Errorf("tableserver: ReplicateCalls %d: want 1-64 (0: the default, 1)", o.ReplicateCalls))
	}
	if o.ReplicateTimeout < 0 || o.ReplicateTimeoutMax < 0 || (o.ReplicateTimeoutMax > 0 && o.ReplicateTimeoutMax < cmp.Or(o.ReplicateTimeout, defaultReplicateTimeout)) {
		errs = append(errs, fmt.Errorf("tableserver: ReplicateTimeout %v, ReplicateTimeoutMax %v: want 0 ≤ timeout ≤ max (0: the defaults, 150ms and 8× the timeout)", o.ReplicateTimeout, o.ReplicateTimeoutMax))
	}
	if o.MaxInFlightBytes < 0 {
		errs = append(errs, errors.New("tableserver: MaxInFlightBytes must not be negative"))
	}
	if o.CoprocMaxDeadline < 0 {
		errs = append(errs, errors.New("tableserver: CoprocMaxDeadline must not be negative"))
	}
	if o.ReadCacheBytes != 0 && o.ReadCacheBytes < 1<<20 {
		errs = append(errs, fmt.Errorf("tableserver: ReadCacheBytes %d: want at least 1 MiB", o.ReadCacheBytes))
	}
	return errors.Join(errs...)
}

func (o Options) withDefaults() Options {
	for o.Incarnation == 0 {
		o.Incarnation = rand.Uint64()
	}
	if o.MaxInFlight == 0 {
		o.MaxInFlight = 4096
	}
	if o.MaxInternalInFlight <= 0 {
		o.MaxInternalInFlight = 4096
	}
	if o.MaxInFlightBytes == 0 {
		o.MaxInFlightBytes = DefaultMaxInFlightBytes
	}
	if o.MaxConcurrentStreams == 0 {
		o.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	if o.CoprocMaxDeadline == 0 {
		o.CoprocMaxDeadline = DefaultCoprocMaxDeadline
	}
	if o.LogExtentBytes <= 0 {
		o.LogExtentBytes = 64 << 20
	}
	if o.LogFlushInterval <= 0 {
		o.LogFlushInterval = 5 * time.Second
	}
	if o.ReadCacheBytes == 0 {
		o.ReadCacheBytes = DefaultReadCacheBytes
	}
	if o.RepairBandwidth == 0 {
		o.RepairBandwidth = DefaultRepairBandwidth
	}
	if o.BusyRetryAfter == 0 {
		o.BusyRetryAfter = 10 * time.Millisecond
	}
	if o.PartitionOpsPerSec == 0 {
		o.PartitionOpsPerSec = DefaultPartitionOpsPerSec
	}
	if o.DrainTimeout == 0 {
		o.DrainTimeout = 5 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.CoprocCacheDir == "" {
		o.CoprocCacheDir = filepath.Join(o.DataDir, "coproc-cache")
	}
	switch {
	case o.ScrubInterval == 0:
		o.ScrubInterval = 10 * time.Minute
	case o.ScrubInterval < 0:
		o.ScrubInterval = 0 // the node's "off"
	}
	return o
}

// DefaultReadCacheBytes is Options.ReadCacheBytes's default: 512 MiB for
// all of a server's partitions together.
const DefaultReadCacheBytes = 512 << 20

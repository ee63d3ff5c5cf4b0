package tablemaster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/tablemaster/balance"
	"github.com/tabuladb/tabula/tablemaster/splitpolicy"
)

// Defaults of Options.
const (
	DefaultHeartbeatInterval = 100 * time.Millisecond
	// A failed primary is replaced about DeadAfter after its last answered
	// heartbeat (then the seal, promotion and clients' map refresh, tens of
	// milliseconds): the failover target is 1.5 s. DeadAfter exceeds the
	// lease, so the old primary has stopped serving by its own clock.
	DefaultLeaseDuration = 800 * time.Millisecond
	DefaultDeadAfter     = time.Second
	// DefaultReplaceAfter: see Options.ReplaceAfter.
	DefaultReplaceAfter = time.Minute
	// DefaultSnapshotEvery: a catalog command encodes to ~200 bytes, so 1024
	// commands is ~200 KiB of log to replay at worst.
	DefaultSnapshotEvery = 1024
)

// Options configure a Master. Only DataDir is required; every other zero
// value takes the default documented on the field.
type Options struct {
	// DataDir holds the master's durable state (snapshot and command log).
	// Required; created if missing.
	DataDir string `json:"data_dir"`
	// Logger receives the master's log lines. Default slog.Default().
	Logger *slog.Logger `json:"-"`
	// HeartbeatInterval is told to servers as how often to heartbeat, and is
	// how often the master checks for silent servers. Default 100ms.
	HeartbeatInterval time.Duration `json:"heartbeat_interval"`
	// LeaseDuration is told to servers: a primary serves only while its last
	// acknowledged heartbeat is younger than this. Default 1s.
	LeaseDuration time.Duration `json:"lease_duration"`
	// DeadAfter: a server silent this long is declared dead and its
	// partitions move. Default 3s; must exceed LeaseDuration, so a server is
	// declared dead only after its lease has run out by its own clock. A
	// durable partition whose only copy is on the dead server never moves on
	// its own: it waits, unavailable, for the server to return, or for an
	// operator to forget the server and accept the loss (ForgetServer).
	DeadAfter time.Duration `json:"dead_after"`
	// SnapshotEvery is how many logged commands trigger a snapshot and a
	// log reset. Default 1024.
	SnapshotEvery int `json:"snapshot_every"`
	// StreamTaskInterval is how often the stream manager runs its pending
	// tasks (re-replication, repair, garbage collection). Default 500ms.
	StreamTaskInterval time.Duration `json:"stream_task_interval"`
	// StreamSyncInterval is how often it asks every extent node for its
	// inventory (load, orphans, corrupt replicas). Default 5s.
	StreamSyncInterval time.Duration `json:"stream_sync_interval"`
	// Now is the clock. Default time.Now.
	Now func() time.Time `json:"-"`
	// OnSplitStep, when set, is called on the leader at each step of a
	// split of partition pid (SplitMarked, SplitReady, SplitFinished): a
	// fault point for tests. ctx ends when the master closes; a master
	// closed meanwhile goes no further, as after a crash there.
	OnSplitStep func(ctx context.Context, step SplitStep, pid uint64) `json:"-"`
	// ReplaceAfter is how long a dead (or drained) server's replicas of
	// replicated partitions stay in their replica sets, as secondaries out
	// of the log, before new ones are placed elsewhere (and copy the data):
	// a server back sooner (a restart, an upgrade) catches up from the log
	// instead. Its primaries fail over at once either way. Default 60s;
	// negative: replace at once.
	ReplaceAfter time.Duration `json:"replace_after,omitempty"`
	// Rebalance: the leader carries out the balancer's plan
	// (tablemaster/balance) every RebalanceInterval and when a server
	// joins: primary transfers and replica moves, a few at a time
	// (rebalance.go). `tabula master` and `tabula dev` set it unless
	// --rebalance=false; the zero Options leave it off (an embedded master,
	// a test that places by hand). `tabula cluster balance` runs one round
	// on demand either way.
	Rebalance bool `json:"rebalance,omitempty"`
	// RebalanceInterval is the time between balancing rounds. Default 5s.
	RebalanceInterval time.Duration `json:"rebalance_interval,omitempty"`
	// RebalanceSustain: the automatic rounds start an action only once
	// the plan has asked for the same kind of action between the same two
	// servers for this long (every round since): the rates follow the
	// traffic of the moment, and a copy or a handoff made for a few
	// seconds' noise would be undone by the next. A draining server's
	// actions, and rounds run on demand (tabula cluster balance), do not
	// wait. Default 2 × RebalanceInterval; negative: none.
	RebalanceSustain time.Duration `json:"rebalance_sustain,omitempty"`
	// Balance tunes the planner of BalancePlan and the balancing rounds
	// (band, floors, move limits). Default: balance.Options' defaults.
	Balance balance.Options `json:"-"`
	// DisableAutoSplit turns automatic splits off (autosplit.go). By
	// default the leader splits the partitions of point and ordered tables
	// that pass AutoSplit's thresholds.
	DisableAutoSplit bool `json:"disable_auto_split,omitempty"`
	// AutoSplit are the automatic splits' thresholds and limits (zero
	// fields: splitpolicy's defaults, 512 MiB, 2,500 reads+writes/s held
	// 10 s, 4 splits in flight, 256 partitions per table, 30 s cooldown);
	// a table's own settings (TableOptions) override the thresholds.
	AutoSplit splitpolicy.Options `json:"auto_split"`
	// AutoSplitInterval is how often the leader decides. Default 1s.
	AutoSplitInterval time.Duration `json:"auto_split_interval,omitempty"`
	// SplitAllWait is how long a split waits for every live replica to
	// report it before it completes on the primary's report alone (the
	// others then get copies). Default 3 s.
	SplitAllWait time.Duration `json:"split_all_wait,omitempty"`
	// TruncateInterval is how often the leader deletes partition-log
	// extents every replica has flushed past. Default 10s.
	TruncateInterval time.Duration `json:"truncate_interval,omitempty"`
	// MaxLogLag: a replica whose flushed LSN is more than this many
	// records behind its partition's most advanced replica no longer holds
	// the log back; it copies a snapshot when it finds the log trimmed
	// past it. Default 1,000,000.
	MaxLogLag uint64 `json:"max_log_lag,omitempty"`
	// SyncLag and SyncLagRecords bound an in-sync replica (insync.go): in
	// its log's ack set and at most SyncLag behind its primary in time or
	// SyncLagRecords in records. A partition with fewer in-sync replicas
	// than its replication factor for longer than SyncLag is
	// under-replicated. Defaults 1s (the read_any bound,
	// api.DefaultMaxStalenessMs) and 64.
	SyncLag        time.Duration `json:"sync_lag,omitempty"`
	SyncLagRecords uint64        `json:"sync_lag_records,omitempty"`
	// RaftID, when not 0, makes this master one member of a replicated
	// master group (raft): DataDir then holds the member's raft log and
	// snapshots. Peers are the group's founding members, id to address
	// (this one's included; the address is where each serves both the
	// master's API and raft), used only on a new DataDir; a member that
	// joins an existing group starts with no Peers and is added by the
	// leader (AddMaster).
	RaftID uint64            `json:"raft_id,omitempty"`
	Peers  map[uint64]string `json:"peers,omitempty"`
	// RaftTick is the raft clock's tick: elections time out after 10,
	// the leader heartbeats every one. Default 50ms.
	RaftTick time.Duration `json:"raft_tick,omitempty"`
	// ClusterKey is the cluster credential's key (auth.KeyBytes): every
	// RPC must be signed by it or by a tenant's key, and the master signs
	// its own calls (raft peers, extent nodes) with it. Nil turns
	// authentication off (in-process tests only; the tabula binary always
	// sets one).
	ClusterKey []byte `json:"-"`
	// TLS, when set, is served on every listener; DialTLS, when set, is
	// used for every connection the master makes (raft peers, extent
	// nodes). Nil: plaintext (internal/tlsfiles).
	TLS     *tls.Config `json:"-"`
	DialTLS *tls.Config `json:"-"`

	// Admission control (admission.go): the most client calls, table
	// servers' calls and map watches in flight at once, the bytes of
	// client requests in flight, the concurrent calls per connection, and
	// the retry_after of a refusal. Defaults DefaultMaxRequests,
	// DefaultMaxInternalRequests, DefaultMaxWatches,
	// DefaultMaxInFlightBytes, DefaultMaxConcurrentStreams,
	// DefaultBusyRetryAfter.
	MaxRequests          int           `json:"max_requests,omitempty"`
	MaxInternalRequests  int           `json:"max_internal_requests,omitempty"`
	MaxWatches           int           `json:"max_watches,omitempty"`
	MaxInFlightBytes     int64         `json:"max_in_flight_bytes,omitempty"`
	MaxConcurrentStreams uint32        `json:"max_concurrent_streams,omitempty"`
	BusyRetryAfter       time.Duration `json:"busy_retry_after,omitempty"`

	// Metrics, when set, receives the master's figures (catalog, servers,
	// raft, proposals; metrics.go): the first Serve registers a collector
	// that reads them at scrape time, Close unregisters it.
	Metrics prometheus.Registerer `json:"-"`
	// UnaryInterceptors and StreamInterceptors run around every RPC the
	// master serves, in order, before its leader check: metrics
	// (internal/metrics) and the like. Default none.
	UnaryInterceptors  []grpc.UnaryServerInterceptor  `json:"-"`
	StreamInterceptors []grpc.StreamServerInterceptor `json:"-"`
}

// withDefaults returns o with every zero field set to its default.
func (o Options) withDefaults() Options {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.HeartbeatInterval == 0 {
		o.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration = DefaultLeaseDuration
	}
	if o.DeadAfter == 0 {
		o.DeadAfter = DefaultDeadAfter
	}
	if o.SnapshotEvery == 0 {
		o.SnapshotEvery = DefaultSnapshotEvery
	}
	if o.StreamTaskInterval == 0 {
		o.StreamTaskInterval = 500 * time.Millisecond
	}
	if o.StreamSyncInterval == 0 {
		o.StreamSyncInterval = 5 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.ReplaceAfter == 0 {
		o.ReplaceAfter = DefaultReplaceAfter
	}
	if o.SplitAllWait == 0 {
		o.SplitAllWait = 3 * time.Second
	}
	if o.AutoSplitInterval <= 0 {
		o.AutoSplitInterval = time.Second
	}
	if o.TruncateInterval == 0 {
		o.TruncateInterval = 10 * time.Second
	}
	if o.RebalanceInterval <= 0 {
		o.RebalanceInterval = 5 * time.Second
	}
	if o.RebalanceSustain == 0 {
		o.RebalanceSustain = 2 * o.RebalanceInterval
	}
	if o.SyncLag <= 0 {
		o.SyncLag = api.DefaultMaxStalenessMs * time.Millisecond
	}
	if o.SyncLagRecords == 0 {
		o.SyncLagRecords = 64
	}
	if o.MaxLogLag == 0 {
		o.MaxLogLag = 1_000_000
	}
	if o.RaftTick == 0 {
		o.RaftTick = 50 * time.Millisecond
	}
	if o.MaxRequests == 0 {
		o.MaxRequests = DefaultMaxRequests
	}
	if o.MaxInternalRequests == 0 {
		o.MaxInternalRequests = DefaultMaxInternalRequests
	}
	if o.MaxWatches == 0 {
		o.MaxWatches = DefaultMaxWatches
	}
	if o.MaxInFlightBytes == 0 {
		o.MaxInFlightBytes = DefaultMaxInFlightBytes
	}
	if o.MaxConcurrentStreams == 0 {
		o.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	if o.BusyRetryAfter == 0 {
		o.BusyRetryAfter = DefaultBusyRetryAfter
	}
	return o
}

// Validate explains what is wrong with o (after defaults are applied), or
// returns nil.
func (o Options) Validate() error {
	o = o.withDefaults()
	var errs []error
	if o.DataDir == "" {
		errs = append(errs, errors.New("tablemaster: Options.DataDir is required"))
	}
	if o.HeartbeatInterval < 0 {
		errs = append(errs, fmt.Errorf("tablemaster: Options.HeartbeatInterval %v is negative", o.HeartbeatInterval))
	}
	if o.LeaseDuration < 0 {
		errs = append(errs, fmt.Errorf("tablemaster: Options.LeaseDuration %v is negative", o.LeaseDuration))
	}
	if o.LeaseDuration > 0 && o.LeaseDuration.Milliseconds() == 0 {
		errs = append(errs, fmt.Errorf("tablemaster: Options.LeaseDuration %v is under 1ms, the unit servers are told", o.LeaseDuration))
	}
	if o.DeadAfter <= o.LeaseDuration {
		errs = append(errs, fmt.Errorf("tablemaster: Options.DeadAfter %v must exceed LeaseDuration %v, or a partition could move while its old primary still holds a lease", o.DeadAfter, o.LeaseDuration))
	} else {
		g := LeaseGate{DeadAfter: o.DeadAfter}
		if o.RaftID != 0 {
			g = RaftLeaseGate(o.DeadAfter, raftElectionTicks*o.RaftTick)
		}
		if err := g.Check(o.LeaseDuration); err != nil {
			errs = append(errs, err)
		}
	}
	if err := o.AutoSplit.Validate(); err != nil {
		errs = append(errs, err)
	}
	if o.StreamTaskInterval < 0 || o.StreamSyncInterval < 0 {
		errs = append(errs, fmt.Errorf("tablemaster: Options.StreamTaskInterval %v and StreamSyncInterval %v must not be negative", o.StreamTaskInterval, o.StreamSyncInterval))
	}
	if o.MaxRequests < 0 || o.MaxInternalRequests < 0 || o.MaxWatches < 0 || o.MaxInFlightBytes < 0 || o.BusyRetryAfter < 0 {
		errs = append(errs, errors.New("tablemaster: admission limits (MaxRequests, MaxInternalRequests, MaxWatches, MaxInFlightBytes, BusyRetryAfter) must not be negative"))
	}
	if len(o.Peers) > 0 && o.RaftID == 0 {
		errs = append(errs, errors.New("tablemaster: Options.Peers needs Options.RaftID, this member's id among them"))
	}
	if _, ok := o.Peers[o.RaftID]; len(o.Peers) > 0 && !ok {
		errs = append(errs, fmt.Errorf("tablemaster: Options.RaftID %d is not among the Peers", o.RaftID))
	}
	if o.RaftTick < 0 {
		errs = append(errs, fmt.Errorf("tablemaster: Options.RaftTick %v is negative", o.RaftTick))
	}
	if o.SnapshotEvery < 0 {
		errs = append(errs, fmt.Errorf("tablemaster: Options.SnapshotEvery %d is negative", o.SnapshotEvery))
	}
	return errors.Join(errs...)
}

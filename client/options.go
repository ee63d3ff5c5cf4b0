package client

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	"github.com/tabuladb/tabula/api"
)

// MaxRequestIDBytes is the longest request id WithRequestID accepts. The
// SDK appends a short suffix per partition of a BatchWrite or a scattered
// Invoke; the server takes up to 256 bytes.
const MaxRequestIDBytes = 64

// WriteOption modifies one write: Put, Delete, CompareAndSwap, BatchWrite.
// WithTTL, WithRequestID, ReportLSN and a *Session are write options.
type WriteOption interface{ applyWrite(*writeOptions) }

// ReadOption modifies one read: Get, BatchGet, Scan, ScanPartition.
// ReadAny, MaxStaleness, MinLSN, ReportLSN and a *Session are read options.
type ReadOption interface{ applyRead(*readOptions) }

// ReadWriteOption is an option of reads and writes alike: ReportLSN and
// *Session.
type ReadWriteOption interface {
	WriteOption
	ReadOption
}

type writeOptions struct {
	ttl     time.Duration
	reqID   string   // "" until WithRequestID or the call generates one
	lsn     *uint64  // ReportLSN
	session *Session // records the write's LSN
}

type readOptions struct {
	any     bool
	minLSN  uint64
	maxLag  time.Duration // MaxStaleness; 0: the server's default
	lsn     *uint64
	session *Session
}

type writeOptionFunc func(*writeOptions)

func (f writeOptionFunc) applyWrite(o *writeOptions) { f(o) }

type readOptionFunc func(*readOptions)

func (f readOptionFunc) applyRead(o *readOptions) { f(o) }

// WithTTL makes the written record expire after d, rounded up to whole
// milliseconds. 0 means the table's default TTL; a negative d is an
// INVALID_ARGUMENT error.
func WithTTL(d time.Duration) WriteOption {
	return writeOptionFunc(func(o *writeOptions) { o.ttl = d })
}

// WithRequestID sends the write under request id id instead of a fresh
// random one. The server keeps each write's outcome under its id for 10
// minutes (replicated with the write, so across a failover too): a write
// sent again with the same id is not applied again and returns the first
// outcome. Use it to settle a write that failed with ErrOutcomeUnknown:
// call again with the same arguments and OutcomeUnknownError.RequestID.
// A BatchWrite must be given the same mutations in the same order. An id
// is at most MaxRequestIDBytes bytes; never reuse one for a different write.
func WithRequestID(id string) WriteOption {
	return writeOptionFunc(func(o *writeOptions) { o.reqID = id })
}

// ReportLSN stores in *p the log sequence number of the call: for a write,
// the LSN its partition's commit log gave it; for a read, the LSN of the
// last write the answering replica had applied. Pass it to MinLSN to read
// at least that state from any replica. A call that spans several
// partitions (BatchGet, BatchWrite, Scan) stores the LSN only when it
// touched exactly one partition, else 0: LSNs of different partitions are
// not comparable; a Session tracks them per partition. Tables without a
// commit log (bulk tables) report 0. *p is written only on success.
func ReportLSN(p *uint64) ReadWriteOption {
	return lsnOption{p}
}

type lsnOption struct{ p *uint64 }

func (l lsnOption) applyWrite(o *writeOptions) { o.lsn = l.p }
func (l lsnOption) applyRead(o *readOptions)   { o.lsn = l.p }

// ReadAny lets any replica of the partition answer, not only the primary:
// the read spreads load and survives a primary's failure, but may miss the
// latest writes (it reflects the replica's applied LSN, which ReportLSN
// gives). A replica more than 1 s behind its primary does not answer
// (MaxStaleness sets the bound). Combine it with MinLSN or a Session to
// read your own writes.
func ReadAny() ReadOption {
	return readOptionFunc(func(o *readOptions) { o.any = true })
}

// MaxStaleness bounds how far behind its primary a replica answering a
// ReadAny read may be (default 1 s, api.DefaultMaxStalenessMs): a
// secondary not in step with the primary's commit point within d (dropped
// from the log's ack set, cut off, catching up) answers UNAVAILABLE
// (replica_behind) and the SDK tries another replica, then the primary.
// d is rounded up to whole milliseconds; at most about 49 days. Without
// ReadAny the primary answers, which is never behind.
func MaxStaleness(d time.Duration) ReadOption {
	return readOptionFunc(func(o *readOptions) { o.maxLag = d })
}

// maxStalenessMs is the header's max_staleness_ms for d (0: the default).
func maxStalenessMs(d time.Duration) uint32 {
	if d <= 0 {
		return 0
	}
	ms := (d + time.Millisecond - 1) / time.Millisecond
	return uint32(min(ms, 1<<32-1))
}

// MinLSN makes the read wait for a replica that has applied at least LSN n
// of the partition's log: a replica that is behind answers UNAVAILABLE
// (behind_min_lsn) and the SDK tries another replica, then the primary,
// which has applied every acknowledged write. n is an LSN of the partition
// being read (from ReportLSN or CASResult.LSN of a write of the same key);
// for reads spanning partitions use a Session.
func MinLSN(n uint64) ReadOption {
	return readOptionFunc(func(o *readOptions) { o.minLSN = n })
}

// Session gives read-your-writes and monotonic reads to a sequence of calls,
// also with ReadAny: passed to a write, it records the write's LSN per
// partition; passed to a read, it asks the replica for at least the highest
// LSN the session wrote or read in that partition, and records what the
// read saw.
//
//	s := client.NewSession()
//	err := users.Put(ctx, k, v, s)
//	v, err := users.Get(ctx, k, client.ReadAny(), s) // sees the Put
//
// A Session is safe for concurrent use and may span tables. It forgets
// nothing: make one per logical session, not one per process. A table
// re-cut into new partitions starts the new ones at 0 (the old LSNs are
// of other logs).
type Session struct {
	mu   sync.Mutex
	lsns map[sessionKey]uint64 // guarded by mu
}

type sessionKey struct {
	table     string
	partition uint64
}

// NewSession returns an empty session.
func NewSession() *Session { return &Session{lsns: make(map[sessionKey]uint64)} }

func (s *Session) applyWrite(o *writeOptions) { o.session = s }
func (s *Session) applyRead(o *readOptions)   { o.session = s }

// LSN is the highest LSN the session saw in partition id of table.
func (s *Session) LSN(table string, partition uint64) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lsns[sessionKey{table, partition}]
}

// note records lsn for the partition if it is higher than what is known.
func (s *Session) note(table string, partition, lsn uint64) {
	if lsn == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lsns == nil {
		s.lsns = make(map[sessionKey]uint64)
	}
	k := sessionKey{table, partition}
	if lsn > s.lsns[k] {
		s.lsns[k] = lsn
	}
}

// newRequestID returns a random 128-bit request id in hex: unique across
// clients without coordination.
func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// writeOpts applies opts and gives the write its request id: the caller's,
// checked, or a fresh one.
func writeOpts(opts []WriteOption) (writeOptions, error) {
	var wo writeOptions
	for _, o := range opts {
		if o != nil {
			o.applyWrite(&wo)
		}
	}
	if wo.reqID == "" {
		wo.reqID = newRequestID()
	} else if len(wo.reqID) > MaxRequestIDBytes {
		return wo, api.InvalidArgument("request_id", "request_id_too_long", MaxRequestIDBytes,
			"request id of %d bytes; the limit is %d", len(wo.reqID), MaxRequestIDBytes)
	}
	return wo, nil
}

func readOpts(opts []ReadOption) readOptions {
	var ro readOptions
	for _, o := range opts {
		if o != nil {
			o.applyRead(&ro)
		}
	}
	return ro
}

// groupRequestID is the request id of one partition's share of a
// multi-partition write: the call's id and the index of the group's first
// item, so a call retried with the same id and the same items gives every
// group the id it had.
func groupRequestID(id string, first int) string {
	return fmt.Sprintf("%s/%d", id, first)
}

package tableserver

import (
	"math"
	"strconv"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/tabuladb/tabula/api"
)

// Quotas on a server. The master hands every server its share of each
// limited tenant's quotas in heartbeat responses (api.TenantShare; how
// shares are computed is in tablemaster/quotas.go). Here they are
// enforced:
//
//   - rates (keys read, keys written, coprocessor CPU milliseconds per
//     second) by a token bucket per tenant at the server's share, holding
//     at most one second of tokens. A request is admitted while its
//     bucket is not in debt and then charged in full (a batch larger than
//     the bucket is not refused forever); one in debt is refused
//     SERVER_BUSY with the time until the debt is paid as retry_after.
//     Coprocessor CPU is charged after the fact, from the runtime's
//     per-tenant accounting.
//   - sizes (stored and memory bytes) by an allowance: a write whose keys
//     and values would pass it is refused QUOTA_EXCEEDED and changes
//     nothing. Deletes are always admitted.
//   - every partition, whatever its tenant, by a token bucket of
//     Options.PartitionOpsPerSec keys per second: one hot partition
//     cannot take a whole server (after WAS's per-partition targets).
//
// A tenant the master sent no share for is not limited here.

// DefaultPartitionOpsPerSec is Options.PartitionOpsPerSec's default: far
// above what one partition of a 2-core server serves today (a few tens
// of thousands of keys per second), so it only stops a runaway client.
const DefaultPartitionOpsPerSec = 200_000

// quotaBurst is how many seconds of tokens a bucket holds.
const quotaBurst = 1.0

// maxQuotaRetryAfter bounds the retry_after of a rate refusal.
const maxQuotaRetryAfter = time.Second

// bucket is a token bucket; rate 0 admits everything. Not safe for
// concurrent use (quotas.mu guards it).
type bucket struct {
	rate   float64 // tokens per second
	tokens float64
	last   time.Time
}

// setRate changes the rate, keeping the tokens held (capped at the new
// burst). A bucket that had no rate starts full.
func (b *bucket) setRate(rate float64, now time.Time) {
	if rate == b.rate {
		return
	}
	if b.rate == 0 {
		b.tokens, b.last = rate*quotaBurst, now
	}
	b.refill(now)
	b.rate = rate
	b.tokens = min(b.tokens, rate*quotaBurst)
}

func (b *bucket) refill(now time.Time) {
	if d := now.Sub(b.last).Seconds(); d > 0 {
		b.tokens = min(b.tokens+d*b.rate, b.rate*quotaBurst)
	}
	b.last = now
}

// take charges n tokens, or returns how long until the bucket is out of
// debt.
func (b *bucket) take(n float64, now time.Time) (wait time.Duration, ok bool) {
	if b.rate == 0 {
		return 0, true
	}
	b.refill(now)
	if b.tokens < 0 {
		return time.Duration(-b.tokens / b.rate * float64(time.Second)), false
	}
	b.tokens -= n
	return 0, true
}

// charge takes n tokens unconditionally (work already done).
func (b *bucket) charge(n float64, now time.Time) {
	if b.rate == 0 {
		return
	}
	b.refill(now)
	b.tokens -= n
}

// tenantQuota is one tenant's limits and counters on this server.
type tenantQuota struct {
	mu               sync.Mutex // guards every field
	read, write, cpu bucket
	share            *api.TenantShare // nil: not limited
	// written and memWritten count bytes of keys and values written here
	// since the process started (monotonic, reported to the master).
	written, memWritten uint64
	// pending and memPending are the part of them charged to writes not
	// done yet: the engines' stored bytes (the master's usage) do not
	// include them, so the counters reported leave them out (a report
	// counting a write the usage beside it misses would let the master
	// hand out its bytes twice).
	pending, memPending uint64
	// Counters of the current window (reported and reset by load).
	offRead, offWrite, admRead, admWrite float64
	admCPU, offCPU                       float64
	throttled, refused                   float64
	cpuSeen                              time.Duration // the runtime's CPU total at the last charge
	// overload is offered ÷ admitted keys over the last complete window
	// (1 when nothing was refused): how many callers compete for each
	// token, which scales a refusal's retry_after.
	overload float64
}

// quotas is the server's quota enforcement. Safe for concurrent use: mu
// guards the maps and the window, each tenant and partition bucket has a
// lock of its own (so requests of different tenants and partitions do
// not contend). Lock order: quotas.mu, tenantQuota.mu, partBucket.mu.
type quotas struct {
	partitionRate float64
	retryMin      time.Duration
	mu            sync.RWMutex
	tenants       map[string]*tenantQuota
	parts         map[uint64]*partBucket
	windowStart   time.Time
	rates         map[string]*api.TenantLoad // of the last complete window
}

// partBucket is a partition's bucket with its lock.
type partBucket struct {
	mu sync.Mutex
	b  bucket
}

func newQuotas(partitionRate float64, retryMin time.Duration, now time.Time) *quotas {
	if partitionRate < 0 {
		partitionRate = 0
	}
	return &quotas{partitionRate: partitionRate, retryMin: retryMin, tenants: map[string]*tenantQuota{}, parts: map[uint64]*partBucket{}, windowStart: now}
}

// tenant returns name's quota state, made on first use. Not with q.mu held.
func (q *quotas) tenant(name string) *tenantQuota {
	q.mu.RLock()
	t := q.tenants[name]
	q.mu.RUnlock()
	if t != nil {
		return t
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.tenantLocked(name)
}

// tenantLocked is tenant with q.mu held for writing.
func (q *quotas) tenantLocked(name string) *tenantQuota {
	t := q.tenants[name]
	if t == nil {
		t = &tenantQuota{}
		q.tenants[name] = t
	}
	return t
}

// partition returns partition id's bucket (nil without a per-partition
// limit), made on first use. Not with q.mu held.
func (q *quotas) partition(id uint64, now time.Time) *partBucket {
	if q.partitionRate == 0 {
		return nil
	}
	q.mu.RLock()
	pb := q.parts[id]
	q.mu.RUnlock()
	if pb != nil {
		return pb
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if pb = q.parts[id]; pb == nil {
		pb = &partBucket{}
		pb.b.setRate(q.partitionRate, now)
		q.parts[id] = pb
	}
	return pb
}

// overloadRetryAfter is a refusal's retry_after per unit of overload: a
// tenant offering 10 times its rate waits a second, so its refused callers
// come back about as fast as tokens free up instead of spinning on
// refusals that cost the server CPU its other tenants need.
const overloadRetryAfter = 100 * time.Millisecond

// tenantBusy refuses a request of t over a rate.
// The refusal's limit is the server's share (per second, rounded up),
// which the SDK paces the tenant's calls to this server by.
func (q *quotas) tenantBusy(t *tenantQuota, b *bucket, reason, msg string, wait time.Duration) error {
	t.throttled++
	return q.busyLimit(reason, msg, max(wait, time.Duration(max(t.overload, 1)*float64(overloadRetryAfter))), uint64(math.Ceil(b.rate)))
}

func (q *quotas) busy(reason, msg string, wait time.Duration) error {
	return q.busyLimit(reason, msg, wait, 0)
}

func (q *quotas) busyLimit(reason, msg string, wait time.Duration, limit uint64) error {
	wait = min(max(wait, q.retryMin), maxQuotaRetryAfter)
	return api.Status(&api.ErrorDetail{
		Code:         api.ErrorCode_ERROR_CODE_SERVER_BUSY,
		Reason:       reason,
		RetryAfterMs: uint64(max(wait.Milliseconds(), 1)),
		Limit:        limit,
	}, msg)
}

// takePartition charges n keys to partition id's bucket pb (nil: no limit).
func (q *quotas) takePartition(pb *partBucket, id uint64, n float64, now time.Time) error {
	if pb == nil {
		return nil
	}
	pb.mu.Lock()
	wait, ok := pb.b.take(n, now)
	pb.mu.Unlock()
	if !ok {
		return q.busy("partition_busy", "partition "+u64(id)+" is over its limit of "+ftoa(q.partitionRate)+" keys per second", wait)
	}
	return nil
}

// read admits n keys read by tenant from partition id.
func (q *quotas) read(tenant string, id uint64, n int, now time.Time) error {
	pb := q.partition(id, now)
	t := q.tenant(tenant)
	t.mu.Lock()
	defer t.mu.Unlock()
	f := float64(n)
	t.offRead += f
	if wait, ok := t.read.take(f, now); !ok {
		return q.tenantBusy(t, &t.read, "tenant_read_rate", "tenant "+tenant+" is over its read quota ("+ftoa(t.read.rate)+" keys per second on this server)", wait)
	}
	if err := q.takePartition(pb, id, f, now); err != nil {
		t.read.tokens += f // not served: give them back
		t.throttled++
		return err
	}
	t.admRead += f
	return nil
}

// write admits n keys written by tenant to partition id, of bytes of keys
// and values (memory: to a memory table): a write that would pass the
// size allowances is refused, whatever it turns out to do. With charge
// the bytes are counted as written; a replicated partition's write counts
// them through size instead, once the log knows the write is new
// (logReplica.write): a retry of a write already applied or in flight, or
// a CAS that swaps nothing, writes no bytes.
func (q *quotas) write(tenant string, id uint64, n int, bytes uint64, charge, memory bool, now time.Time) error {
	pb := q.partition(id, now)
	t := q.tenant(tenant)
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := q.sizeLocked(t, tenant, bytes, memory); err != nil {
		return err
	}
	f := float64(n)
	t.offWrite += f
	if wait, ok := t.write.take(f, now); !ok {
		return q.tenantBusy(t, &t.write, "tenant_write_rate", "tenant "+tenant+" is over its write quota ("+ftoa(t.write.rate)+" keys per second on this server)", wait)
	}
	if err := q.takePartition(pb, id, f, now); err != nil {
		t.write.tokens += f
		t.throttled++
		return err
	}
	t.admWrite += f
	if charge {
		t.chargeLocked(bytes, memory)
	}
	return nil
}

// chargeLocked counts bytes of a write admitted and not done yet as
// written; the caller holds t.mu.
func (t *tenantQuota) chargeLocked(bytes uint64, memory bool) {
	t.written += bytes
	t.pending += bytes
	if memory {
		t.memWritten += bytes
		t.memPending += bytes
	}
}

// settle marks bytes charged by write or size as done (applied, or failed
// with the bytes kept as written): reports count them from now on.
func (q *quotas) settle(tenant string, bytes uint64, memory bool) {
	if bytes == 0 {
		return
	}
	t := q.tenant(tenant)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pending -= min(t.pending, bytes)
	if memory {
		t.memPending -= min(t.memPending, bytes)
	}
}

// sizeLocked refuses bytes of keys and values that would pass the
// tenant's size allowances; the caller holds t.mu.
func (q *quotas) sizeLocked(t *tenantQuota, tenant string, bytes uint64, memory bool) error {
	if sh := t.share; sh != nil && bytes > 0 {
		if sh.StoredLimited && t.written+bytes > sh.StoredAsOf+sh.StoredLeft {
			t.refused++
			return api.Errorf(api.ErrorCode_ERROR_CODE_QUOTA_EXCEEDED, "stored_bytes_quota", "tenant %s is at its quota of stored bytes; delete data or ask the operator for more (tabula tenant quota)", tenant)
		}
		if memory && sh.MemoryLimited && t.memWritten+bytes > sh.MemoryAsOf+sh.MemoryLeft {
			t.refused++
			return api.Errorf(api.ErrorCode_ERROR_CODE_QUOTA_EXCEEDED, "memory_bytes_quota", "tenant %s is at its quota of memory bytes; delete data or ask the operator for more (tabula tenant quota)", tenant)
		}
	}
	return nil
}

// size admits and charges bytes of keys and values a new write of tenant
// adds (see write).
func (q *quotas) size(tenant string, bytes uint64, memory bool) error {
	if bytes == 0 {
		return nil
	}
	t := q.tenant(tenant)
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := q.sizeLocked(t, tenant, bytes, memory); err != nil {
		return err
	}
	t.chargeLocked(bytes, memory)
	return nil
}

// unsize gives back bytes size charged for a write that was not made after
// all (refused by the log, or joined to the same request in flight).
func (q *quotas) unsize(tenant string, bytes uint64, memory bool) {
	if bytes == 0 {
		return
	}
	t := q.tenant(tenant)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.written -= min(t.written, bytes)
	t.pending -= min(t.pending, bytes)
	if memory {
		t.memWritten -= min(t.memWritten, bytes)
		t.memPending -= min(t.memPending, bytes)
	}
}

// chargeRead charges n keys already read (a scan's rows).
func (q *quotas) chargeRead(tenant string, n int, now time.Time) {
	t := q.tenant(tenant)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.read.charge(float64(n), now)
	t.offRead += float64(n)
	t.admRead += float64(n)
}

// chargeWrite admits a write of n keys and bytes of keys and values to r,
// and returns what the caller runs once the write is done (applied or
// failed). A replicated partition's bytes are charged by its log instead,
// once the write is known to be new (logReplica.write).
func (s *Server) chargeWrite(r *replica, n int, bytes uint64) (done func(), err error) {
	charge, memory := r.log == nil, r.table.GetOptions().GetStorage() == "memory"
	if err := s.quota.write(r.table.GetTenant(), r.part.GetId(), n, bytes, charge, memory, time.Now()); err != nil {
		return nil, err
	}
	if !charge || bytes == 0 {
		return func() {}, nil
	}
	return func() { s.quota.settle(r.table.GetTenant(), bytes, memory) }, nil
}

// coproc admits a coprocessor call of tenant (its CPU is charged later, by
// chargeCPU).
func (q *quotas) coproc(tenant string, now time.Time) error {
	t := q.tenant(tenant)
	t.mu.Lock()
	defer t.mu.Unlock()
	if wait, ok := t.cpu.take(0, now); !ok {
		return q.tenantBusy(t, &t.cpu, "tenant_cpu_rate", "tenant "+tenant+" is over its coprocessor CPU quota ("+ftoa(t.cpu.rate)+" ms per second on this server)", wait)
	}
	return nil
}

// chargeCPU charges every tenant the coprocessor CPU it used since the
// last call (cpu: the runtime's totals since the process started).
func (q *quotas) chargeCPU(cpu map[string]time.Duration, now time.Time) {
	for name, total := range cpu {
		t := q.tenant(name)
		t.mu.Lock()
		d := total - t.cpuSeen
		t.cpuSeen = total
		if d > 0 {
			ms := float64(d) / float64(time.Millisecond)
			t.cpu.charge(ms, now)
			t.admCPU += ms
			t.offCPU += ms
		}
		t.mu.Unlock()
	}
}

// apply installs the shares of a heartbeat response: tenants not listed
// are no longer limited.
func (q *quotas) apply(shares []*api.TenantShare, now time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	seen := make(map[string]bool, len(shares))
	for _, sh := range shares {
		t := q.tenantLocked(sh.GetTenant())
		seen[sh.GetTenant()] = true
		t.mu.Lock()
		t.share = sh
		t.read.setRate(sh.GetReadOpsPerSec(), now)
		t.write.setRate(sh.GetWriteOpsPerSec(), now)
		t.cpu.setRate(sh.GetCoprocCpuMsPerSec(), now)
		t.mu.Unlock()
	}
	for name, t := range q.tenants {
		t.mu.Lock()
		if !seen[name] && t.share != nil {
			t.share = nil
			t.read, t.write, t.cpu = bucket{}, bucket{}, bucket{}
		}
		t.mu.Unlock()
	}
}

// loadWindow is the shortest window load measures rates over: shorter
// ones (heartbeats come every 100 ms) would make demand, and the shares
// the master computes from it, jump from beat to beat.
const loadWindow = time.Second

// load reports every tenant's rates over the last complete window and its
// written counters now; a window of loadWindow or more ends here.
func (q *quotas) load(now time.Time) []*api.TenantLoad {
	q.mu.Lock()
	defer q.mu.Unlock()
	if secs := now.Sub(q.windowStart).Seconds(); secs >= loadWindow.Seconds() {
		q.rates = make(map[string]*api.TenantLoad, len(q.tenants))
		for name, t := range q.tenants {
			t.mu.Lock()
			q.rates[name] = &api.TenantLoad{
				ReadOpsPerSec:             t.offRead / secs,
				WriteOpsPerSec:            t.offWrite / secs,
				CoprocCpuMsPerSec:         t.offCPU / secs,
				AdmittedReadOpsPerSec:     t.admRead / secs,
				AdmittedWriteOpsPerSec:    t.admWrite / secs,
				AdmittedCoprocCpuMsPerSec: t.admCPU / secs,
				ThrottledPerSec:           t.throttled / secs,
				QuotaRefusedPerSec:        t.refused / secs,
			}
			t.overload = 1
			if adm := t.admRead + t.admWrite; t.throttled > 0 && adm > 0 {
				t.overload = (adm + t.throttled) / adm
			} else if t.throttled > 0 {
				t.overload = 10
			}
			t.offRead, t.offWrite, t.offCPU, t.admRead, t.admWrite, t.admCPU, t.throttled, t.refused = 0, 0, 0, 0, 0, 0, 0, 0
			t.mu.Unlock()
		}
		q.windowStart = now
	}
	out := make([]*api.TenantLoad, 0, len(q.tenants))
	for name, t := range q.tenants {
		l := &api.TenantLoad{}
		if r := q.rates[name]; r != nil {
			l = proto.CloneOf(r)
		}
		t.mu.Lock()
		l.Tenant, l.WrittenBytes, l.MemoryWrittenBytes = name, t.written-t.pending, t.memWritten-t.memPending
		t.mu.Unlock()
		out = append(out, l)
	}
	return out
}

// keepPartitions drops the buckets of partitions no longer hosted.
func (q *quotas) keepPartitions(hosted func(id uint64) bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for id := range q.parts {
		if !hosted(id) {
			delete(q.parts, id)
		}
	}
}

func ftoa(f float64) string {
	if f == math.Trunc(f) {
		return u64(uint64(f))
	}
	return strconv.FormatFloat(f, 'f', 1, 64)
}

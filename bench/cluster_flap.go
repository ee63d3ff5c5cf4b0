package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/tabuladb/tabula/api"
)

// The flapping secondary (issue "Replicas that stay in step"): under the
// write load, one server is SIGSTOPped for a moment every few seconds,
// long enough for its secondaries to be dropped from their log extents'
// ack sets; each time, how long until its replicas are back in step, and
// after the last pause how long until every partition again has its full
// replication factor. The figures come from two sources, polled together:
// the replicas' statuses as the master has them (DescribeTable: applied
// LSNs, reported with a full heartbeat every ~500 ms, so in-step times
// are known to within about that), and every server's drop and rejoin
// counters (its /metrics, which move the moment a secondary is dropped
// or taken back).

const (
	clStreamDrops   = "tabula_stream_secondary_drops_total"
	clStreamRejoins = "tabula_stream_secondary_rejoins_total"
	// clFlapPoll is how often the statuses and counters are polled.
	clFlapPoll = 50 * time.Millisecond
	// clFlapIdle: a partition whose primary reports no new applied LSN this
	// long after the resume takes no writes; its target is what it has.
	clFlapIdle = 2 * time.Second
	// clFlapGiveUp ends the wait for one pause's replicas.
	clFlapGiveUp = 30 * time.Second
)

// clStreamCounters reads the stream's drop and rejoin counters of every
// server of tab and sums them. A server that does not answer (paused,
// restarting) counts with what it said last. Not safe for concurrent use.
//
// A dropped secondary is not always brought back: when the extent's
// appends fail (a primary that was itself paused finds, on waking, every
// Replicate of the pause timed out), the extent is sealed and the log
// goes on in a new one, whose ack set names every replica afresh. There
// is no counter of those; the primary logs each ("secondary not brought
// back to the ack set"), and givenUp counts the lines.
type clStreamCounters struct {
	addrs []string
	http  *http.Client
	last  []clDropsRejoins
	logs  []*clLogCount
}

type clDropsRejoins struct{ drops, rejoins, givenUp float64 }

// clGivenUp is what a primary logs when a dropped secondary cannot rejoin
// the extent (replication/stream/rejoin.go).
const clGivenUp = "secondary not brought back to the ack set"

func newClStreamCounters(tab *clTabula) *clStreamCounters {
	c := &clStreamCounters{
		addrs: tab.metricsAddrs,
		http:  &http.Client{Timeout: time.Second},
		last:  make([]clDropsRejoins, len(tab.metricsAddrs)),
	}
	for _, p := range tab.servers {
		c.logs = append(c.logs, &clLogCount{path: p.logPath, what: clGivenUp})
	}
	return c
}

// read scrapes every server at once and returns the sums; err says which
// servers did not answer (their last values are in the sums).
func (c *clStreamCounters) read(ctx context.Context) (clDropsRejoins, error) {
	var (
		wg   sync.WaitGroup
		errs = make([]error, len(c.addrs))
	)
	for i, addr := range c.addrs {
		if addr == "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := c.scrape(ctx, addr)
			if err != nil {
				errs[i] = fmt.Errorf("server %d: %w", i, err)
				return
			}
			c.last[i] = v
		}()
	}
	wg.Wait()
	var sum clDropsRejoins
	for _, v := range c.last {
		sum.drops += v.drops
		sum.rejoins += v.rejoins
	}
	for _, l := range c.logs {
		n, err := l.count()
		sum.givenUp += float64(n)
		errs = append(errs, err)
	}
	return sum, errors.Join(errs...)
}

// clLogCount counts the lines of a log file holding what, reading only
// what was added since the last call. Not safe for concurrent use.
type clLogCount struct {
	path string
	what string
	off  int64 // bytes read: up to the end of the last whole line
	n    int
}

func (l *clLogCount) count() (int, error) {
	f, err := os.Open(l.path)
	if err != nil {
		return l.n, fmt.Errorf("count %q in a log: %w", l.what, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.NewSectionReader(f, l.off, 1<<40))
	if err != nil {
		return l.n, fmt.Errorf("count %q in %s: %w", l.what, l.path, err)
	}
	whole := bytes.LastIndexByte(b, '\n') + 1 // a line being written waits for the next call
	l.n += bytes.Count(b[:whole], []byte(l.what))
	l.off += int64(whole)
	return l.n, nil
}

func (c *clStreamCounters) scrape(ctx context.Context, addr string) (clDropsRejoins, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return clDropsRejoins{}, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return clDropsRejoins{}, fmt.Errorf("scrape metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return clDropsRejoins{}, fmt.Errorf("scrape metrics of %s: %s", addr, resp.Status)
	}
	return clParseDropsRejoins(resp.Body)
}

// clParseDropsRejoins reads the two counters from Prometheus's text
// format; both must be there (a server without them cannot be judged).
func clParseDropsRejoins(r io.Reader) (clDropsRejoins, error) {
	var v clDropsRejoins
	var found int
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if !ok || (name != clStreamDrops && name != clStreamRejoins) {
			continue
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			return clDropsRejoins{}, fmt.Errorf("metric %s: %w", name, err)
		}
		if name == clStreamDrops {
			v.drops, found = f, found|1
		} else {
			v.rejoins, found = f, found|2
		}
	}
	if err := sc.Err(); err != nil {
		return clDropsRejoins{}, fmt.Errorf("read metrics: %w", err)
	}
	if found != 3 {
		return clDropsRejoins{}, fmt.Errorf("metrics lack %s or %s", clStreamDrops, clStreamRejoins)
	}
	return v, nil
}

// clFlapSnap is what one poll saw: the table's map and its replicas'
// statuses as the master has them, and the counters summed over servers.
type clFlapSnap struct {
	at      time.Time
	primary map[uint64]string            // partition id -> primary's server id ("" none)
	hosts   map[uint64][]string          // partition id -> server ids of its replicas in the map
	applied map[uint64]map[string]uint64 // partition id -> server id -> reported applied LSN
	inSync  map[uint64]map[string]bool   // partition id -> server id -> reported IN_SYNC
	ctr     clDropsRejoins
}

func clNewFlapSnap(at time.Time, d *api.DescribeTableResponse, ctr clDropsRejoins) *clFlapSnap {
	s := &clFlapSnap{at: at, primary: map[uint64]string{}, hosts: map[uint64][]string{},
		applied: map[uint64]map[string]uint64{}, inSync: map[uint64]map[string]bool{}, ctr: ctr}
	for _, p := range d.GetMap().GetPartitions() {
		s.primary[p.GetId()] = clPrimary(p)
		for _, r := range p.GetReplicas() {
			s.hosts[p.GetId()] = append(s.hosts[p.GetId()], r.GetServerId())
		}
	}
	for _, r := range d.GetReplicas() {
		id := r.GetPartitionId()
		if s.applied[id] == nil {
			s.applied[id], s.inSync[id] = map[string]uint64{}, map[string]bool{}
		}
		s.applied[id][r.GetServerId()] = r.GetAppliedLsn()
		s.inSync[id][r.GetServerId()] = r.GetState() == api.ReplicaState_REPLICA_STATE_IN_SYNC
	}
	return s
}

// out is how many dropped secondaries are not back yet and not given up
// on (their extent sealed: the log goes on in a new one that has them).
func (s *clFlapSnap) out() float64 { return s.ctr.drops - s.ctr.rejoins - s.ctr.givenUp }

// clFlapPause follows one pause from its resume on, one poll at a time
// (observe), until its figures are known. Not safe for concurrent use.
//
// In step: every replica on the paused server has applied at least what
// its primary had applied after the resume. What the master has at the
// resume may be a report made before the pause, so a partition's target
// is the first applied LSN its primary reports that differs from the one
// seen at the first poll after the resume: made after the resume, so at
// least what the primary had then (a stricter target, never a laxer one).
type clFlapPause struct {
	victim   string // server id of the paused server
	replicas int    // the table's replication factor
	stopped  time.Time
	resumed  time.Time
	slotEnd  time.Time // the next pause's stop (when one is due)
	outBase  float64   // dropped secondaries not back before the flapping began

	first  *clFlapSnap       // the first poll after the resume
	target map[uint64]uint64 // partition id -> primary's applied LSN reported after the resume

	ctrBefore clDropsRejoins // the counters at the last poll before the stop
	closed    bool           // its figures known, or given up on

	inStep time.Time // the paused server's replicas reached their targets
	ackSet time.Time // the counters: every dropped secondary back in its ack set
	full   time.Time // every partition has replicas replicas, all IN_SYNC and at their targets
}

// observe takes one poll, made after the resume.
func (p *clFlapPause) observe(s *clFlapSnap) {
	if p.first == nil {
		p.first, p.target = s, map[uint64]uint64{}
	}
	for id, prim := range s.primary {
		if _, ok := p.target[id]; ok || prim == "" {
			continue
		}
		now, ok := s.applied[id][prim]
		if !ok {
			continue
		}
		before, seen := p.first.applied[id][p.first.primary[id]]
		if !seen || now != before || s.at.Sub(p.first.at) >= clFlapIdle {
			p.target[id] = now
		}
	}
	targets := len(p.target) == len(s.primary)
	// The ack sets are whole from the first poll after which no dropped
	// secondary was out again within the pause's slot: some drops come
	// only after the resume (the paused server's own timers, or a
	// Replicate timed out late), so the first poll may still show none.
	switch {
	case s.out() > p.outBase && s.at.Before(p.slotEnd):
		p.ackSet = time.Time{}
	case s.out() <= p.outBase && p.ackSet.IsZero():
		p.ackSet = s.at
	}
	if p.inStep.IsZero() && targets && p.replicasAtTarget(s, func(server string) bool { return server == p.victim }) {
		p.inStep = s.at
	}
	if p.full.IsZero() && targets && p.replicasAtTarget(s, func(string) bool { return true }) {
		p.full = s.at
	}
}

// replicasAtTarget says whether every replica on a server that which
// accepts has applied its partition's target; with every server
// accepted, also whether every partition has its replication factor of
// replicas, each IN_SYNC.
func (p *clFlapPause) replicasAtTarget(s *clFlapSnap, which func(server string) bool) bool {
	all := which("")
	for id, hosts := range s.hosts {
		if all && len(hosts) < p.replicas {
			return false
		}
		for _, h := range hosts {
			if !which(h) {
				continue
			}
			applied, ok := s.applied[id][h]
			if !ok || applied < p.target[id] || (all && !s.inSync[id][h]) {
				return false
			}
		}
	}
	return true
}

// done says whether every figure of the pause is known at poll time at:
// each reached, and the slot over.
func (p *clFlapPause) done(at time.Time) bool {
	return !p.inStep.IsZero() && !p.ackSet.IsZero() && !p.full.IsZero() && !at.Before(p.slotEnd)
}

// since is the seconds from the resume to t; clFlapGiveUp when t is zero
// (never reached).
func (p *clFlapPause) since(t time.Time) float64 {
	if t.IsZero() {
		return clFlapGiveUp.Seconds()
	}
	return t.Sub(p.resumed).Seconds()
}

// clFlapLoad is the write load of the flap run: goroutines closed loops
// of puts, each with a deadline, timed into the histogram of the phase
// current when it started, apart by whether its partition's primary is
// on the paused server. Fields other than phase are read once stopped.
type clFlapLoad struct {
	phase atomic.Int32 // clFlapWarm..clFlapAfter
	stop  chan struct{}
	wg    sync.WaitGroup

	mu     sync.Mutex
	hist   [clFlapPhases][2]*hdrhistogram.Histogram // [phase][primary on the paused server]
	errs   [clFlapPhases]int64
	last   error
	phaseT [clFlapPhases]time.Duration // how long each phase lasted
}

const (
	clFlapWarm = iota
	clFlapSteady
	clFlapFlapping
	clFlapAfter
	clFlapPhases
)

func startClFlapLoad(ctx context.Context, tab *clTabula, keys [][]byte, onVictim []bool, cfg *clConfig) *clFlapLoad {
	l := &clFlapLoad{stop: make(chan struct{})}
	for ph := range l.hist {
		l.hist[ph] = [2]*hdrhistogram.Histogram{clNewHist(), clNewHist()}
	}
	for g := range cfg.goroutines {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			rng := rand.New(rand.NewPCG(cfg.seed, 2000+uint64(g)))
			val := make([]byte, cfg.valueSize)
			var hist [clFlapPhases][2]*hdrhistogram.Histogram
			for ph := range hist {
				hist[ph] = [2]*hdrhistogram.Histogram{clNewHist(), clNewHist()}
			}
			var errs [clFlapPhases]int64
			var last error
			for {
				select {
				case <-l.stop:
					l.mu.Lock()
					defer l.mu.Unlock()
					for ph := range hist {
						l.hist[ph][0].Merge(hist[ph][0])
						l.hist[ph][1].Merge(hist[ph][1])
						l.errs[ph] += errs[ph]
					}
					if last != nil {
						l.last = last
					}
					return
				default:
				}
				ph := l.phase.Load()
				i := rng.IntN(len(keys))
				clPutValue(rng, val)
				t0 := time.Now()
				wctx, cancel := context.WithTimeout(ctx, cfg.opTimeout)
				err := tab.tbl.Put(wctx, keys[i], val)
				cancel()
				if err != nil {
					errs[ph]++
					last = err
					if ctx.Err() != nil {
						<-l.stop
					}
					continue
				}
				v := 0
				if onVictim[i] {
					v = 1
				}
				_ = hist[ph][v].RecordValue(max(1, time.Since(t0).Microseconds()))
			}
		}()
	}
	return l
}

// finish stops the writers and waits for them.
func (l *clFlapLoad) finish() {
	select {
	case <-l.stop:
		return
	default:
	}
	close(l.stop)
	l.wg.Wait()
}

// merged is phase ph's histogram over all writes, or over the writes of
// one class (primary on the paused server or not).
func (l *clFlapLoad) merged(ph int, classes ...int) *hdrhistogram.Histogram {
	h := clNewHist()
	for _, c := range classes {
		h.Merge(l.hist[ph][c])
	}
	return h
}

// clFlapVictim picks the server to pause: the one hosting secondaries of
// m with the fewest primaries, the most secondaries among those (a
// server hosting only secondaries when there is one, as the pause run
// picks). Returns its index in tab.servers, or -1.
func clFlapVictim(m *api.PartitionMap, ids map[string]string, servers int) (idx, prim, sec int) {
	prims, secs := map[string]int{}, map[string]int{}
	for _, p := range m.GetPartitions() {
		for _, r := range p.GetReplicas() {
			if r.GetRole() == api.ReplicaRole_REPLICA_ROLE_PRIMARY {
				prims[r.GetServerId()]++
			} else {
				secs[r.GetServerId()]++
			}
		}
	}
	idx = -1
	for i := range servers {
		id := ids[fmt.Sprintf("fd-%d", i)]
		if secs[id] == 0 {
			continue
		}
		if idx < 0 || prims[id] < prim || (prims[id] == prim && secs[id] > sec) {
			idx, prim, sec = i, prims[id], secs[id]
		}
	}
	return idx, prim, sec
}

// clFlap pauses one server hosting secondaries cfg.flapPause every
// cfg.flapInterval, cfg.flaps times, under cfg.goroutines writers, after
// a steady run of cfg.duration, and times each pause's replicas back in
// step and the table back to its full replication factor.
func clFlap(ctx context.Context, out io.Writer, tab *clTabula, keys [][]byte, cfg *clConfig) error {
	if tab.replicas < 2 {
		fmt.Fprintln(out, "note: flap run skipped: the table has 1 replica, so no server hosts a secondary")
		return nil
	}
	m, err := tab.waitPlaced(ctx, tab.tableName, 30*time.Second)
	if err != nil {
		return err
	}
	ids, err := tab.serverIDs(ctx)
	if err != nil {
		return err
	}
	victim, prims, secs := clFlapVictim(m, ids, len(tab.servers))
	if victim < 0 {
		fmt.Fprintln(out, "note: flap run skipped: no live server hosts a secondary")
		return nil
	}
	vid := ids[fmt.Sprintf("fd-%d", victim)]
	onVictim := make([]bool, len(keys))
	for i, k := range keys {
		p, err := clPartIndex(m, k)
		if err != nil {
			return err
		}
		onVictim[i] = clPrimary(m.GetPartitions()[p]) == vid
	}
	ctrs := newClStreamCounters(tab)
	snap := func() (*clFlapSnap, error) {
		at := time.Now()
		c, cerr := ctrs.read(ctx)
		d, err := tab.c.DescribeTable(ctx, tab.tableName)
		if err != nil {
			return nil, fmt.Errorf("flap: describe %s: %w", tab.tableName, err)
		}
		if cerr != nil && !errors.Is(cerr, context.Canceled) {
			fmt.Fprintf(os.Stderr, "cluster: flap: %v\n", cerr)
		}
		return clNewFlapSnap(at, d, c), nil
	}

	fmt.Fprintf(out, "# flap: %d writers putting uniformly over the %d keys of %q (%d partitions, %d replicas), %v per write; server fd-%d (%d primaries, %d secondaries) SIGSTOPped for %v every %v, %d times, after %v of steady load; statuses (DescribeTable) and every server's stream counters polled every %v\n",
		cfg.goroutines, len(keys), tab.tableName, tab.partitions, tab.replicas, cfg.opTimeout, victim, prims, secs, cfg.flapPause, cfg.flapInterval, cfg.flaps, cfg.duration, clFlapPoll)
	if prims > 0 {
		fmt.Fprintf(out, "note: every server is primary of some partition; fd-%d is of %d: writes to those wait out each pause, so the p99 of the writes to partitions whose primary is elsewhere is printed apart\n", victim, prims)
	}

	load := startClFlapLoad(ctx, tab, keys, onVictim, cfg)
	defer load.finish()
	wait := func(d time.Duration) error {
		select {
		case <-time.After(d):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := wait(time.Second); err != nil { // warm-up, untimed
		return err
	}
	load.phase.Store(clFlapSteady)
	steadyStart := time.Now()
	if err := wait(cfg.duration); err != nil {
		return err
	}
	base, err := snap()
	if err != nil {
		return err
	}

	proc := tab.servers[victim]
	latest := base
	var pauses []*clFlapPause
	flapStart := time.Now()
	load.phase.Store(clFlapFlapping)
	load.phaseT[clFlapSteady] = flapStart.Sub(steadyStart)
	flapEnd := flapStart.Add(time.Duration(cfg.flaps) * cfg.flapInterval)
	next := flapStart
	for {
		if len(pauses) < cfg.flaps && !time.Now().Before(next) {
			stopped := time.Now()
			p := &clFlapPause{victim: vid, replicas: tab.replicas, outBase: base.out(), ctrBefore: latest.ctr, stopped: stopped, slotEnd: stopped.Add(cfg.flapInterval)}
			if err := proc.signal(syscall.SIGSTOP); err != nil {
				return fmt.Errorf("flap: pause fd-%d: %w", victim, err)
			}
			werr := wait(cfg.flapPause) // the fault itself
			if err := proc.signal(syscall.SIGCONT); err != nil {
				return errors.Join(werr, fmt.Errorf("flap: resume fd-%d: %w", victim, err))
			}
			if werr != nil {
				return werr
			}
			p.resumed = time.Now()
			pauses = append(pauses, p)
			next = flapStart.Add(time.Duration(len(pauses)) * cfg.flapInterval)
		}
		if load.phase.Load() == clFlapFlapping && !time.Now().Before(flapEnd) {
			load.phase.Store(clFlapAfter)
			load.phaseT[clFlapFlapping] = time.Since(flapStart)
		}
		s, err := snap()
		if err != nil {
			return err
		}
		latest = s
		open := false
		for _, p := range pauses {
			if p.closed {
				continue
			}
			p.observe(s)
			if p.done(s.at) || s.at.Sub(p.resumed) > clFlapGiveUp {
				p.closed = true
				continue
			}
			open = true
		}
		if len(pauses) == cfg.flaps && !open && load.phase.Load() == clFlapAfter {
			break
		}
		d := clFlapPoll
		if len(pauses) < cfg.flaps {
			d = min(d, time.Until(next))
		}
		if err := wait(max(d, 0)); err != nil {
			return err
		}
	}
	end, err := snap()
	if err != nil {
		return err
	}
	load.finish()
	if load.phase.Load() == clFlapFlapping {
		load.phaseT[clFlapFlapping] = time.Since(flapStart)
	}

	var inStep, ackSet []float64
	failures := 0
	for i, p := range pauses {
		inStep, ackSet = append(inStep, p.since(p.inStep)), append(ackSet, p.since(p.ackSet))
		if p.inStep.IsZero() {
			failures++
		}
		// The counters over the pause's slot: to the next pause's stop.
		upTo := end.ctr
		if i+1 < len(pauses) {
			upTo = pauses[i+1].ctrBefore
		}
		fmt.Fprintf(out, "raw flap-pause %d fd-%d stopped %v, resumed at %s: in step after %.2f s, ack sets whole after %.2f s, every partition full after %.2f s; to the next stop %.0f secondaries dropped, %.0f rejoined, %.0f given up (extent sealed)\n",
			i+1, victim, p.resumed.Sub(p.stopped).Round(time.Millisecond), p.resumed.UTC().Format("15:04:05.000"), p.since(p.inStep), p.since(p.ackSet), p.since(p.full),
			upTo.drops-p.ctrBefore.drops, upTo.rejoins-p.ctrBefore.rejoins, upTo.givenUp-p.ctrBefore.givenUp)
	}
	// Under-replicated after the last pause: until every partition has
	// its replicas in sync and at their targets by the statuses, and no
	// secondary is out of an ack set by the counters.
	last := pauses[len(pauses)-1]
	under := last.since(last.full)
	if !last.full.IsZero() && last.ackSet.After(last.full) {
		under = last.since(last.ackSet)
	}

	drops, rejoins, givenUp := end.ctr.drops-base.ctr.drops, end.ctr.rejoins-base.ctr.rejoins, end.ctr.givenUp-base.ctr.givenUp
	steady, flapping := load.merged(clFlapSteady, 0, 1), load.merged(clFlapFlapping, 0, 1)
	steadyElse, flappingElse := load.merged(clFlapSteady, 0), load.merged(clFlapFlapping, 0)
	ops := func(h *hdrhistogram.Histogram, ph int) float64 {
		return float64(h.TotalCount()) / load.phaseT[ph].Seconds()
	}
	fmt.Fprintf(out, "raw flap-writes steady %.0f ops/s p50 %d us p99 %d us; flapping %.0f ops/s p50 %d us p99 %d us; primary elsewhere: steady p99 %d us, flapping p99 %d us; %d writes failed or timed out (last error: %v)\n",
		ops(steady, clFlapSteady), steady.ValueAtQuantile(50), steady.ValueAtQuantile(99), ops(flapping, clFlapFlapping), flapping.ValueAtQuantile(50), flapping.ValueAtQuantile(99),
		steadyElse.ValueAtQuantile(99), flappingElse.ValueAtQuantile(99), sumInts(load.errs[:]), load.last)
	fmt.Fprintf(out, "raw flap-counters %.0f secondaries dropped, %.0f rejoined, %.0f given up on (extent sealed; logged) during the flapping, summed over servers; %.0f out before it, %.0f after\n", drops, rejoins, givenUp, base.out(), end.out())
	if failures > 0 {
		fmt.Fprintf(out, "note: flap: %d of %d pauses' replicas not in step within %v (counted as %v)\n", failures, len(pauses), clFlapGiveUp, clFlapGiveUp)
	}
	if last.ackSet.IsZero() {
		fmt.Fprintf(out, "note: flap: the rejoin counters did not catch up with the drops within %v of the last pause ; under-replicated time from the statuses alone\n", clFlapGiveUp)
	}
	fmt.Fprintf(out, "figure cluster-secondary-rejoin-s-p50 %.2f s\n", clQuantile(inStep, 0.5))
	fmt.Fprintf(out, "figure cluster-secondary-rejoin-s-p99 %.2f s\n", clQuantile(inStep, 0.99))
	fmt.Fprintf(out, "figure cluster-secondary-ackset-s-p50 %.2f s\n", clQuantile(ackSet, 0.5))
	fmt.Fprintf(out, "figure cluster-secondary-ackset-s-p99 %.2f s\n", clQuantile(ackSet, 0.99))
	fmt.Fprintf(out, "figure cluster-secondary-rejoin-failures %d pauses\n", failures)
	fmt.Fprintf(out, "figure cluster-under-replicated-s %.2f s\n", under)
	fmt.Fprintf(out, "figure cluster-flap-secondary-drops %.0f\n", drops)
	fmt.Fprintf(out, "figure cluster-flap-secondary-rejoins %.0f\n", rejoins)
	fmt.Fprintf(out, "figure cluster-flap-secondary-given-up %.0f\n", givenUp)
	fmt.Fprintf(out, "figure cluster-flap-write-p99-ratio %.2f\n", float64(flapping.ValueAtQuantile(99))/float64(max(1, steady.ValueAtQuantile(99))))
	if prims > 0 {
		fmt.Fprintf(out, "figure cluster-flap-write-p99-ratio-primary-elsewhere %.2f\n", float64(flappingElse.ValueAtQuantile(99))/float64(max(1, steadyElse.ValueAtQuantile(99))))
	}
	fmt.Fprintf(out, "figure cluster-flap-write-errors %d\n", sumInts(load.errs[:]))
	_, err = tab.waitPlaced(ctx, tab.tableName, 30*time.Second)
	return err
}

// clQuantile is the q-quantile of vs (nearest rank), 0 when empty.
func clQuantile(vs []float64, q float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(vs))
	return s[int(math.Round(float64(len(s)-1)*q))]
}

func sumInts(vs []int64) int64 {
	var n int64
	for _, v := range vs {
		n += v
	}
	return n
}

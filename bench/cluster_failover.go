package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/client"
	"github.com/tabuladb/tabula/internal/keyspace"
)

// clPartIndex returns the index (position in the table) of the partition
// of m holding key.
func clPartIndex(m *api.PartitionMap, key []byte) (int, error) {
	h := keyspace.Hash(key)
	for _, p := range m.GetPartitions() {
		if p.GetStart() <= h && h <= p.GetEnd() {
			return int(p.GetIndex()), nil
		}
	}
	return 0, fmt.Errorf("no partition holds hash %016x of %q", h, key)
}

// clAckWatch records, per partition index, the first acknowledged write
// that started after the watch was armed. Safe for concurrent use.
type clAckWatch struct {
	mu    sync.Mutex
	since time.Time
	want  map[int]bool
	first map[int]time.Time
	done  chan struct{}
}

func newClAckWatch() *clAckWatch { return &clAckWatch{} }

// arm starts a watch of parts from since; the returned channel closes
// when every one of them has a write acknowledged.
func (w *clAckWatch) arm(since time.Time, parts []int) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.since, w.want, w.first, w.done = since, map[int]bool{}, map[int]time.Time{}, make(chan struct{})
	for _, p := range parts {
		w.want[p] = true
	}
	if len(parts) == 0 {
		close(w.done)
	}
	return w.done
}

// ack reports a write to partition part, started at started, acknowledged now.
func (w *clAckWatch) ack(part int, started time.Time) {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.want == nil || !w.want[part] || !started.After(w.since) {
		return
	}
	if _, ok := w.first[part]; ok {
		return
	}
	w.first[part] = now
	if len(w.first) == len(w.want) {
		close(w.done)
	}
}

// results returns the first-ack times so far and disarms the watch.
func (w *clAckWatch) results() map[int]time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	r := w.first
	w.want, w.first = nil, nil
	return r
}

// clKeyState is what the read-back check needs about one key; each key is
// written by one goroutine only, in order, so its state needs no lock
// until the writers have stopped.
type clKeyState struct {
	key       []byte
	part      int
	lastAcked uint64 // seq of the last acknowledged write; 0: none
	attempted uint64 // highest seq sent (acknowledged or not)
}

// holds reports whether a read of the key (found, v) keeps its last
// acknowledged write: v is that write's value, or the value of a later
// write whose outcome was unknown to the writer (it timed out or failed
// after being sent, so it may have been applied).
func (s *clKeyState) holds(found bool, v []byte) bool {
	seq, ok := clFoSeq(s.key, v)
	return found && ok && seq >= s.lastAcked && seq <= s.attempted
}

// clFoValue is the value written as seq to key: the key and seq, padded.
func clFoValue(buf, key []byte, seq uint64, size int) []byte {
	buf = append(buf[:0], key...)
	buf = append(buf, '|')
	buf = strconv.AppendUint(buf, seq, 10)
	buf = append(buf, '|')
	for len(buf) < size {
		buf = append(buf, '.')
	}
	return buf
}

// clFoSeq parses a value written by clFoValue for key.
func clFoSeq(key, v []byte) (uint64, bool) {
	rest, ok := bytes.CutPrefix(v, append(slices.Clip(key), '|'))
	if !ok {
		return 0, false
	}
	s, _, ok := bytes.Cut(rest, []byte{'|'})
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(string(s), 10, 64)
	return n, err == nil
}

// clWriter writes its keys in a loop with a per-write deadline, recording
// per key what was sent and acknowledged, and telling watch of each ack.
type clWriter struct {
	keys    []*clKeyState
	seq     uint64
	acked   int64
	failed  int64
	lastErr error
}

func (w *clWriter) run(ctx context.Context, tbl *client.Table, rng *rand.Rand, watch *clAckWatch, valueSize int, opTimeout time.Duration, stop <-chan struct{}) {
	var buf []byte
	for {
		select {
		case <-stop:
			return
		default:
		}
		if ctx.Err() != nil {
			return
		}
		k := w.keys[rng.IntN(len(w.keys))]
		w.seq++
		k.attempted = w.seq
		buf = clFoValue(buf, k.key, w.seq, valueSize)
		t0 := time.Now()
		wctx, cancel := context.WithTimeout(ctx, opTimeout)
		err := tbl.Put(wctx, k.key, buf)
		cancel()
		if err != nil {
			w.failed++
			w.lastErr = err
			continue
		}
		k.lastAcked = w.seq
		w.acked++
		watch.ack(k.part, t0)
	}
}

// clFailover kills a server hosting primaries cfg.kills times while
// writers run, timing each of its partitions from the kill to the first
// acknowledged write that started after the kill; then reads every key
// back.
func clFailover(ctx context.Context, out io.Writer, tab *clTabula, keys [][]byte, cfg *clConfig) error {
	m, err := tab.waitPlaced(ctx, tab.tableName, 30*time.Second)
	if err != nil {
		return err
	}
	nParts := len(m.GetPartitions())
	restartNow := cfg.restart == "immediate" || (cfg.restart == "auto" && tab.replicas == 1)

	// Writers own keys i ≡ g (mod goroutines) of the key set; one probe
	// writer per partition owns 32 keys of that partition, so every
	// partition is written continuously however the writers are blocked.
	states := make([]*clKeyState, 0, len(keys))
	writers := make([]*clWriter, cfg.goroutines, cfg.goroutines+nParts)
	for g := range writers {
		writers[g] = &clWriter{}
	}
	for i, k := range keys {
		p, err := clPartIndex(m, k)
		if err != nil {
			return err
		}
		s := &clKeyState{key: k, part: p}
		states = append(states, s)
		writers[i%cfg.goroutines].keys = append(writers[i%cfg.goroutines].keys, s)
	}
	probes := make([]*clWriter, nParts)
	for p := range probes {
		probes[p] = &clWriter{}
	}
	for n := 0; ; n++ {
		k := fmt.Appendf(nil, "probe-%07d", n)
		p, err := clPartIndex(m, k)
		if err != nil {
			return err
		}
		if len(probes[p].keys) < 32 {
			s := &clKeyState{key: k, part: p}
			states = append(states, s)
			probes[p].keys = append(probes[p].keys, s)
		}
		full := true
		for _, pr := range probes {
			full = full && len(pr.keys) == 32
		}
		if full {
			break
		}
	}
	writers = append(writers, probes...)

	watch := newClAckWatch()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.run(ctx, tab.tbl, rand.New(rand.NewPCG(cfg.seed, 1000+uint64(i))), watch, cfg.valueSize, cfg.opTimeout, stop)
		}()
	}
	stopWriters := sync.OnceFunc(func() {
		close(stop)
		wg.Wait()
	})
	defer stopWriters()

	allParts := make([]int, nParts)
	for i := range allParts {
		allParts[i] = i
	}
	// settle waits until every partition has its replicas placed and has
	// acknowledged a write that started after now.
	settle := func(what string) error {
		t0 := time.Now()
		done := watch.arm(t0, allParts)
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(60 * time.Second):
			missing := []int{}
			got := watch.results()
			for _, p := range allParts {
				if _, ok := got[p]; !ok {
					missing = append(missing, p)
				}
			}
			return fmt.Errorf("%s: partitions %v took no write within 60 s", what, missing)
		}
		watch.results()
		_, err := tab.waitPlaced(ctx, tab.tableName, 60*time.Second)
		return err
	}
	if err := settle("before the first kill"); err != nil {
		return err
	}
	select { // steady load before the first kill
	case <-time.After(cfg.killInterval):
	case <-ctx.Done():
		return ctx.Err()
	}
	fmt.Fprintf(out, "# failover: %d writers on the %d keys + 1 probe writer per partition (32 keys each), %v per write; %d kill -9s of a server hosting primaries, restart %s (same data dir and port), wait until every partition takes writes again, then %v of steady load before the next kill\n",
		cfg.goroutines, len(keys), cfg.opTimeout, cfg.kills, map[bool]string{true: "as soon as it is gone", false: "once its partitions were writable (or the failover timeout passed)"}[restartNow], cfg.killInterval)
	if tab.singleCopy {
		fmt.Fprintln(out, "note: 1 replica: a killed server's partitions wait for its restart, so failover time here is restart time (process start, registration, the client reconnecting)")
	}

	t0 := time.Now()
	var (
		times      []float64 // ms, one per partition per kill
		failures   int
		restartMs  []float64
		settleFail int
	)
	for k := 0; k < cfg.kills; k++ {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		m, err := tab.freshMap(ctx, tab.tableName)
		if err != nil {
			return err
		}
		ids, err := tab.serverIDs(ctx)
		if err != nil {
			return err
		}
		primaries := map[string][]int{} // server id -> partition indexes it is primary of
		for _, p := range m.GetPartitions() {
			primaries[clPrimary(p)] = append(primaries[clPrimary(p)], int(p.GetIndex()))
		}
		// The k-th kill takes the next server, in fd order, hosting a primary.
		victim := -1
		for j := range tab.servers {
			i := (k + j) % len(tab.servers)
			if len(primaries[ids[fmt.Sprintf("fd-%d", i)]]) > 0 {
				victim = i
				break
			}
		}
		if victim < 0 {
			return errors.New("failover: no live server hosts a primary")
		}
		vid := ids[fmt.Sprintf("fd-%d", victim)]
		parts := primaries[vid]
		proc := tab.servers[victim]

		tKill := time.Now()
		done := watch.arm(tKill, parts)
		proc.kill()
		var tRegistered time.Time
		restart := func() error {
			if err := proc.restart(); err != nil {
				return err
			}
			if err := proc.waitLog(ctx, "registered with master", 60*time.Second); err != nil {
				return err
			}
			tRegistered = time.Now()
			return nil
		}
		if restartNow {
			if err := restart(); err != nil {
				return fmt.Errorf("kill %d: restart fd-%d: %w", k+1, victim, err)
			}
		}
		select {
		case <-done:
		case <-time.After(time.Until(tKill.Add(cfg.failoverTimeout))):
		case <-ctx.Done():
			return ctx.Err()
		}
		got := watch.results()
		var line []string
		for _, p := range parts {
			t, ok := got[p]
			if !ok {
				failures++
				line = append(line, fmt.Sprintf("p%d=FAILED", p))
				fmt.Fprintf(out, "note: failover kill %d: partition %d (primary on fd-%d) took no acknowledged write within %v\n", k+1, p, victim, cfg.failoverTimeout)
				continue
			}
			ms := float64(t.Sub(tKill)) / 1e6
			times = append(times, ms)
			line = append(line, fmt.Sprintf("p%d=%.0f", p, ms))
		}
		if !restartNow {
			if err := restart(); err != nil {
				return fmt.Errorf("kill %d: restart fd-%d: %w", k+1, victim, err)
			}
		}
		rms := float64(tRegistered.Sub(tKill)) / 1e6
		restartMs = append(restartMs, rms)
		fmt.Fprintf(out, "raw failover-kill %d server fd-%d (%s) primaries %d ms %v restart-registered-ms %.0f\n", k+1, victim, vid, len(parts), line, rms)
		fmt.Fprintf(os.Stderr, "cluster: failover kill %d/%d fd-%d: %v\n", k+1, cfg.kills, victim, line)
		if err := settle(fmt.Sprintf("after kill %d", k+1)); err != nil {
			settleFail++
			fmt.Fprintf(out, "note: the cluster did not settle after kill %d: %v\n", k+1, err)
			if settleFail >= 3 {
				return fmt.Errorf("failover: the cluster did not settle 3 times: %w", err)
			}
			continue
		}
		settleFail = 0
		// Steady load before the next kill, so every kill hits a
		// cluster under its full write load.
		select {
		case <-time.After(cfg.killInterval):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	stopWriters()
	elapsed := time.Since(t0)
	var acked, failed int64
	var lastErr error
	for _, w := range writers {
		acked += w.acked
		failed += w.failed
		if w.lastErr != nil {
			lastErr = w.lastErr
		}
	}
	fmt.Fprintf(out, "raw failover-run %v: %d writes acknowledged (%.0f/s), %d failed or timed out (last error: %v)\n", elapsed.Round(time.Millisecond), acked, float64(acked)/elapsed.Seconds(), failed, lastErr)
	fmt.Fprintf(out, "raw failover-restart-registered median %.0f ms max %.0f ms\n", medianF(restartMs), slices.Max(append(restartMs, 0)))
	sort.Float64s(times)
	if len(times) > 0 {
		q := func(p float64) float64 { return times[int(float64(len(times)-1)*p+0.5)] }
		fmt.Fprintf(out, "raw failover %d partition failovers over %d kills: p50 %.0f ms p99 %.0f ms max %.0f ms\n", len(times), cfg.kills, q(0.5), q(0.99), times[len(times)-1])
		fmt.Fprintf(out, "figure failover-p50 %.0f ms\n", q(0.5))
		fmt.Fprintf(out, "figure failover-p99 %.0f ms\n", q(0.99))
	}
	fmt.Fprintf(out, "figure failover-failures %d partitions\n", failures)
	lost, err := clReadBack(ctx, out, tab, states)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "figure acked-writes-lost %d\n", lost)
	return nil
}

// clReadBack reads every key written in the failover run and counts the
// acknowledged writes that are gone: a key must hold its last
// acknowledged value or the value of a later write whose outcome was
// unknown (timed out).
func clReadBack(ctx context.Context, out io.Writer, tab *clTabula, states []*clKeyState) (int, error) {
	var check []*clKeyState
	for _, s := range states {
		if s.lastAcked > 0 {
			check = append(check, s)
		}
	}
	lost, shown := 0, 0
	const batch = 500
	for start := 0; start < len(check); start += batch {
		part := check[start:min(start+batch, len(check))]
		ks := make([][]byte, len(part))
		for i, s := range part {
			ks[i] = s.key
		}
		rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		res, err := tab.tbl.BatchGet(rctx, ks)
		cancel()
		if err != nil {
			return 0, fmt.Errorf("read-back: %w", err)
		}
		for i, r := range res {
			s := part[i]
			if s.holds(r.Found, r.Value) {
				continue
			}
			lost++
			if shown < 10 {
				shown++
				fmt.Fprintf(out, "note: acknowledged write lost: key %s last acknowledged seq %d (highest sent %d), read found=%v value %.40q\n", s.key, s.lastAcked, s.attempted, r.Found, r.Value)
			}
		}
	}
	fmt.Fprintf(out, "raw read-back %d keys with an acknowledged write checked, %d lost\n", len(check), lost)
	return lost, nil
}

// clPausedSecondary SIGSTOPs a server that hosts secondaries but no
// primary of the table for cfg.pause under write load, and compares the
// write p99 with the steady p99 just before.
func clPausedSecondary(ctx context.Context, out io.Writer, tab *clTabula, keys [][]byte, cfg *clConfig) error {
	if tab.replicas < 2 {
		fmt.Fprintln(out, "note: paused-secondary run skipped: the table has 1 replica, so no server hosts a secondary")
		return nil
	}
	ids, err := tab.serverIDs(ctx)
	if err != nil {
		return err
	}
	// find a server with secondaries of table name and none of its primaries.
	find := func(name string) (int, error) {
		m, err := tab.waitPlaced(ctx, name, 30*time.Second)
		if err != nil {
			return -1, err
		}
		prim, sec := map[string]int{}, map[string]int{}
		for _, p := range m.GetPartitions() {
			for _, r := range p.GetReplicas() {
				if r.GetRole() == api.ReplicaRole_REPLICA_ROLE_PRIMARY {
					prim[r.GetServerId()]++
				} else {
					sec[r.GetServerId()]++
				}
			}
		}
		for i := range tab.servers {
			id := ids[fmt.Sprintf("fd-%d", i)]
			if prim[id] == 0 && sec[id] > 0 {
				return i, nil
			}
		}
		return -1, nil
	}
	name := tab.tableName
	victim, err := find(name)
	if err != nil {
		return err
	}
	if victim < 0 {
		// Every server is primary of some partition: use a one-partition
		// table, whose secondaries host no primary of it.
		name = clTable + "-pause"
		if _, err := tab.c.CreateTable(ctx, name, api.TableKind_TABLE_KIND_POINT,
			&api.TableOptions{Partitions: 1, Replication: uint32(tab.replicas), Storage: "ssd", Durability: "sync"}); err != nil {
			return fmt.Errorf("paused secondary: create %s: %w", name, err)
		}
		if victim, err = find(name); err != nil {
			return err
		}
		if victim < 0 {
			fmt.Fprintf(out, "note: paused-secondary run skipped: no server hosts only secondaries of %s\n", name)
			return nil
		}
	}
	tbl := tab.c.Table(name)
	put := func(ctx context.Context, rng *rand.Rand, val []byte) error {
		clPutValue(rng, val)
		return tbl.Put(ctx, keys[rng.IntN(len(keys))], val)
	}
	// warm-up, untimed
	if _, err := clRun(ctx, cfg.goroutines, cfg.valueSize, time.Second, cfg.seed+7, put); err != nil {
		return fmt.Errorf("paused secondary warm-up: %w", err)
	}
	steady, err := clRun(ctx, cfg.goroutines, cfg.valueSize, cfg.pause, cfg.seed+8, put)
	if err != nil {
		return fmt.Errorf("paused secondary steady run: %w", err)
	}
	proc := tab.servers[victim]
	if err := proc.signal(syscall.SIGSTOP); err != nil {
		return err
	}
	paused, err := clRun(ctx, cfg.goroutines, cfg.valueSize, cfg.pause, cfg.seed+9, put)
	if cerr := proc.signal(syscall.SIGCONT); cerr != nil {
		err = errors.Join(err, cerr)
	}
	if err != nil {
		return fmt.Errorf("paused secondary run (fd-%d stopped): %w", victim, err)
	}
	sp99, pp99 := steady.hist.ValueAtQuantile(99), paused.hist.ValueAtQuantile(99)
	fmt.Fprintf(out, "raw paused-secondary table %s server fd-%d stopped %v: steady %.0f ops/s p50 %d us p99 %d us; paused %.0f ops/s p50 %d us p99 %d us\n",
		name, victim, cfg.pause, steady.opsPerS(), steady.hist.ValueAtQuantile(50), sp99, paused.opsPerS(), paused.hist.ValueAtQuantile(50), pp99)
	fmt.Fprintf(out, "figure paused-secondary-write-p99 %d us\n", pp99)
	fmt.Fprintf(out, "figure steady-write-p99 %d us\n", sp99)
	fmt.Fprintf(out, "figure paused-secondary-write-p99-ratio %.2f\n", float64(pp99)/float64(sp99))
	_, err = tab.waitPlaced(ctx, name, 30*time.Second)
	return err
}

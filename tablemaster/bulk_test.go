package tablemaster

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/tabuladb/tabula/api"
	"github.com/tabuladb/tabula/replication/stream"
)

const bulkKind = api.TableKind_TABLE_KIND_BULK

// bulkState has table default/b (bulk, 3 partitions, retention 2) on
// three servers (extent nodes: a stream's extent needs 3).
func bulkState(t *testing.T) *State {
	s := NewState()
	mustApply(t, s,
		Command{Payload: CreateTenant{Tenant: "default"}},
		register("", "h1:1", "a"),
		register("", "h2:1", "b"),
		register("", "h3:1", "c"),
		Command{Payload: CreateTable{Tenant: "default", Table: "b", Kind: bulkKind, Options: &TableOptions{Partitions: 3}}},
	)
	return s
}

func files(n int, seed uint32) []BulkFile {
	out := make([]BulkFile, n)
	for i := range out {
		out[i] = BulkFile{Size: uint64(100 + i), CRC: seed*10 + uint32(i), Records: 10}
	}
	return out
}

func publish(v, base uint64, fs []BulkFile) Command {
	return Command{UnixMs: 5, Payload: BulkPublish{Tenant: "default", Table: "b", Version: v, BaseVersion: base, Files: fs}}
}

// writeStream makes stream name as a publisher leaves it: one extent of
// length bytes, sealed when sealed.
func writeStream(t *testing.T, s *State, name string, length int64, sealed bool) {
	t.Helper()
	mustApply(t, s, Command{Payload: StreamCommand{StreamCmd: &stream.Command{Op: stream.OpCreateStream, Stream: name}}})
	res := mustApply(t, s, Command{Payload: StreamCommand{StreamCmd: &stream.Command{Op: stream.OpAllocate, Stream: name}}})
	if sealed {
		mustApply(t, s, Command{Payload: StreamCommand{StreamCmd: &stream.Command{Op: stream.OpSeal, Extent: res.Stream.Extent, Length: length}}})
	}
}

func stored(v uint64, i int, name string) Command {
	return Command{UnixMs: 8, Payload: BulkStored{Tenant: "default", Table: "b", Version: v, PartitionID: uint64(i), Stream: name}}
}

// storeAll writes and records the stream of every file of version v.
func storeAll(t *testing.T, s *State, v uint64) {
	t.Helper()
	tb := s.Tables["default/b"]
	for i := range tb.Partitions {
		name := BulkStreamName(tb.ID, v, i)
		writeStream(t, s, name, 1000, true)
		mustApply(t, s, stored(v, i, name))
	}
}

func hasStream(s *State, name string) bool {
	_, _, err := s.StreamManager().Stream(name)
	return err == nil
}

// loadAll stores version v's files and reports them loaded by every copy
// told to hold them, row after row, as servers do.
func loadAll(t *testing.T, s *State, v uint64, fs []BulkFile) {
	t.Helper()
	storeAll(t, s, v)
	reportHeld(t, s, v, fs)
}

// drainClock is the time of the OpBulkAdvance commands reportHeld applies:
// later every time, past every drain (bulkDrainMs) begun before.
var drainClock int64 = 1 << 40

// reportHeld reports version v loaded by every copy that holds it, and
// lets the replaced copies drain, until nothing changes (a rollout's rows:
// each switch assigns the next once the replaced row has drained).
func reportHeld(t *testing.T, s *State, v uint64, fs []BulkFile) {
	t.Helper()
	for range 20 {
		drainClock += 2 * bulkDrainMs
		res := mustApply(t, s, Command{UnixMs: drainClock, Payload: BulkAdvance{Tenant: "default", Table: "b"}})
		changed := res.Changed
		tb := s.Tables["default/b"]
		for i, p := range tb.Partitions {
			for k := range p.Replicas {
				// Every version the copy holds (a delta's base too).
				for _, x := range tb.copyHolds(i, &p.Replicas[k]) {
					f := fs[i]
					if x != v {
						f = tb.Bulk.Versions[tb.Bulk.version(x)].Files[i]
						f.Stream = ""
					}
					res := mustApply(t, s, Command{UnixMs: 9, Payload: BulkLoaded{Tenant: "default", Table: "b", Version: x, PartitionID: p.ID, ServerID: p.Replicas[k].ServerID, File: &f}})
					changed = changed || res.Changed
				}
			}
		}
		if !changed {
			return
		}
	}
	t.Fatalf("version %d: reports still change the state after 20 rounds", v)
}

func versions(s *State) (cur uint64, vs []uint64, states []string) {
	b := s.Tables["default/b"].Bulk
	for _, v := range b.Versions {
		vs = append(vs, v.Version)
		states = append(states, v.State)
	}
	return b.Current, vs, states
}

func TestBulkPublishSwitchRetain(t *testing.T) {
	s := bulkState(t)
	f1 := files(3, 1)
	mustApply(t, s, publish(1, 0, f1))
	if cur, vs, st := versions(s); cur != 0 || !slices.Equal(vs, []uint64{1}) || st[0] != BulkLoading {
		t.Fatalf("after publish: current %d versions %v %v", cur, vs, st)
	}
	// Partial load: not switched; a wrong file is refused; a repeated
	// report changes nothing.
	tb := s.Tables["default/b"]
	p0 := tb.Partitions[0]
	mustApply(t, s, Command{Payload: BulkLoaded{Tenant: "default", Table: "b", Version: 1, PartitionID: p0.ID, ServerID: p0.Replicas[0].ServerID, File: &f1[0]}})
	if res := mustApply(t, s, Command{Payload: BulkLoaded{Tenant: "default", Table: "b", Version: 1, PartitionID: p0.ID, ServerID: p0.Replicas[0].ServerID, File: &f1[0]}}); res.Changed {
		t.Fatal("repeated load report changed the state")
	}
	if _, err := s.Apply(Command{Payload: BulkLoaded{Tenant: "default", Table: "b", Version: 1, PartitionID: p0.ID, ServerID: p0.Replicas[0].ServerID, File: &f1[1]}}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("mismatched file: %v", err)
	}
	// A report from a server that does not host the partition is ignored.
	other := "srv-1"
	if p0.Replicas[0].ServerID == other {
		other = "srv-2"
	}
	if res := mustApply(t, s, Command{Payload: BulkLoaded{Tenant: "default", Table: "b", Version: 1, PartitionID: tb.Partitions[1].ID, ServerID: "srv-9", File: &f1[1]}}); res.Changed {
		t.Fatal("report of a non-host changed the state")
	}
	if cur, _, _ := versions(s); cur != 0 {
		t.Fatalf("switched before every partition loaded: %d", cur)
	}
	before := s.Version
	loadAll(t, s, 1, f1)
	if cur, vs, st := versions(s); cur != 1 || !slices.Equal(vs, []uint64{1}) || st[0] != BulkServing {
		t.Fatalf("after load: current %d versions %v %v", cur, vs, st)
	}
	if s.Version <= before {
		t.Fatal("switch did not bump the map version")
	}
	// Versions 2 and 3: retention 2 keeps the serving one and one more.
	f2, f3 := files(3, 2), files(3, 3)
	mustApply(t, s, publish(2, 0, f2))
	loadAll(t, s, 2, f2)
	mustApply(t, s, publish(3, 0, f3))
	if cur, vs, _ := versions(s); cur != 2 || !slices.Equal(vs, []uint64{1, 2, 3}) {
		t.Fatalf("while 3 loads: current %d versions %v", cur, vs)
	}
	loadAll(t, s, 3, f3)
	if cur, vs, st := versions(s); cur != 3 || !slices.Equal(vs, []uint64{2, 3}) || !slices.Equal(st, []string{BulkReady, BulkServing}) {
		t.Fatalf("after 3: current %d versions %v %v", cur, vs, st)
	}
	// Rollback to 2 (rolled out again from its streams), then forward
	// to 3; 1 is gone.
	mustApply(t, s, Command{Payload: BulkRollback{Tenant: "default", Table: "b", Version: 2}})
	reportHeld(t, s, 2, f2)
	if cur, vs, _ := versions(s); cur != 2 || !slices.Equal(vs, []uint64{2, 3}) {
		t.Fatalf("after rollback: current %d versions %v", cur, vs)
	}
	if _, err := s.Apply(Command{Payload: BulkRollback{Tenant: "default", Table: "b", Version: 1}}); api.CodeOf(err) != api.ErrorCode_ERROR_CODE_NOT_FOUND {
		t.Fatalf("rollback to unloaded version: %v", err)
	}
	mustApply(t, s, Command{Payload: BulkRollback{Tenant: "default", Table: "b", Version: 3}})
	reportHeld(t, s, 3, f3)

	// Publishing an old number, or the same number with other files, is
	// refused; the same files again are a no-op.
	if _, err := s.Apply(publish(2, 0, f3)); api.CodeOf(err) != api.ErrorCode_ERROR_CODE_ALREADY_EXISTS {
		t.Fatalf("republish 2 with other files: %v", err)
	}
	if _, err := s.Apply(publish(1, 0, f1)); api.CodeOf(err) != api.ErrorCode_ERROR_CODE_ALREADY_EXISTS {
		t.Fatalf("publish of a retired number: %v", err)
	}
	if res := mustApply(t, s, publish(3, 0, f3)); res.Changed {
		t.Fatal("same publish again changed the state")
	}
	if _, err := s.Apply(publish(4, 0, files(2, 4))); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("wrong file count: %v", err)
	}
	if _, err := s.Apply(publish(4, 9, files(3, 4))); api.DetailOf(err).GetReason() != "base_not_retained" {
		t.Fatalf("delta of a missing base: %v", err)
	}
	_ = other
}

func TestBulkDeltaKeepsBase(t *testing.T) {
	s := bulkState(t)
	f1, d2, d3 := files(3, 1), files(3, 2), files(3, 3)
	mustApply(t, s, publish(1, 0, f1))
	loadAll(t, s, 1, f1)
	mustApply(t, s, publish(2, 1, d2))
	loadAll(t, s, 2, d2)
	mustApply(t, s, publish(3, 2, d3))
	loadAll(t, s, 3, d3)
	// Retention 2 keeps 3 and 2; 2 needs 1, so 1 stays too.
	if cur, vs, _ := versions(s); cur != 3 || !slices.Equal(vs, []uint64{1, 2, 3}) {
		t.Fatalf("delta chain: current %d versions %v", cur, vs)
	}
	f4 := files(3, 4)
	mustApply(t, s, publish(4, 0, f4))
	loadAll(t, s, 4, f4)
	if cur, vs, _ := versions(s); cur != 4 || !slices.Equal(vs, []uint64{1, 2, 3, 4}) {
		t.Fatalf("full after deltas: current %d versions %v", cur, vs)
	}
	f5 := files(3, 5)
	mustApply(t, s, publish(5, 0, f5))
	loadAll(t, s, 5, f5)
	if cur, vs, _ := versions(s); cur != 5 || !slices.Equal(vs, []uint64{4, 5}) {
		t.Fatalf("second full: current %d versions %v", cur, vs)
	}
}

func TestBulkAbandonAndMove(t *testing.T) {
	s := bulkState(t)
	f1, f2, f3 := files(3, 1), files(3, 2), files(3, 3)
	mustApply(t, s, publish(1, 0, f1))
	loadAll(t, s, 1, f1)
	mustApply(t, s, publish(2, 0, f2))
	mustApply(t, s, publish(3, 0, f3)) // abandons 2
	if _, vs, _ := versions(s); !slices.Equal(vs, []uint64{1, 3}) {
		t.Fatalf("abandon: versions %v", vs)
	}
	// A report for the abandoned version is ignored.
	p := s.Tables["default/b"].Partitions[0]
	if res := mustApply(t, s, Command{Payload: BulkLoaded{Tenant: "default", Table: "b", Version: 2, PartitionID: p.ID, ServerID: p.Replicas[0].ServerID, File: &f2[0]}}); res.Changed {
		t.Fatal("abandoned version's report changed the state")
	}
	// A partition that moves (forced off a dead server) no longer counts
	// as loaded there; its new copy loads the serving version, and serves
	// once it reports it.
	loadAll(t, s, 3, f3)
	host := s.Tables["default/b"].Partitions[0].Replicas[0].ServerID
	mustApply(t, s, Command{UnixMs: 10, Payload: ServerDown{ServerID: host}})
	mustApply(t, s, Command{UnixMs: 11, Payload: ServerDown{ServerID: host, Force: true}})
	tb := s.Tables["default/b"]
	if n := tb.BulkLoadedCount(&tb.Bulk.Versions[1]); n == 3 {
		t.Fatalf("version 3 counts loaded on %d partitions after a move", n)
	}
	if r := tb.Partitions[0].Replicas[0]; r.ServerID == host || tb.copyServes(&r) != 0 || tb.copyNext(&r) != 3 {
		t.Fatalf("the moved partition's new copy: %+v, serves %d, loads %d", r, tb.copyServes(&r), tb.copyNext(&r))
	}
	reportHeld(t, s, 3, f3)
	tb = s.Tables["default/b"]
	if r := tb.Partitions[0].Replicas[0]; r.BulkServes != 3 {
		t.Fatalf("the new copy does not serve version 3 once loaded: %+v", r)
	}
	// Rollback to 1 rolls it out again from its streams.
	mustApply(t, s, Command{Payload: BulkRollback{Tenant: "default", Table: "b", Version: 1}})
	if ro := s.Tables["default/b"].Bulk.Rollout; ro == nil || ro.Version != 1 || ro.From != 3 {
		t.Fatalf("rollback's rollout: %+v", ro)
	}
	// Not a bulk table.
	mustApply(t, s, createTable("default", "p", 2))
	if _, err := s.Apply(Command{Payload: BulkPublish{Tenant: "default", Table: "p", Version: 1, Files: files(2, 1)}}); api.CodeOf(err) != api.ErrorCode_ERROR_CODE_WRONG_KIND {
		t.Fatalf("publish to a point table: %v", err)
	}
	// The state round-trips through Clone.
	c := s.Clone()
	cv := &c.Tables["default/b"].Bulk.Versions[0]
	cv.addLoaded(0, 3, "x")
	if s.Tables["default/b"].Bulk.Versions[0].loadedBy(0, "x") {
		t.Fatal("Clone shares bulk state")
	}
}

// TestBulkStored: a version switches only once every file is both loaded
// and stored in its sealed stream; bad records are refused and change
// nothing; retention, abandonment and drop delete the streams.
func TestBulkStored(t *testing.T) {
	s := bulkState(t)
	tb := s.Tables["default/b"]
	f1 := files(3, 1)
	mustApply(t, s, publish(1, 0, f1))
	for i, p := range tb.Partitions {
		mustApply(t, s, Command{Payload: BulkLoaded{Tenant: "default", Table: "b", Version: 1, PartitionID: p.ID, ServerID: s.Tables["default/b"].Partitions[i].Replicas[0].ServerID, File: &f1[i]}})
	}
	if cur, _, _ := versions(s); cur != 0 {
		t.Fatal("switched with no file stored")
	}
	name0 := BulkStreamName(tb.ID, 1, 0)
	// Refused: no such stream; another name; an open extent; an empty
	// stream; a partition out of range; a version not published.
	bad := []struct {
		cmd    Command
		reason string
	}{
		{stored(1, 0, name0), "stream_missing"},
		{stored(1, 0, BulkStreamName(tb.ID, 1, 1)), "stream_name"},
		{stored(1, 0, "x"), "stream_name"},
		{stored(1, 5, BulkStreamName(tb.ID, 1, 5)), "partition_out_of_range"},
		{stored(7, 0, BulkStreamName(tb.ID, 7, 0)), "version_not_retained"},
	}
	for _, b := range bad {
		before := s.Clone()
		if _, err := s.Apply(b.cmd); api.DetailOf(err).GetReason() != b.reason {
			t.Fatalf("%+v: %v, want %s", b.cmd, err, b.reason)
		}
		if s.Tables["default/b"].Bulk.Versions[0].Files[0].Stream != "" || before.Version != s.Version {
			t.Fatal("a refused record changed the state")
		}
	}
	writeStream(t, s, name0, 0, false)
	if _, err := s.Apply(stored(1, 0, name0)); api.DetailOf(err).GetReason() != "stream_not_sealed" {
		t.Fatalf("open stream: %v", err)
	}
	mustApply(t, s, Command{Payload: StreamCommand{StreamCmd: &stream.Command{Op: stream.OpDeleteStream, Stream: name0}}})
	writeStream(t, s, name0, 0, true)
	if _, err := s.Apply(stored(1, 0, name0)); api.DetailOf(err).GetReason() != "stream_empty" {
		t.Fatalf("empty stream: %v", err)
	}
	mustApply(t, s, Command{Payload: StreamCommand{StreamCmd: &stream.Command{Op: stream.OpDeleteStream, Stream: name0}}})
	storeAll(t, s, 1)
	if cur, _, _ := versions(s); cur != 1 {
		t.Fatalf("not switched after the last file was stored: current %d", cur)
	}
	if res := mustApply(t, s, stored(1, 0, name0)); res.Changed {
		t.Fatal("a repeated record changed the state")
	}
	// The publish of the same files again keeps the records.
	if res := mustApply(t, s, publish(1, 0, f1)); res.Changed || s.Tables["default/b"].Bulk.Versions[0].Files[0].Stream != name0 {
		t.Fatal("publishing the same version again changed its records")
	}

	// Retention 2: publishing 2 and 3 drops 1 and its streams.
	f2, f3, f4, f5 := files(3, 2), files(3, 3), files(3, 4), files(3, 5)
	mustApply(t, s, publish(2, 0, f2))
	loadAll(t, s, 2, f2)
	mustApply(t, s, publish(3, 0, f3))
	loadAll(t, s, 3, f3)
	for i := range 3 {
		if hasStream(s, BulkStreamName(tb.ID, 1, i)) {
			t.Fatalf("stream of dropped version 1 partition %d still there", i)
		}
		if !hasStream(s, BulkStreamName(tb.ID, 2, i)) || !hasStream(s, BulkStreamName(tb.ID, 3, i)) {
			t.Fatal("a stream of a retained version is gone")
		}
	}
	// An abandoned version's streams go, stored or still being written.
	mustApply(t, s, publish(4, 0, f4))
	writeStream(t, s, BulkStreamName(tb.ID, 4, 0), 1000, true)
	mustApply(t, s, stored(4, 0, BulkStreamName(tb.ID, 4, 0)))
	writeStream(t, s, BulkStreamName(tb.ID, 4, 1), 0, false)
	mustApply(t, s, publish(5, 0, f5))
	if hasStream(s, BulkStreamName(tb.ID, 4, 0)) || hasStream(s, BulkStreamName(tb.ID, 4, 1)) {
		t.Fatal("streams of the abandoned version 4 are still there")
	}
	// Dropping the table drops its streams.
	mustApply(t, s, Command{Payload: DropTable{Tenant: "default", Table: "b"}})
	for _, v := range []uint64{2, 3} {
		if hasStream(s, BulkStreamName(tb.ID, v, 0)) {
			t.Fatalf("stream of version %d of a dropped table is still there", v)
		}
	}
}

// TestBulkPartitionsMove: a bulk partition whose versions are all stored
// moves off a dead server at once (its new server fetches the files); one
// with a version only on its server's disk waits for it.
func TestBulkPartitionsMove(t *testing.T) {
	s := bulkState(t)
	f1 := files(3, 1)
	mustApply(t, s, publish(1, 0, f1))
	loadAll(t, s, 1, f1)
	tb := s.Tables["default/b"]
	host := tb.Partitions[0].Replicas[0].ServerID
	res := mustApply(t, s, Command{UnixMs: 10, Payload: ServerDown{ServerID: host}})
	if len(res.Held) != 0 || len(res.Moved) == 0 {
		t.Fatalf("stored bulk partitions: moved %v held %v", res.Moved, res.Held)
	}
	tb = s.Tables["default/b"]
	for _, p := range tb.Partitions {
		if len(p.Replicas) != 1 || p.Replicas[0].ServerID == host {
			t.Fatalf("partition %d still on %s or unplaced: %+v", p.ID, host, p.Replicas)
		}
	}
	if n := tb.BulkLoadedCount(&tb.Bulk.Versions[0]); n == 3 {
		t.Fatal("moved partitions count as loaded before their new server reports")
	}
	// A draining server's bulk partitions move too.
	drained := tb.Partitions[2].Replicas[0].ServerID
	res = mustApply(t, s, Command{UnixMs: 15, Payload: ServerDown{ServerID: drained, Draining: true}})
	if len(res.Held) != 0 || !slices.Contains(res.Moved, tb.Partitions[2].ID) {
		t.Fatalf("drain: moved %v held %v", res.Moved, res.Held)
	}
	mustApply(t, s, register(host, "h9:1", "a")) // the dead one is back
	tb = s.Tables["default/b"]
	// A version with a file not in a stream (published before streams)
	// keeps its partitions with their server.
	tb.Bulk.Versions[0].Files[1].Stream = ""
	host = tb.Partitions[1].Replicas[0].ServerID
	res = mustApply(t, s, Command{UnixMs: 20, Payload: ServerDown{ServerID: host}})
	if !slices.Contains(res.Held, tb.Partitions[1].ID) {
		t.Fatalf("partition with an unstored file: moved %v held %v", res.Moved, res.Held)
	}
}

func TestBulkStreamName(t *testing.T) {
	for _, c := range []struct {
		tid, v uint64
		i      int
	}{{1, 1, 0}, {7, 1 << 63, 1023}} {
		name := BulkStreamName(c.tid, c.v, c.i)
		tid, v, i, ok := parseBulkStreamName(name)
		if !ok || tid != c.tid || v != c.v || i != c.i {
			t.Fatalf("%s parses to %d %d %d %v", name, tid, v, i, ok)
		}
	}
	for _, bad := range []string{"", "bulk/", "bulk/1/2", "bulk/1/2/3/4", "bulk/01/2/3", "bulk/a/2/3", "blk/1/2/3", "bulk/1/2/-3"} {
		if _, _, _, ok := parseBulkStreamName(bad); ok {
			t.Fatalf("%q parsed", bad)
		}
	}
}

// TestBulkWithoutStreams: with fewer than 3 fault domains no stream can be
// placed, so a version is registered without streams, switches on loads
// alone, refuses stream records, and its partitions wait for their server.
func TestBulkWithoutStreams(t *testing.T) {
	s := NewState()
	mustApply(t, s,
		Command{Payload: CreateTenant{Tenant: "default"}},
		register("", "h1:1", "a"),
		register("", "h2:1", "b"),
		Command{Payload: CreateTable{Tenant: "default", Table: "b", Kind: bulkKind, Options: &TableOptions{Partitions: 3}}},
	)
	f1 := files(3, 1)
	mustApply(t, s, publish(1, 0, f1))
	tb := s.Tables["default/b"]
	if tb.Bulk.Versions[0].Streams {
		t.Fatal("version registered with streams on 2 fault domains")
	}
	if _, err := s.Apply(stored(1, 0, BulkStreamName(tb.ID, 1, 0))); api.DetailOf(err).GetReason() != "version_without_streams" {
		t.Fatalf("store of a version without streams: %v", err)
	}
	for i, p := range tb.Partitions {
		mustApply(t, s, Command{Payload: BulkLoaded{Tenant: "default", Table: "b", Version: 1, PartitionID: p.ID, ServerID: p.Replicas[0].ServerID, File: &f1[i]}})
	}
	if cur, _, _ := versions(s); cur != 1 {
		t.Fatalf("version without streams did not switch on its loads: current %d", cur)
	}
	host := tb.Partitions[0].Replicas[0].ServerID
	res := mustApply(t, s, Command{UnixMs: 10, Payload: ServerDown{ServerID: host}})
	if !slices.Contains(res.Held, tb.Partitions[0].ID) {
		t.Fatalf("partition with its only file on its server moved: moved %v held %v", res.Moved, res.Held)
	}
}

// TestBulkRefusedFile: a server's report that the fetched file does not
// verify becomes the loading version's error (once); it is ignored for a
// version that already switched and from a server not hosting the
// partition.
func TestBulkRefusedFile(t *testing.T) {
	s := bulkState(t)
	f1, f2 := files(3, 1), files(3, 2)
	mustApply(t, s, publish(1, 0, f1))
	loadAll(t, s, 1, f1)
	mustApply(t, s, publish(2, 0, f2))
	tb := s.Tables["default/b"]
	p := tb.Partitions[1]
	refuse := func(v uint64, server string) Command {
		return Command{Payload: BulkLoaded{Tenant: "default", Table: "b", Version: v, PartitionID: p.ID, ServerID: server, File: &f2[1], Error: "verify: corrupt"}}
	}
	if res := mustApply(t, s, refuse(2, "srv-9")); res.Changed {
		t.Fatal("a refusal from a server not hosting the partition was recorded")
	}
	if res := mustApply(t, s, refuse(1, p.Replicas[0].ServerID)); res.Changed {
		t.Fatal("a refusal of a serving version was recorded")
	}
	mustApply(t, s, refuse(2, p.Replicas[0].ServerID))
	v := s.Tables["default/b"].Bulk.Versions[1]
	if v.Version != 2 || v.Error == "" || !strings.Contains(v.Error, "corrupt") {
		t.Fatalf("refusal not recorded: %+v", v)
	}
	if info := s.Tables["default/b"].BulkInfoProto(false); info.GetVersions()[1].GetError() != v.Error {
		t.Fatal("the error is not in the version's status")
	}
	if res := mustApply(t, s, refuse(2, p.Replicas[0].ServerID)); res.Changed {
		t.Fatal("a second refusal changed the state")
	}
	// The loads of the other partitions do not switch to it: 1 stays.
	loadAll(t, s, 2, f2)
	if cur, _, _ := versions(s); cur != 1 {
		t.Fatalf("switched to a version a server refused: current %d", cur)
	}
}

// TestStrayBulkStreams: streams written for a version after it was dropped,
// or for a dropped table, are stray; those of loading or retained versions,
// of versions not published yet and other streams are not.
func TestStrayBulkStreams(t *testing.T) {
	s := bulkState(t)
	tb := s.Tables["default/b"]
	f1, f2 := files(3, 1), files(3, 2)
	mustApply(t, s, publish(1, 0, f1))
	loadAll(t, s, 1, f1)
	mustApply(t, s, publish(2, 0, f2))          // loading
	mustApply(t, s, publish(3, 0, files(3, 3))) // abandons 2
	late := BulkStreamName(tb.ID, 2, 0)         // a publisher of 2 still writing
	writeStream(t, s, late, 10, false)
	writeStream(t, s, BulkStreamName(tb.ID, 3, 0), 10, false) // loading: kept
	writeStream(t, s, BulkStreamName(tb.ID, 9, 0), 10, false) // not published yet: kept
	writeStream(t, s, BulkStreamName(tb.ID, 1, 7), 10, false) // no partition 7
	writeStream(t, s, "logs/p1", 10, false)
	mustApply(t, s, Command{Payload: CreateTable{Tenant: "default", Table: "gone", Kind: bulkKind, Options: &TableOptions{Partitions: 1}}})
	gone := s.Tables["default/gone"]
	mustApply(t, s, Command{Payload: DropTable{Tenant: "default", Table: "gone"}})
	dropped := BulkStreamName(gone.ID, 1, 0)
	writeStream(t, s, dropped, 10, false)
	got := s.StrayBulkStreams()
	want := []string{BulkStreamName(tb.ID, 1, 7), late, dropped}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("stray: %v, want %v", got, want)
	}
}

// FuzzBulkStreamName: parseBulkStreamName accepts exactly the names
// BulkStreamName makes, and never panics.
func FuzzBulkStreamName(f *testing.F) {
	for _, s := range []string{"bulk/1/2/3", "bulk/18446744073709551615/1/0", "bulk/1/2", "bulk//2/3", "bulk/1/2/03", "logs/x", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		tid, v, i, ok := parseBulkStreamName(name)
		if ok && BulkStreamName(tid, v, i) != name {
			t.Fatalf("%q parsed to %d %d %d, which names %q", name, tid, v, i, BulkStreamName(tid, v, i))
		}
	})
}

// TestBulkCopiesSurviveReplay: a bulk table's serving copies are what its
// logged OpCreateTable says on replay (a restart, a raft follower), not
// one: the logged form once forced bulk tables to a single copy.
func TestBulkCopiesSurviveReplay(t *testing.T) {
	s := NewState()
	var logged []Command
	for _, c := range []Command{
		{Payload: CreateTenant{Tenant: "default"}},
		register("", "h1:1", "a"), register("", "h2:1", "b"), register("", "h3:1", "c"),
		{Payload: CreateTable{Tenant: "default", Table: "b", Kind: bulkKind, Options: &TableOptions{Partitions: 2, Replication: 3}}},
	} {
		_, lc, err := s.ApplyChecked(c)
		if err != nil {
			t.Fatal(err)
		}
		logged = append(logged, lc)
	}
	r := NewState()
	for _, c := range logged {
		if _, err := r.ApplyLogged(c); err != nil {
			t.Fatal(err)
		}
	}
	for _, st := range []*State{s, r} {
		tb := st.Tables["default/b"]
		if tb.Options.Replication != 3 || len(tb.Partitions[0].Replicas) != 3 {
			t.Fatalf("bulk table after replay: replication %d, %d copies; want 3", tb.Options.Replication, len(tb.Partitions[0].Replicas))
		}
	}
}

// TestBulkRolloutHeadroom: a rollout places the extra copy only on a
// server with room for the file (its registered bulk capacity against the
// files its copies hold); without one, the copy being replaced loads the
// version beside its own when its server has room; with no room anywhere
// the row waits, saying why, and goes on once room appears.
func TestBulkRolloutHeadroom(t *testing.T) {
	s := NewState()
	capOf := func(id string, c uint64) Command {
		return Command{Payload: RegisterServer{ServerID: id, Addr: "h-" + id + ":1", FaultDomain: "fd-" + id, BulkCapacity: c}}
	}
	// Four servers, a table of one partition with 3 copies; each file is
	// 100 bytes. The spare server (not hosting the partition) has room for
	// nothing; the copies' servers room for one file each.
	mustApply(t, s,
		Command{Payload: CreateTenant{Tenant: "default"}},
		capOf("s1", 150), capOf("s2", 150), capOf("s3", 150),
		Command{Payload: CreateTable{Tenant: "default", Table: "b", Kind: bulkKind, Options: &TableOptions{Partitions: 1, Replication: 3}}},
		capOf("s4", 50),
	)
	f1 := []BulkFile{{Size: 100, CRC: 1, Records: 1}}
	mustApply(t, s, publish(1, 0, f1))
	loadAll(t, s, 1, f1)
	if cur, _, _ := versions(s); cur != 1 {
		t.Fatalf("first version not serving: %d", cur)
	}
	// Version 2: no room for an extra copy on s4, no room beside version
	// 1 on s1..s3 (100 + 100 > 150): the row waits.
	f2 := []BulkFile{{Size: 100, CRC: 2, Records: 1}}
	mustApply(t, s, publish(2, 0, f2))
	tb := s.Tables["default/b"]
	if ro := tb.Bulk.Rollout; ro == nil || !strings.Contains(ro.Waiting, "no live server has room") {
		t.Fatalf("rollout with no room: %+v", ro)
	}
	if n := len(tb.Partitions[0].Replicas); n != 3 {
		t.Fatalf("a copy was placed without room: %d copies", n)
	}
	// s4 gets room (it registers again with more): the extra copy goes
	// there once the rollout is re-evaluated.
	mustApply(t, s, capOf("s4", 1000))
	mustApply(t, s, Command{UnixMs: 20, Payload: BulkAdvance{Tenant: "default", Table: "b"}})
	tb = s.Tables["default/b"]
	p := tb.Partitions[0]
	if len(p.Replicas) != 4 || p.Replicas[3].ServerID != "s4" || tb.copyNext(&p.Replicas[3]) != 2 {
		t.Fatalf("the extra copy is not on s4 loading 2: %+v", p.Replicas)
	}
	// The rows go on (each row's extra copy on the server the last row
	// left, which has room again) until every copy serves 2.
	loadAll(t, s, 2, f2)
	tb = s.Tables["default/b"]
	if cur, _, _ := versions(s); cur != 2 {
		t.Fatalf("version 2 did not finish rolling out: current %d, rollout %+v", cur, tb.Bulk.Rollout)
	}
	for _, r := range tb.Partitions[0].Replicas {
		if r.BulkServes != 2 {
			t.Fatalf("a copy does not serve 2: %+v", tb.Partitions[0].Replicas)
		}
	}
	// In place: a table whose servers have room only beside their own
	// version, and no spare server.
	s2 := NewState()
	mustApply(t, s2,
		Command{Payload: CreateTenant{Tenant: "default"}},
		capOf("s1", 250), capOf("s2", 250), capOf("s3", 250),
		Command{Payload: CreateTable{Tenant: "default", Table: "b", Kind: bulkKind, Options: &TableOptions{Partitions: 1, Replication: 3}}},
	)
	mustApply(t, s2, publish(1, 0, f1))
	loadAll(t, s2, 1, f1)
	mustApply(t, s2, publish(2, 0, f2))
	tb = s2.Tables["default/b"]
	beside := 0
	for _, r := range tb.Partitions[0].Replicas {
		if r.BulkServes == 1 && r.BulkNext == 2 {
			beside++
		}
	}
	if len(tb.Partitions[0].Replicas) != 3 || beside != 1 {
		t.Fatalf("no spare server: want one copy loading 2 beside 1, got %+v", tb.Partitions[0].Replicas)
	}
	loadAll(t, s2, 2, f2)
	if cur, _, _ := versions(s2); cur != 2 {
		t.Fatalf("in-place rollout did not finish: current %d, %+v", cur, s2.Tables["default/b"].Bulk.Rollout)
	}
}

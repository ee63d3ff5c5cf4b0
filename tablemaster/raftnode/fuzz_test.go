package raftnode

import (
	"testing"

	"github.com/tabuladb/tabula/engines/vfs"
	"go.etcd.io/raft/v3/raftpb"
)

// FuzzDecode feeds arbitrary bytes to every decoder of the package: the
// log file's records and their replay, the snapshot file, the snapshot
// data envelope. None may panic; an intact record must round-trip.
func FuzzDecode(f *testing.F) {
	hs, _ := (&raftpb.HardState{Term: 3, Vote: 1, Commit: 7}).Marshal()
	es, _ := appendEntries(nil, ents(1, 3, 2))
	wal := appendFileHeader(nil, walMagic)
	wal = appendRecord(wal, recSnapMark, snapMark{0, 0, markCompact}.encode())
	wal = appendRecord(wal, recEntries, es)
	wal = appendRecord(wal, recHardState, hs)
	f.Add(wal)
	f.Add(wal[:len(wal)-3])
	snap, _ := (&raftpb.Snapshot{Data: encodeSnapshotData(map[uint64]string{1: "a:1"}, []byte("sm")), Metadata: raftpb.SnapshotMetadata{Index: 4, Term: 2}}).Marshal()
	f.Add(appendRecord(appendFileHeader(nil, snapMagic), recSnapshot, snap))
	f.Add(encodeSnapshotData(map[uint64]string{1: "a:1", 2: "b:2"}, []byte("x")))
	f.Fuzz(func(t *testing.T, data []byte) {
		if body, err := checkFileHeader(data, walMagic); err == nil {
			if recs, _, err := decodeRecords(body); err == nil {
				rp := replay{}
				for _, r := range recs {
					if rp.apply(r) != nil {
						break
					}
				}
			}
		}
		_, _ = decodeSnapshotFile(data)
		_, _, _ = decodeSnapshotData(data)
		_, _ = decodeEntries(data)
		if r, n, ok := parseRecord(data); ok {
			again, m, ok2 := parseRecord(appendRecord(nil, r.typ, r.payload))
			if !ok2 || m != n || again.typ != r.typ || string(again.payload) != string(r.payload) {
				t.Fatal("record does not round-trip")
			}
		}
		// Whatever a log file holds, opening it fails cleanly or loads.
		fs := vfs.NewMem()
		if err := fs.MkdirAll("/r", 0o755); err != nil {
			t.Fatal(err)
		}
		if f, err := fs.Create("/r/" + walName(1)); err == nil {
			_, _ = f.Write(data)
			_ = f.Close()
		}
		if s, err := OpenStorage(fs, "/r", nil); err == nil {
			_ = s.Close()
		}
	})
}

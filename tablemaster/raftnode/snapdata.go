package raftnode

import (
	"encoding/binary"
	"fmt"
	"sort"
)

// Snapshot data (raftpb.Snapshot.Data) carries the member addresses beside
// the state machine's bytes, because log compaction drops the conf changes
// that named them:
//
//	| count (uvarint) | count × ( id (uvarint) | len (uvarint) | addr ) | state machine data |
//
// Integrity comes from the snapshot file's CRC32C record and, on the wire,
// from the transport.
func encodeSnapshotData(members map[uint64]string, sm []byte) []byte {
	ids := make([]uint64, 0, len(members))
	for id := range members {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	b := binary.AppendUvarint(nil, uint64(len(ids)))
	for _, id := range ids {
		b = binary.AppendUvarint(b, id)
		b = binary.AppendUvarint(b, uint64(len(members[id])))
		b = append(b, members[id]...)
	}
	return append(b, sm...)
}

func decodeSnapshotData(b []byte) (map[uint64]string, []byte, error) {
	uvarint := func() (uint64, error) {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, fmt.Errorf("%w: snapshot data: bad varint", ErrCorrupt)
		}
		b = b[n:]
		return v, nil
	}
	count, err := uvarint()
	if err != nil {
		return nil, nil, err
	}
	if count > uint64(len(b)) {
		return nil, nil, fmt.Errorf("%w: snapshot data: %d members in %d bytes", ErrCorrupt, count, len(b))
	}
	members := make(map[uint64]string, count)
	for range count {
		id, err := uvarint()
		if err != nil {
			return nil, nil, err
		}
		l, err := uvarint()
		if err != nil {
			return nil, nil, err
		}
		if l > uint64(len(b)) {
			return nil, nil, fmt.Errorf("%w: snapshot data: address of %d bytes in %d", ErrCorrupt, l, len(b))
		}
		members[id] = string(b[:l])
		b = b[l:]
	}
	return members, b, nil
}

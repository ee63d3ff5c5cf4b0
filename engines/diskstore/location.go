package diskstore

// A location names a record in the log and fits the index's 48 bits:
//
//	47              32 31  28 27                          0
//	|   slot (16)     | gen(4)|        offset (28)          |
//
// slot is the segment's slot (at most 65536 live segments), gen the slot's
// generation (bumped each time the slot gets a new segment, so a reader
// holding a location into a freed and reused slot sees a generation mismatch
// and reports "no record" instead of decoding the middle of another
// segment), offset the record's byte offset in the segment file (segments
// are at most 256 MiB). Limits: 65536 live segments (1 TiB of log at the
// default 16 MiB SegmentSize), a record or batch at most 256 MiB minus the
// segment header.
// A generation repeats only after 16 reuses of one slot; slots are reused
// first-in first-out, so that takes 16 × (free slots) segment frees during a
// single read.
const (
	offsetBits = 28
	genBits    = 4
	slotBits   = 16

	maxSegmentSize = 1 << offsetBits
	maxSlots       = 1 << slotBits
	genMask        = 1<<genBits - 1
)

func packLoc(slot uint32, gen uint8, off int64) uint64 {
	return uint64(slot)<<(offsetBits+genBits) | uint64(gen&genMask)<<offsetBits | uint64(off)
}

func unpackLoc(loc uint64) (slot uint32, gen uint8, off int64) {
	return uint32(loc >> (offsetBits + genBits) & (maxSlots - 1)),
		uint8(loc >> offsetBits & genMask),
		int64(loc & (maxSegmentSize - 1))
}

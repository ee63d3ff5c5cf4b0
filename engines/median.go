package engines

// SizeMedianer is the capability of engines that can estimate, from
// their files' metadata, the key that halves their data by bytes (the
// ordered engine: an ordered table's split point by size). Point tables
// need none: their keys hash uniformly, so the midpoint of a partition's
// hash range is the median of its data.
type SizeMedianer interface {
	// SizeMedian estimates the key k in (lo, hi) (hi nil: unbounded)
	// that splits the bytes stored in [lo, hi) in two halves, with the
	// share of them below k and how many files the estimate rests on. k
	// is nil when the files say nothing useful (too few, or no boundary
	// near the middle). It reads metadata only, no record.
	SizeMedian(lo, hi []byte) (k []byte, leftShare float64, files int, err error)
}

package bulk

import "io"

// HugePageBytes is the huge page (and page-cache folio) size the writer
// aligns to: 2 MiB on x86-64 and arm64 with 4 KiB base pages.
const HugePageBytes = 2 << 20

// HugeWriter writes a file so that the page cache can hold it in huge
// folios, which a read-only mapping advised MADV_HUGEPAGE then maps with
// huge pages: every write it issues starts at a multiple of HugePageBytes
// and is a whole number of them (except the first, up to the first
// boundary, and the last).
//
// Why: a bulk Get reads one record at a random place in a file of up to
// gigabytes. Mapped with 4 KiB pages almost every read misses the TLB, and
// on a virtual machine a TLB miss is a two-level page walk: random reads of
// a mapped 1 GiB file measured 380-480 ns with 4 KiB pages and 180-230 ns
// once the same file was mapped with 2 MiB pages (Linux 6.18, ext4, a
// 2-core VM). The kernel maps a file with huge pages only where its page
// cache holds huge folios, and a buffered write makes folios no larger
// than the write itself within one aligned 2 MiB stretch: a file written
// 1 MiB at a time (as the builder and the servers' uploads did) is never
// mapped huge, one written in aligned 2 MiB pieces is. A file read back
// from disk through such a mapping gets huge folios from readahead.
//
// HugeWriter buffers at most HugePageBytes; large aligned writes go
// straight through without a copy. It is not safe for concurrent use.
type HugeWriter struct {
	w   io.Writer
	off int64  // file offset of buf[0]
	buf []byte // cap HugePageBytes once used
	err error  // sticky
}

// NewHugeWriter returns a writer to w, whose next byte lands at file
// offset offset.
func NewHugeWriter(w io.Writer, offset int64) *HugeWriter {
	return &HugeWriter{w: w, off: offset}
}

// Offset is the file offset the next byte written lands at.
func (h *HugeWriter) Offset() int64 { return h.off + int64(len(h.buf)) }

// Buffered is how many bytes are held, not yet written to the file.
func (h *HugeWriter) Buffered() int { return len(h.buf) }

// Write buffers or writes p. An error is sticky: later writes return it.
func (h *HugeWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 && h.err == nil {
		if len(h.buf) == 0 && h.off%HugePageBytes == 0 && len(p) >= HugePageBytes {
			k := len(p) &^ (HugePageBytes - 1)
			h.write(p[:k])
			if h.err != nil {
				break
			}
			h.off += int64(k)
			n += k
			p = p[k:]
			continue
		}
		if h.buf == nil {
			h.buf = make([]byte, 0, HugePageBytes)
		}
		room := int(HugePageBytes - h.Offset()%HugePageBytes)
		k := min(room, len(p))
		h.buf = append(h.buf, p[:k]...)
		n += k
		p = p[k:]
		if k == room {
			h.Flush()
		}
	}
	return n, h.err
}

func (h *HugeWriter) write(p []byte) {
	m, err := h.w.Write(p)
	if err == nil && m < len(p) {
		err = io.ErrShortWrite
	}
	h.err = err
}

// Flush writes out what is buffered and reports the first error.
func (h *HugeWriter) Flush() error {
	if h.err != nil || len(h.buf) == 0 {
		return h.err
	}
	h.write(h.buf)
	if h.err == nil {
		h.off += int64(len(h.buf))
		h.buf = h.buf[:0]
	}
	return h.err
}

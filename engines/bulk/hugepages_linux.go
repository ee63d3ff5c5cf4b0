package bulk

import "syscall"

// allocHuge returns an n-byte buffer backed by transparent huge pages
// where the kernel allows, for memory read or written at random places:
// with 4 KiB pages nearly every access misses the TLB (measured: the
// 10M-record build's record pass took 2.5 s with a heap buffer). The record
// writer's windows and a served file's pilots and fingerprints use it.
// free releases it; the buffer must not be used after.
func allocHuge(n int) (buf []byte, free func()) {
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return make([]byte, n), func() {}
	}
	_ = syscall.Madvise(b, syscall.MADV_HUGEPAGE) // advice: without it the buffer still works
	return b, func() { _ = syscall.Munmap(b) }
}

// adviseMapping asks for huge pages on a file mapping. The kernel maps
// the file with huge pages where its page cache holds huge folios: a file
// written by HugeWriter, or read in by faults on this mapping (readahead
// then allocates huge folios). See HugeWriter for the numbers. Advice only:
// the kernel may ignore it, and an error changes nothing.
func adviseMapping(b []byte) { _ = syscall.Madvise(b, syscall.MADV_HUGEPAGE) }

package tableserver

import "syscall"

// diskSpace is the size and free bytes of the file system holding dir as
// this server can use them, as df shows them: blocks reserved for root
// (or by the mount) are neither, so size is used + available and a
// file system df shows 46% full reads 46% full here, not 80% (the
// balancer stops filling a server at 80%). Zeros when it cannot be read.
func diskSpace(dir string) (total, free uint64) {
	var st syscall.Statfs_t
	if dir == "" || syscall.Statfs(dir, &st) != nil {
		return 0, 0
	}
	used := st.Blocks - st.Bfree
	return (used + st.Bavail) * uint64(st.Bsize), st.Bavail * uint64(st.Bsize)
}

// processCPU is the user plus system CPU time of this process, in ns.
func processCPU() uint64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return uint64(ru.Utime.Nano() + ru.Stime.Nano())
}

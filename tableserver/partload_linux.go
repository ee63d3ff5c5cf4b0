package tableserver

import "syscall"

// diskSpace is the size and free bytes (for unprivileged users) of the
// file system holding dir; zeros when it cannot be read.
func diskSpace(dir string) (total, free uint64) {
	var st syscall.Statfs_t
	if dir == "" || syscall.Statfs(dir, &st) != nil {
		return 0, 0
	}
	return st.Blocks * uint64(st.Bsize), st.Bavail * uint64(st.Bsize)
}

// processCPU is the user plus system CPU time of this process, in ns.
func processCPU() uint64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return uint64(ru.Utime.Nano() + ru.Stime.Nano())
}

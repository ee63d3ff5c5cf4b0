// Package dirlock gives a process exclusive use of a data directory: two
// servers (or masters) on one directory would both believe they own its
// files and its identity. The lock is an flock(2) on a LOCK file inside the
// directory, so it dies with the process (kill -9 included) and never needs
// cleaning up.
//
// A Lock is safe for concurrent use; Unlock is idempotent.
package dirlock

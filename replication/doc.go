// Package replication is the home of the stream layer's redundancy schemes:
// how a sealed extent's bytes survive the loss of the servers that hold them.
// Each scheme is its own package; today that is replication/lrc, the Local
// Reconstruction Code that sealed extents are erasure-coded with.
// This package itself holds no code.
package replication

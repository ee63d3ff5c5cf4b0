// Package coproctest builds the coprocessor modules of this repository
// (coproc/examples/..., coproc/testdata/...) for tests, here and in the
// cluster tests of other packages. It needs the go command and the
// repository's sources.
package coproctest

// Package abi is the vocabulary shared by the coprocessor host (package
// coproc) and the guest SDK (package coproc/guest): the names of ABI v1's
// exports and imports, the status codes host functions return, and the
// encodings of the buffers they exchange. It has no dependencies so that it
// compiles for GOOS=wasip1 as well as for the host.
//
// The normative description of ABI v1 is coproc/ABI.md. Every name, code and
// layout here is part of that contract: never change or reuse one.
//
// Safe for concurrent use (pure functions over caller-owned buffers).
package abi

// Package atomicfile replaces a file durably: the one helper every package
// uses for that. WriteFile writes a temporary file beside the target, fsyncs
// it, closes it, renames it over the target and fsyncs the directory, so
// after it returns the new contents survive a crash, and a crash at any
// point leaves either the old file or the new one, never a mix.
//
// Functions are safe for concurrent use on different paths.
package atomicfile

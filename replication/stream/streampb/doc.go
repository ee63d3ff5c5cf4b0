// Package streampb is the generated protobuf and gRPC code of the extent
// node service (stream.proto). Regenerate with
// `go generate ./replication/stream/streampb`.
package streampb

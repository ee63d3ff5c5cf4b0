package streampb

// Regenerate stream.pb.go and stream_grpc.pb.go from stream.proto. Needs
// protoc on PATH (Debian: apt-get install protobuf-compiler); the plugins are
// the versions pinned by the tool directives in go.mod.
//go:generate sh -c "protoc --plugin=protoc-gen-go=\"$(go tool -n protoc-gen-go)\" --plugin=protoc-gen-go-grpc=\"$(go tool -n protoc-gen-go-grpc)\" --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative stream.proto"

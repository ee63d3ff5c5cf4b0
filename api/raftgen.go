package api

// Regenerate raft_transport.pb.go and raft_transport_grpc.pb.go from
// raft_transport.proto, with the same tools as generate.go.
//go:generate sh -c "protoc --plugin=protoc-gen-go=\"$(go tool -n protoc-gen-go)\" --plugin=protoc-gen-go-grpc=\"$(go tool -n protoc-gen-go-grpc)\" --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative raft_transport.proto"

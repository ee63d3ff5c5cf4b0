// Package streamtest runs stream-layer clusters inside a test: extent nodes
// serving real gRPC on 127.0.0.1 (free ports), each on its own
// fault-injecting vfs.MemFS, and a stream.Driver over an in-memory
// stream.Manager. It also holds the seed and wait helpers of the stream
// tests.
//
//	c := streamtest.Start(t, 5, streamtest.Options{})
//	defer c.Close()
//	cl := stream.NewClient(c.Driver, stream.ClientOptions{})
//
// A Cluster is safe for concurrent use by the test's goroutines.
package streamtest

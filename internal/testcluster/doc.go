// Package testcluster runs a whole Tabula cluster inside one process: a Table
// Master and N table servers, each on its own 127.0.0.1 port with real gRPC
// and its own data directory. Tests start it; `tabula dev` runs it too.
//
// A Cluster is safe for concurrent use. Close stops every part and, when the
// cluster made its own temporary directory, removes it.
//
//	c, err := testcluster.Start(ctx, testcluster.Options{Servers: 3})
//	defer c.Close()
//	cl, err := client.New(ctx, client.Options{Masters: []string{c.MasterAddr()}})
package testcluster

// Package metrics is Tabula's Prometheus instrumentation: one Registry per
// process (its own prometheus.Registry, never the global default), the HTTP
// handler that serves it on /metrics, and gRPC server interceptors that
// count every RPC.
//
// # What the interceptors record
//
// Registry.UnaryServerInterceptor and Registry.StreamServerInterceptor
// record, per tenant, table and operation:
//
//	tabula_rpc_requests_total{tenant,table,op}          every RPC answered
//	tabula_rpc_errors_total{tenant,table,op,code,error}  those that failed
//	    (not a stream the client ended: a watch it was done with):
//	    code is the gRPC code ("Unavailable"), error Tabula's ErrorCode
//	    without its prefix ("SERVER_BUSY"; empty when the status has none)
//	tabula_rpc_latency_seconds{tenant,table,op}          a histogram, 100 µs to 30 s
//
// op is the method without its package: "TableServer/Put",
// "Master/CreateTable", "ExtentNode/Append". tenant and table are read from
// the request with protoreflect, generically: a string field "tenant" and
// "table" at the top level of the request, or in its "header" sub-message
// (api.RequestHeader); a request with a tenant and no table field names its
// table in "name" (CreateTable, DropTable, DescribeTable). A streaming RPC
// is labelled by its first request message and timed from its start to its
// end, except two streams of many requests: TableServer/Calls, whose calls
// are recorded as the unary calls they stand for, and
// ExtentNode/ReplicateStream, whose batches are recorded as
// "ExtentNode/ReplicateBatch", each timed from its arrival to its answer.
// RPCs without a tenant (heartbeats, extent replication) have empty
// tenant and table labels.
//
// # Bounded cardinality
//
// Labels come from requests, so a client could otherwise mint series at
// will. Three bounds hold:
//
//   - At most Options.MaxTablePairs (default 1,000) distinct (tenant, table)
//     pairs get their own series per process, first come first served, for
//     the life of the process. Requests of any further pair are labelled
//     tenant "_other", table "_other" and counted in
//     tabula_rpc_label_overflow_total; tabula_rpc_label_pairs says how many
//     pairs are tracked. Real names start with a letter, so "_other" is
//     never a real tenant or table.
//   - A name that is not a valid tenant or table name (api.ValidateName: 1
//     to 63 letters, digits, '-' and '_') is labelled "_invalid": nothing
//     unvalidated becomes a label.
//   - op comes from the registered methods (gRPC calls no interceptor for
//     an unknown one), code and error from fixed enumerations.
//
// At 1,000 pairs and ~10 operations a pair actually uses, the latency
// histograms are at most ~200,000 series per process; lower the cap with
// Options.MaxTablePairs where that is too many.
//
// # Component figures
//
// Engines, the extent node, replication, coprocessors and the master keep
// their own counters (atomics on their paths, read by their Stats methods).
// Their packages export collectors that read those at scrape time
// (tableserver/metrics.go, tablemaster/metrics.go), so a figure costs
// nothing until it is scraped. Their names follow tabula_<area>_<what>_<unit>:
// tabula_engine_live_bytes, tabula_stream_journal_commits_total,
// tabula_replication_lag_records, tabula_coproc_calls_total,
// tabula_master_servers. NewCollector and Family help write such collectors.
//
// # Concurrency
//
// A Registry and its interceptors are safe for concurrent use. A Server
// owns its HTTP goroutine; Close stops it.
//
// # Example
//
//	reg := metrics.New(metrics.Options{})
//	srv := grpc.NewServer(
//		grpc.ChainUnaryInterceptor(reg.UnaryServerInterceptor()),
//		grpc.ChainStreamInterceptor(reg.StreamServerInterceptor()),
//	)
//	hs, err := reg.Listen("127.0.0.1:9100") // serves /metrics
//	defer hs.Close()
package metrics

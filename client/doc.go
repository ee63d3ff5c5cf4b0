// Package client is the Go SDK of Tabula: catalog calls to the Table Master
// and key-value calls routed straight to the table server that owns each key.
//
//	// The profile `tabula tenant create acme --save-profile` saved: the
//	// tenant's key and the master's address.
//	p, err := client.LoadProfile(client.DefaultConfigPath(), "acme")
//	if err != nil { ... }
//	c, err := client.New(ctx, client.Options{Masters: p.Masters, Credential: p.Credential})
//	if err != nil { ... }
//	defer c.Close()
//	_, err = c.CreateTable(ctx, "users", client.PointTable, &api.TableOptions{Partitions: 12})
//	if err != nil && !errors.Is(err, client.ErrAlreadyExists) { ... }
//	users := c.Table("users")
//	err = users.Put(ctx, []byte("ada"), []byte("lovelace"), client.WithTTL(time.Hour))
//	v, err := users.Get(ctx, []byte("ada"))  // client.ErrKeyNotFound when absent
//	r, err := users.CompareAndSwap(ctx, client.CAS{Key: []byte("ada"), Expected: v, Value: []byte("byron")})
//
// (ExampleLoadProfile runs this against a cluster.) The module is not on
// the Go module proxy yet: another module requires it with a replace
// directive to a clone of the repository (`go mod edit -require
// github.com/tabuladb/tabula@v0.0.0 -replace
// github.com/tabuladb/tabula=../tabula`, then `go mod tidy`).
//
// # Credentials
//
// Every call is signed with Options.Credential (HMAC-SHA256); a cluster
// refuses unsigned calls with UNAUTHENTICATED. A tenant's credential comes
// from a profile (LoadProfile: the file the CLI keeps, DefaultConfigPath),
// a credential file (ReadCredentialFile) or its key
// (TenantCredential(tenant, 1, key)); the cluster credential, the
// operator's, from the file the master or `tabula dev` wrote
// (ReadCredentialFile("tabula-data/cluster.key")).
//
// # Routing
//
// A key lives in the partition whose inclusive hash range holds
// keyspace.Hash(key) (xxhash64). The client caches each table's partition map
// (fetched from a master on first use, then kept fresh by a WatchPartitionMap
// stream per table) and sends every request to the partition's primary with
// the partition id and epoch it routed by. One gRPC connection per server
// address is kept for the life of the Client.
//
// # Replicas and LSNs
//
// A partition has a primary and secondaries (3 copies by default) that
// apply one commit log. Every write's reply carries its LSN, its position in
// the partition's log: ReportLSN(&n) stores it (CASResult.LSN too). Reads go
// to the primary and are linearizable. ReadAny() lets any replica answer
// (eventual; ReportLSN gives the LSN the answer reflects); MinLSN(n) asks
// for a replica that has applied at least LSN n of the partition, and a
// Session does that per partition for every write and read made through
// it (read-your-writes and monotonic reads from any replica). A replica
// behind answers behind_min_lsn and the SDK tries another, then the primary.
// ReadAny's staleness is bounded: a secondary not in step with its
// primary's commit point within 1 s (MaxStaleness(d) sets the bound), for
// one because the log dropped it from its ack set, answers replica_behind
// and the SDK tries another replica, then the primary.
//
// # Retries
//
// Each call retries until it succeeds, fails for good, or reaches the earlier
// of ctx's deadline and Options.RetryTimeout (default 15s):
//
//	NOT_OWNER, STALE_EPOCH  the map is stale: patch it from the error's
//	                        partition entry (or fetch it), retry at once,
//	                        then with backoff
//	UNAVAILABLE             back off, fetch the map (the server may be dead
//	                        and its partitions moved), retry; also a partition
//	                        with no primary, until the master places one
//	SERVER_BUSY             back off at least the server's retry_after_ms
//	VERSION_GONE            bulk tables: refresh the map and retry on the
//	                        serving version (a BatchGet retries whole, so it
//	                        never mixes versions; AtVersion handles return it)
//	anything else           returned at once (INVALID_ARGUMENT, NOT_FOUND,
//	                        WRONG_KIND, UNIMPLEMENTED, ...)
//
// Backoff is exponential with full jitter, from 5 ms up to 250 ms (master
// calls: 1 s), drawn from a per-client source seeded by Options.Seed. A
// call waiting to retry wakes as soon as the map watch delivers a new map
// (a failover) and retries by it, and an attempt in flight to a partition
// whose entry changes (new epoch or replicas) is cut short and retried at
// once, so a call to a paused or cut-off primary follows the failover
// instead of waiting for its deadline. Master calls move on to the next
// master address when one is unavailable. A call that gives up returns its
// last error wrapped with what it was doing; api.CodeOf and api.DetailOf read
// the server's ErrorDetail through the wrapping, and errors.Is(err,
// context.DeadlineExceeded) tells a timeout. Input is checked before anything
// is sent (api.ValidateKey, the table's value limit, TTLs), with the same
// INVALID_ARGUMENT error the server would give.
//
// # Writes and request ids
//
// Every write (Put, Delete, CompareAndSwap, each partition's request of a
// BatchWrite, Invoke through its idempotency token) carries a random 128-bit
// request id made once per call; every retry of the call reuses it, and the
// SDK never retries a write without one. The server keeps each write's
// outcome under its id for 10 minutes, replicated with the write: a retry
// after a lost reply is not applied again and returns the first outcome
// (a CompareAndSwap that swapped reports Swapped=true, a Delete the
// original existed), also across a primary failover. So a write that
// returns without error was applied exactly once.
//
// A write the SDK gives up on after an attempt that may have applied (a
// deadline or broken connection after the request was sent, or a server's
// UNAVAILABLE outcome_unknown) returns an *OutcomeUnknownError:
// errors.Is(err, ErrOutcomeUnknown). Its outcome is unknown: sending the
// same write again with WithRequestID(err.RequestID) within 10 minutes
// applies it at most once and returns its outcome. Any other error of a
// write means it was not applied (for a BatchWrite: not in the partitions
// whose requests failed). Ids older than 10 minutes are forgotten, so a
// retry after that may apply again.
//
// # Batches and scans
//
// BatchGet and BatchWrite split their keys by partition and send one request
// per partition, in parallel, each retried on its own. A BatchWrite is atomic
// per partition, not across partitions. Its mutations may carry conditions
// (Mutation.Cond: the key absent, present, or its value starting with given
// bytes), checked atomically with the write against the partition's state:
// a compare-and-set over several keys of one partition, all or nothing; a
// failed one is a *ConditionFailedError. Scan streams each partition in turn;
// a partition's scan is retried only before its first record, so a record is
// never delivered twice.
//
// # Concurrency
//
// A Client and its Table handles are safe for concurrent use; share one
// Client per process and cluster. The Client owns one background goroutine
// per table in use (the map watch); Close stops them, cuts in-flight calls
// short with ErrClosed and closes every connection. Close is idempotent.
package client

// Package queue is the Azure Queue REST service over a Tabula cluster: a
// stateless HTTP server (Server) speaking the Queue service's wire
// protocol (path-style addressing /account/queue/messages, XML bodies,
// Shared Key, Shared Key Lite and SAS in their queue forms), so the
// Azure SDKs' queue clients work against Tabula unchanged. `tabula dev`
// serves it on 127.0.0.1:10001 (Azurite's port) with the development
// account; `tabula gateway --queue-listen` for a cluster.
//
// Operations: list, create and delete queues; queue metadata and stored
// access policies; service properties (kept and returned, not applied);
// Put Message (visibility timeout, time to live), Get Messages (up to
// 32, visibility timeout, dequeue count, pop receipts), Peek Messages,
// Delete Message, Update Message and Clear Messages.
//
// Delivery is at least once and survives a table server's failover: Put
// Message answers only after the message's record is committed on its
// partition's replicas; Get Messages hides a message by rewriting its
// record with a compare-and-swap (a new pop receipt, a later visibility
// time), so two consumers never both receive a message within one
// visibility window, and a message whose consumer neither deleted nor
// updated it before its visibility timeout is delivered again. The
// storage layout is drawn in record.go.
//
// Not served: CORS (preflights answer 403 CorsPreflightFailure), OAuth
// bearer tokens, geo-replication (Get Service Stats answers a fixed
// "live" on the secondary).
package queue

// Package batch reads and writes the Azure Table service's entity group
// transactions on the wire: the multipart/mixed body of a POST to $batch
// and the multipart/mixed answer to it.
//
// A request body is one batch holding either one changeset of up to 100
// insert, update, merge, delete and upsert operations, or one query (a
// GET) on its own, outside any changeset:
//
//	--batch_B                                  (CRLF; LF alone is accepted)
//	Content-Type: multipart/mixed; boundary=changeset_C
//
//	--changeset_C
//	Content-Type: application/http
//	Content-Transfer-Encoding: binary
//
//	POST http://127.0.0.1:10002/devstoreaccount1/mytable HTTP/1.1
//	Content-Type: application/json
//	Prefer: return-no-content
//
//	{"PartitionKey":"p","RowKey":"r1"}
//	--changeset_C--
//	--batch_B--
//
// A body-less operation (GET, DELETE) whose headers run into the next
// boundary without a blank line, as legacy clients send it, is taken as
// the service takes it.
//
// Parse turns such a body into a Batch of Ops in order, enforcing the
// service's limits (MaxOperations, MaxBodySize, one changeset, a query
// alone). It does not interpret the operations: routing by path (the
// host of a sub-request's absolute URI is ignored, as the service and
// Azurite do), X-HTTP-Method tunnelling, the single-PartitionKey rule
// and duplicate rows are the gateway's, which sees the decoded keys.
//
// WriteResponse writes the answer to a transaction that committed (one
// changeset response with a part per operation, or the query's single
// part); WriteFailure writes the answer to one that did not (a single
// part carrying the failing operation's status and an error whose
// message starts with the operation's 0-based index). The HTTP status of
// the batch itself is 202 Accepted in both cases; that and the
// Content-Type (ContentType) are the gateway's to send.
//
// Everything here is a pure function over caller-owned buffers and safe
// for concurrent use.
package batch

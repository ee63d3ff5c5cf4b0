// Package frontend is the Azure Table REST gateway: a stateless HTTP
// server (Gateway) over the Tabula SDK that speaks the Azure Table
// service's wire protocol (path-style addressing, JSON payloads, OData
// queries, entity group transactions, Shared Key and SAS
// authentication), so the Azure SDKs and tools work against a Tabula
// cluster unchanged. Accounts are tenants, an account's tables are its
// ordered tables, and an entity is one record keyed by (PartitionKey,
// RowKey) in an order-preserving encoding. `tabula dev` serves it on
// 127.0.0.1:10002 with the development account; `tabula gateway` serves
// it for a cluster.
//
// Its parts live in subpackages, one noun each:
//   - edm: the Entity Data Model's property types and values.
//   - entity: entities on the wire (JSON at each metadata level) and on
//     disk (a checksummed binary encoding, order-preserving keys), ETags,
//     and the service's limits and error codes.
//   - odata: $filter (parse, match, the key range it confines a query
//     to), $select and $top.
//   - batch: entity group transactions ($batch multipart bodies in,
//     responses out).
//   - sharedkey: Shared Key, Shared Key Lite and SAS authentication.
//
// An x-ms-version the service does not know (versions) is refused with
// 400 InvalidHeaderValue; a known one is echoed. Batch answers to
// inserts and upserts carry the entity's URL in Location and
// DataServiceId (entity.Address), as the service's do.
//
// Get Service Properties answers what the gateway does (nothing enabled)
// and Get Table ACL an empty list; setting them, service statistics and
// CORS answer NotImplemented.
package frontend

// Package frontend is the Azure Table REST gateway: a stateless HTTP
// server over the Tabula SDK that speaks the Azure Table service's wire
// protocol (path-style addressing, JSON payloads, OData queries, entity
// group transactions, Shared Key and SAS authentication), so the Azure
// SDKs and tools work against a Tabula cluster unchanged.
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
// The HTTP gateway over the SDK that puts them together is not built
// yet: it needs ordered tables (range partitions over engines/ordered).
package frontend

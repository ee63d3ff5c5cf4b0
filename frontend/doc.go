// Package frontend is the Azure Table REST gateway: a stateless HTTP
// server over the Tabula SDK that speaks the Azure Table service's wire
// protocol (path-style addressing, JSON payloads, OData queries, entity
// group transactions, Shared Key and SAS authentication), so the Azure
// SDKs and tools work against a Tabula cluster unchanged.
//
// Its parts live in subpackages, one noun each:
//   - edm: the Entity Data Model's property types and values.
//
// The gateway itself is not built yet: the subpackages are its parts.
package frontend

// Package edm is the Azure Table service's Entity Data Model: the eight
// property types an entity's values have (Edm.String, Edm.Int32,
// Edm.Int64, Edm.Double, Edm.Boolean, Edm.DateTime, Edm.Guid,
// Edm.Binary) and typed values of them, compared as the service's
// queries compare them. It is the vocabulary the gateway's other parts
// (payload codecs, the $filter evaluator, storage encoding) share.
//
// Values are immutable and safe for concurrent use.
package edm

// Package entity turns Azure Table entities (edm.Entity) into bytes and
// back: the service's JSON on the wire, a compact checksummed encoding
// on disk, and an order-preserving engine key. It also holds the
// service's limits and validation rules, and the error codes they fail
// with (*Error, one sentinel per code; errors.Is matches by code).
//
// All functions are pure and safe for concurrent use; none keeps a
// reference to its arguments.
//
// # Example
//
//	e, err := entity.DecodeJSON(body) // Insert Entity
//	if err == nil {
//		err = entity.Validate(e)
//	}
//	var ee *entity.Error
//	if errors.As(err, &ee) {
//		// answer ee.Status with ee.Code and ee.Message
//	}
//	e.Timestamp = now
//	val := entity.AppendBinary(nil, e)
//	key := entity.Key(e.PartitionKey, e.RowKey)
//	// later
//	e, err = entity.DecodeBinary(pk, rk, val)
//	out := entity.AppendJSON(nil, e, entity.JSONOptions{Metadata: m,
//		BaseURL: "http://127.0.0.1:10002/devstoreaccount1", Account: "devstoreaccount1", Table: "t"})
//
// # JSON in (DecodeJSON)
//
// The body is one JSON object, read in one pass over the bytes (no
// reflection; it accepts and refuses what encoding/json's token stream
// did, which a differential fuzz target holds it to) so property order
// is kept and duplicates are seen. Rules, as the service applies them
// (checked against the Python SDK's recorded live tests and the Go,
// .NET and JS SDKs' encoders):
//
//   - "Name@odata.type": "Edm.X" types the property Name; it may come
//     before or after it. Without an annotation a JSON string is
//     Edm.String, true/false Edm.Boolean, an integer in int32 range
//     Edm.Int32 and any other number Edm.Double. An integer outside
//     int32 range without annotation is stored as Edm.Double, as the
//     service's OData reader (ODataLib: Int32 if it fits, else Double)
//     does; clients send Int64 as an annotated string.
//   - Annotated values: Edm.Int64 as a decimal string (a JSON number is
//     also taken); Edm.DateTime as ISO 8601 with 0 to 7 fractional
//     digits and "Z", an offset or nothing (UTC); Edm.Guid in its
//     36-character form; Edm.Binary as padded standard base64; Edm.Double
//     as a number or the strings "NaN", "Infinity", "-Infinity" (also
//     "INF", "-INF", the OData v4 spelling) or a numeric string;
//     Edm.Int32 and Edm.Boolean also as strings ("12345", "False"), which
//     the service accepts (Python SDK recordings).
//   - null values are dropped: the service does not store nulls, a null
//     property is an absent one.
//   - Keys beginning "odata." (odata.metadata, odata.etag, ...), other
//     "@odata." annotations and Timestamp (set by the server) are
//     ignored. PartitionKey and RowKey must be JSON strings (an
//     "Edm.String" annotation is allowed).
//   - Errors: a name twice (property or annotation) is
//     DuplicatePropertiesSpecified; malformed JSON, a key that is not a
//     string, an annotation of a property the body lacks, an unknown
//     type name, and a value that does not parse as its type (an Int64
//     past 2^63 - the service answers InvalidInput there) are
//     InvalidInput; a JSON kind that cannot hold the annotated type (a
//     bool for Edm.Guid) and an object or array as a value are
//     InvalidValueType [unverified: the service may say InvalidInput];
//     a DateTime this gateway cannot store is OutOfRangeInput (below).
//
// # JSON out (AppendJSON, AppendFeed)
//
// Levels, from the service's documented and recorded responses:
//
//   - nometadata: PartitionKey, RowKey, Timestamp and the properties,
//     bare; Int64 as a string, Binary base64.
//   - minimalmetadata: odata.metadata (single entity:
//     "{base}/$metadata#{table}/@Element"; a feed has
//     "{base}/$metadata#{table}" once, at the top), odata.etag, and an
//     annotation before each Int64, DateTime, Guid and Binary value;
//     Timestamp is not annotated.
//   - fullmetadata: also odata.type ("{account}.{table}"), odata.id
//     ("{base}/{table}(PartitionKey='..',RowKey='..')"), odata.editLink
//     (the same without the base) and Timestamp@odata.type. Int32,
//     Double, Boolean and String stay unannotated, as in the service's
//     documented samples.
//
// Doubles: an integral value is written "3.0", as ODataLib writes
// doubles, so readers that tell integers from decimals (aztables Go
// v1.4.1 tries int32 first, the .NET and JS SDKs likewise) read a
// Double back without an annotation; NaN and the infinities are the
// strings "NaN", "Infinity", "-Infinity" with an Edm.Double annotation.
// Note aztables Go itself sends a float64 3.0 as "3", which the service
// (and DecodeJSON) store as Int32. DateTime and Timestamp always have
// seven fractional digits: "2024-05-06T07:08:09.1234567Z".
//
// $select (JSONOptions.Select) writes only the named properties, system
// ones included only when named; odata.etag stays; a named property
// the entity lacks is written as null, as the service does (Azurite
// does not: Azurite issue 2535).
//
// # ETag
//
// W/"datetime'2026-11-21T19%3A22%3A43.1171918Z'": the Timestamp with
// seven digits, colons percent-encoded. ParseETag inverts it (w/ and
// plain colons too); another weak ETag, W/"…", matches no entity
// (UpdateConditionNotSatisfied, 412, as the service answers); a strong
// or malformed one is InvalidInput. Address is an entity's URL, as
// odata.id and a batch answer's Location spell it.
//
// # Limits (Validate)
//
//   - At most 252 custom properties (TooManyProperties).
//   - Entity size at most 1 MiB, counted as Size documents: 4 bytes +
//     2 × UTF-16 length of each key + per property 8 + 2 × UTF-16 length
//     of the name + the value (String 2 per UTF-16 unit + 4, Binary
//     length + 4, Int32 4, Int64/Double/DateTime 8, Guid 16, Boolean 1)
//     (EntityTooLarge).
//   - Property names: C# identifiers of at most 255 UTF-16 units, not
//     PartitionKey, RowKey or Timestamp (PropertyNameInvalid,
//     PropertyNameTooLong).
//   - Edm.String at most 32,768 UTF-16 code units (64 KiB), Edm.Binary
//     at most 65,536 bytes (PropertyValueTooLarge). Azurite passes 32,768
//     characters and refuses 32,769.
//   - Keys: at most 512 UTF-16 code units, the "1 KiB" of the
//     documentation counted in UTF-16 (Azurite: 512 characters pass, 513
//     fail with InvalidInput); no / \ # ? or control characters
//     U+0000-U+001F, U+007F-U+009F (InvalidInput). The .NET SDK's code
//     list also has KeyValueTooLarge, which the service may use for long
//     keys [unverified].
//   - Table names (ValidateTableName): ^[A-Za-z][A-Za-z0-9]{2,62}$ and not
//     "tables" in any case. All failures are InvalidResourceName, 400
//     [unverified: the documentation's "404 (Bad Request)" for reserved
//     names is contradictory; Azurite answers 400].
//
// DateTime range: 1601-01-01 to 9999-12-31, as the service takes
// (DateTime.MaxValue sentinels of .NET programs included); a DateTime
// outside it is refused with OutOfRangeInput.
//
// Error messages: the texts for DuplicatePropertiesSpecified,
// EntityTooLarge, InvalidValueType, JsonFormatNotSupported,
// PropertiesNeedValue and InvalidInput are the service's published
// ones; the others follow the published meaning [unverified wording].
//
// # Storage encoding (AppendBinary, DecodeBinary)
//
// The value stored under Key(pk, rk); integers little-endian:
//
//	| version (1) = 1 | timestamp (8) | count (uvarint) | property × count | crc32c (4) |
//	property: | name length (uvarint) | name | edm.Type (1) | value |
//	value:    String, Binary: | length (uvarint) | bytes |
//	          Int32 (4), Int64 (8), Double (8, IEEE 754 bits),
//	          Boolean (1: 0 or 1), DateTime (8), Guid (16 bytes)
//
// timestamp and DateTime are signed 100 ns ticks since the Unix epoch;
// the type byte is edm.Type's stored number; crc32c (Castagnoli) covers
// every byte before it. The keys are not stored: the engine key holds
// them. Never change the layout of version 1; a new layout takes a new
// version and this package keeps reading the old one.
//
// # Engine key (Key, SplitKey)
//
//	| PartitionKey with 0x00 written 0x00 0xFF | 0x00 0x01 | RowKey |
//
// Bytewise order of keys is (PartitionKey, RowKey) order, each compared
// by UTF-8 bytes, the order edm.Compare uses. (The service compares
// UTF-16 code units, which differs from UTF-8 order only between
// characters above U+FFFF and those in U+E000-U+FFFF.)
package entity

// Package odata is the Azure Table gateway's query language: the $filter
// expressions the Table service accepts (ParseFilter), their evaluation
// against an entity (Filter.Match), the key range a filter confines a
// query to (Filter.KeyRange), and the $select and $top options
// (ParseSelect, ParseTop).
//
// Everything here is pure and deterministic. A *Filter is immutable and
// safe for concurrent use; Range is a value.
//
//	f, err := odata.ParseFilter("PartitionKey eq 'p' and RowKey ge 'a' and RowKey lt 'b' and Age gt 30")
//	if err != nil { ... } // errors.Is(err, odata.ErrInvalidFilter): 400 InvalidInput
//	r := f.KeyRange()      // PK in ["p","p"] RK in ["a","b"): scan only that
//	... for each entity e the scan of r returns: if f.Match(e) { send it }
//
// # Grammar
//
// In EBNF, over the URL-decoded text; blanks (space, tab, CR, LF) may
// separate tokens and are needed only between words and numbers (Age eq
// 5and is an error, (A eq 1)and(B eq 2) is not):
//
//	filter     = [ or ] .                              (empty: every entity)
//	or         = and { "or" and } .
//	and        = comparison { "and" comparison } .
//	comparison = unary [ cmpop unary ] .
//	unary      = "not" unary | primary .
//	primary    = "(" or ")" | property | literal .
//	cmpop      = "eq" | "ne" | "gt" | "ge" | "lt" | "le" .
//	property   = ( letter | "_" ) { letter | digit | "_" } .   (at most 255 characters)
//	literal    = string | int32 | int64 | double | boolean | datetime | guid | binary .
//	string     = "'" { character | "''" } "'" .                Edm.String; '' is a quote
//	int32      = [ "-" ] digits .                             Edm.Int32
//	int64      = [ "-" ] digits ( "L" | "l" ) .               Edm.Int64
//	double     = [ "-" ] digits ( "." digits [ exp ] | exp ) [ "d" | "D" ]
//	           | [ "-" ] digits ( "d" | "D" ) | "INF" | "-INF" | "NaN" .   Edm.Double
//	exp        = ( "e" | "E" ) [ "+" | "-" ] digits .
//	boolean    = "true" | "false" .                           Edm.Boolean, any case
//	datetime   = "datetime'" yyyy "-" mm "-" dd "T" hh ":" mm [ ":" ss [ "." 1-7 digits ] ]
//	             [ "Z" | ( "+" | "-" ) hh ":" mm ] "'" .      Edm.DateTime
//	guid       = "guid'" 8hex "-" 4hex "-" 4hex "-" 4hex "-" 12hex "'" .   Edm.Guid, any case
//	binary     = ( "X" | "binary" ) "'" { hex hex } "'" .     Edm.Binary
//
// Precedence is OData's, tightest first: not, comparisons, and, or; and
// and or associate to the left. Beyond the grammar:
//   - A comparison has a property on one side and a literal on the other,
//     either way round: 5 lt Age is Age gt 5. Two properties, two
//     literals, or a parenthesised or 'not' expression as a side are
//     errors; so is not Age eq 5, which OData reads as (not Age) eq 5
//     (write not (Age eq 5)). Comparisons do not chain.
//   - A condition (an operand of and, or, not, a parenthesised
//     expression, or the whole filter) is a comparison, a bare property,
//     true or false. A bare property P means P eq true and counts as a
//     comparison; so not IsActive matches entities whose IsActive is
//     false. OData allows it; the Azure SDK for .NET stopped emitting it
//     after Azurite refused it, and whether the service accepts it is
//     unverified: accepting is the side that breaks no client. The
//     constants true and false stand as conditions because LINQ predicate
//     builders send filters like (true and RowKey eq 'x') or false.
//   - At most MaxComparisons (15) comparisons, the service's limit, and
//     nesting at most 100 deep (ours).
//   - Everything is case-sensitive: keywords, property names, the
//     prefixes datetime, guid, X and binary. Only the Boolean literals
//     (True, FALSE: the service reads them, so no property can be called
//     True in a filter) and the number suffixes L and d come in any case,
//     as in OData v3.
//   - A bare integer is an Edm.Int32; outside the Int32 range it is an
//     error that says to write L, as OData v3 parsers refuse it rather
//     than widen it (OData v4 would widen: the service speaks v3).
//   - Doubles: a '.' or an exponent or the d suffix makes a Double (2.0,
//     -2.5E10, 1e-3, 5d), as OData v3 writes them; INF, -INF and NaN are
//     Double literals, so no property can be called INF or NaN in a
//     filter. Decimal (M) and Single (f) literals are refused: the
//     service has no such types.
//   - DateTimes keep up to seven fractional digits (100 ns); more is an
//     error. No zone, or Z, means UTC; an offset is converted to UTC.
//     The instant must lie in years 1 to 9999 (edm.MinTime, edm.MaxTime),
//     which holds the service's own range (from 1601-01-01).
//   - null, OData functions (startswith(...)), arithmetic and the other
//     typed literals (datetimeoffset'…', time'…') are refused with
//     messages that say so.
//
// # Semantics
//
// Match follows OData's three-valued logic. A comparison is null, not
// false, when the entity lacks the property, when the property's Edm
// type differs from the literal's (Int32 5 is not Int64 5L nor Double
// 5.0: the service requires the same type), or when either side is a
// Double NaN. false and null is false, true or null is true, not null is
// null, and an entity matches only when the filter is true. So X ne 1
// and not (X eq 1) match neither an entity without X nor one whose X is
// a string. Strings, binaries and GUIDs compare by bytes (ordinal), as
// keys sort; PartitionKey, RowKey (Edm.String) and Timestamp
// (Edm.DateTime) are properties like the others (edm.Entity.Get).
//
// KeyRange over-approximates: every entity Match accepts has keys in the
// range; the gateway scans the range and applies Match to what it reads.
//
// # Errors
//
// Every error is a *SyntaxError with the option, the byte offset and a
// message for the person who wrote the query ("$filter: expected a
// literal after 'eq', found the end of the filter at offset 12"), and
// wraps ErrInvalidFilter, ErrInvalidSelect or ErrInvalidTop.
//
// # $select and $top
//
// ParseSelect takes comma-separated property names (ValidName), blanks
// trimmed, duplicates dropped; "*" means every property (nil). ParseTop
// takes 1 to 1000, the page limit; above it is an error, as the service
// answers 400 Bad Request (Azurite accepts it).
package odata
